"""link(): several PTX modules -> one, resolving `.extern` functions and variables.

This is what `cuLinkCreate/AddData/Complete` and `-rdc=true` programs need. Definitions
with `.visible` or `.weak` linkage are shared by name; a `.weak` one yields to a
`.visible` one. Names a module keeps private (no linkage: nvcc's `$str`, `__unnamed_1`,
internal functions) may repeat across modules, so they are renamed apart when they clash.
"""

from __future__ import annotations

from .errors import PtxError
from .ir import Address, Function, ListOperand, Module, Symbol, Variable, Vector
from .module import PtxModule
from .native import source_hash
from .parser import parse_module

__all__ = ["link"]


# What only CUDA's device runtime (libcudadevrt) calls: the GPU's system calls, which the
# emulator has no use for, since it provides the device runtime itself (device_runtime.py).
_DEVICE_RUNTIME_MARK = "__cuda_syscall_"


def link(texts: list[str]) -> PtxModule:
    """One module of `texts`; the PTX of CUDA's device runtime, which nvcc's device link of
    an -rdc program with -lcudadevrt brings along, is left out."""
    texts = [text for text in texts if _DEVICE_RUNTIME_MARK not in text] or texts[:1]
    if not texts:
        raise PtxError("nothing to link")
    modules = [parse_module(text) for text in texts]
    merged = Module(version=max(m.version for m in modules), target=modules[0].target)
    for index, module in enumerate(modules):
        _rename_private(module, merged, index)
        for fn in module.functions.values():
            _add_function(merged, fn)
        for var in module.variables.values():
            _add_variable(merged, var)
    linked = PtxModule(merged)
    linked.source_hash = source_hash("link", *texts)
    return linked


def _is_shared_name(linkage: str) -> bool:
    return linkage in ("visible", "extern", "weak", "common")


def _rename_private(module: Module, merged: Module, index: int) -> None:
    """Give clashing module-private names a per-module suffix, in definitions and uses."""
    renames: dict[str, str] = {}
    for name, var in module.variables.items():
        if not _is_shared_name(var.linkage) and (name in merged.variables
                                                 or name in merged.functions):
            renames[name] = f"{name}$m{index}"
    for name, fn in module.functions.items():
        if not _is_shared_name(fn.linkage) and fn.body is not None and (
                name in merged.functions or name in merged.variables):
            renames[name] = f"{name}$m{index}"
    if not renames:
        return
    for name, new in renames.items():
        if name in module.variables:
            var = module.variables.pop(name)
            var.name = new
            module.variables[new] = var
        if name in module.functions:
            fn = module.functions.pop(name)
            fn.name = new
            module.functions[new] = fn
    for var in module.variables.values():
        var.relocations = [(o, renames.get(n, n), a, g) for o, n, a, g in var.relocations]
    for fn in module.functions.values():
        # What layouts and the compiler look names up by must name them as the code does.
        fn.callees = {renames.get(n, n) for n in fn.callees}
        fn.symbols = {renames.get(n, n) for n in fn.symbols}
        for instr in fn.body or ():
            for operand in instr.operands:
                _rename_operand(operand, renames)


def _rename_operand(operand, renames: dict[str, str]) -> None:
    if isinstance(operand, Symbol) and operand.variable is None:
        operand.name = renames.get(operand.name, operand.name)
    elif isinstance(operand, Address):
        _rename_operand(operand.base, renames)
    elif isinstance(operand, (Vector, ListOperand)):
        for element in operand.elements:
            _rename_operand(element, renames)


def _add_function(merged: Module, fn: Function) -> None:
    old = merged.functions.get(fn.name)
    if old is None or (old.body is None and fn.body is not None):
        merged.functions[fn.name] = fn
        return
    if fn.body is None:
        return
    if old.linkage == "weak":
        merged.functions[fn.name] = fn
    elif fn.linkage != "weak":
        raise PtxError(f"function {fn.name!r} is defined in more than one module", fn.line)


def _add_variable(merged: Module, var: Variable) -> None:
    old = merged.variables.get(var.name)
    if old is None or old.linkage == "extern":
        merged.variables[var.name] = var
        return
    if var.linkage == "extern":
        return
    if old.linkage in ("weak", "common") and var.linkage not in ("weak", "common"):
        merged.variables[var.name] = var
    elif var.linkage not in ("weak", "common"):
        raise PtxError(f"variable {var.name!r} is defined in more than one module", var.line)
