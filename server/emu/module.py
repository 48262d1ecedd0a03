"""PtxModule: a loaded PTX module, with what the driver API reports about its kernels and
variables. Loading parses and compiles every function, so a malformed module fails here,
unless it is big (CuPy's CUB modules: tens of MB, thousands of kernels, of which a program
runs a few): then a kernel's functions are parsed and compiled at its first launch, and
their errors fail that launch."""

from __future__ import annotations

from dataclasses import dataclass, field

from .address_space import function_addresses
from .errors import PtxError
from .ir import Module
from .native import source_hash
from .parser import parse_module
from .program import KernelProgram, Program

__all__ = ["KernelInfo", "ModuleVariable", "ParamInfo", "PtxModule"]

# Local memory a thread may use (its .local variables and call frames): CUDA's 512 KiB.
MAX_LOCAL_BYTES_PER_THREAD = 512 << 10
# Modules of more PTX than this are parsed and compiled one kernel at a time, when it is
# first launched: about 0.3 s of loading on one core when done at once.
LAZY_MODULE_BYTES = 1 << 20

@dataclass(frozen=True)
class ParamInfo:
    name: str
    offset: int
    size: int
    align: int


@dataclass
class KernelInfo:
    name: str
    params: list[ParamInfo]
    param_size: int
    attributes: dict[str, int]


@dataclass
class ModuleVariable:
    """A module-scope .global or .const variable; the backend maps it and writes `init`.

    `relocations` lists (offset, symbol, addend) for initializers holding the address of
    another variable (`.u64 p = generic(x)`); `initial_bytes(symbols)` applies them.
    """
    name: str
    space: str
    size: int
    align: int
    init: bytes
    relocations: list[tuple[int, str, int]] = field(default_factory=list)
    managed: bool = False  # a __managed__ variable: the host reaches it at its address too

    def initial_bytes(self, symbols: dict[str, int]) -> bytes:
        for _, name, _ in self.relocations:
            if name not in symbols:
                raise KeyError(f"{self.name} refers to {name!r}, which has no address")
        return _relocated(self.init, self.size, self.relocations, symbols)


class PtxModule:
    def __init__(self, module: Module):
        """`module` as parsed: its pending bodies (a lazy parse) are compiled when their
        kernels are launched, all others now."""
        _check_externals(module)
        self.ir = module
        self.version = module.version
        self.target = module.target
        self.program = Program(module)
        self.source_hash: str | None = None   # the PTX's, for the native code's disk cache
        self.native_kernels: dict = {}        # name -> native.NativeKernel or None
        if not any(fn.pending is not None for fn in module.functions.values()):
            self.program.compile_all()
        layouts = {name: self.program.layout(fn) for name, fn in module.functions.items()
                   if fn.is_entry and fn.defined}
        for name, kp in layouts.items():
            if kp.local_size > MAX_LOCAL_BYTES_PER_THREAD:  # ptxas refuses such a kernel
                raise PtxError(f"entry function {name!r} uses too much local data "
                               f"(0x{kp.local_size:x} bytes, "
                               f"0x{MAX_LOCAL_BYTES_PER_THREAD:x} max)")
        self.kernels: dict[str, KernelInfo] = {
            name: self._kernel_info(kp) for name, kp in layouts.items()}
        # kernel -> what it calls of the emulator's own functions (malloc, device launches)
        self.runtime_calls = {name: kp.builtins_called for name, kp in layouts.items()}
        functions = function_addresses(module.functions)
        self.variables: dict[str, ModuleVariable] = {
            v.name: ModuleVariable(v.name, v.space, v.size, v.align,
                                   _with_function_addresses(v, functions),
                                   [(o, n, a) for o, n, a, _ in v.relocations
                                    if n not in functions], v.managed)
            for v in module.variables.values() if v.space in ("global", "const")}

    @classmethod
    def parse(cls, text: str, lazy: bool | None = None) -> PtxModule:
        """`lazy`: leave function bodies to the first launch of their kernels (None: when
        the text is longer than LAZY_MODULE_BYTES)."""
        if lazy is None:
            lazy = len(text) > LAZY_MODULE_BYTES
        module = cls(parse_module(text, lazy))
        module.source_hash = source_hash(text)
        return module

    def uses(self, kernel: str, name: str) -> bool:
        """Does the kernel, or a function it calls, mention the module-scope name?"""
        functions = self.ir.functions
        return any(name in functions[f].symbols for f in self.program.reachable(kernel))

    def _register_estimate(self, kp: KernelProgram, max_threads: int) -> int:
        """What CU_FUNC_ATTRIBUTE_NUM_REGS answers: a deterministic stand-in for ptxas's
        allocation. Every declared register of the kernel and the functions it calls counts
        (64-bit ones twice, predicates not at all), capped as ptxas caps its allocation: by
        `.maxnreg`, and so that a block of the kernel's maximum size fits the register file
        (64 for 1024 threads), which keeps every launch the kernel allows possible and the
        occupancy calculator consistent with it."""
        slots = 0
        for name in kp.functions:
            for reg in self.ir.functions[name].registers:
                if reg.type.kind != "pred":
                    slots += 2 if reg.type.bits == 64 else 1
        warps = -(-max_threads // 32)
        limit = min(_MAX_REGISTERS_PER_THREAD, _REGISTERS_PER_BLOCK // (warps * 32) // 8 * 8)
        maxnreg = kp.function.directives.get("maxnreg")
        if maxnreg:
            limit = min(limit, maxnreg[0])
        return max(1, min(slots, limit))

    def _kernel_info(self, kp: KernelProgram) -> KernelInfo:
        fn = kp.function
        params = [ParamInfo(p.name, offset, p.size, p.align) for p, offset in kp.params]
        maxntid = fn.directives.get("maxntid") or fn.directives.get("reqntid")
        max_threads = 1024
        if maxntid:
            product = 1
            for value in maxntid:
                product *= value
            max_threads = min(max_threads, product)
        const_size = sum(v.size for v in self.ir.variables.values() if v.space == "const")
        attributes = {
            "num_regs": self._register_estimate(kp, max_threads),
            "shared_size_bytes": kp.static_shared,
            "const_size_bytes": const_size,
            "local_size_bytes": kp.local_variables_size,
            "max_threads_per_block": max_threads,
            "ptx_version": _target_architecture(self.target),
        }
        return KernelInfo(kp.name, params, kp.param_size, attributes)


# The register file: 64K 32-bit registers per block, at most 255 per thread, allocated to
# warps in units of 256.
_REGISTERS_PER_BLOCK = 65536
_MAX_REGISTERS_PER_THREAD = 255


def _with_function_addresses(var, functions: dict[str, int]) -> bytes:
    """`var`'s initializer with the functions its relocations name filled in (as it is, not
    padded to the variable's size, when it names none)."""
    relocations = [(o, n, a) for o, n, a, _ in var.relocations if n in functions]
    return _relocated(var.init, var.size, relocations, functions) if relocations else var.init


def _relocated(init: bytes, size: int, relocations, addresses: dict[str, int]) -> bytes:
    """`init` padded to `size` bytes, with the address of each (offset, name, addend)
    relocation whose name `addresses` holds written in (truncated to the space left)."""
    data = bytearray(init.ljust(size, b"\0"))
    for offset, name, addend in relocations:
        if name in addresses:
            width = min(8, size - offset)
            value = (addresses[name] + addend) & ((1 << (8 * width)) - 1)
            data[offset:offset + width] = value.to_bytes(width, "little")
    return bytes(data)


def _target_architecture(target: tuple[str, ...]) -> int:
    """What CUDA reports as a function's PTX version: the virtual architecture its PTX was
    written for (`.target sm_75` -> 75, `sm_90a` -> 90), not the PTX ISA version. CUB picks
    its tuning policies from it."""
    for name in target:
        digits = name[3:].rstrip("af") if name.startswith("sm_") else ""
        if digits.isdigit():
            return int(digits)
    raise PtxError(f"no .target sm_XX in the module (found {', '.join(target) or 'none'})")


def _check_externals(module: Module) -> None:
    for var in module.variables.values():
        if var.linkage == "extern" and var.space in ("global", "const"):
            raise PtxError(f"unresolved external variable {var.name!r}", var.line)
