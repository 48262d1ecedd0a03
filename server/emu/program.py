"""A parsed module compiled for execution: flat code, basic blocks and per-kernel layouts.

Every function's instructions are compiled (to closures, see `isa.py`) into one flat code
array, so a program counter names an instruction anywhere in the module. Basic blocks start
at function entries, labels, and after every control transfer; the scheduler always runs a
whole block for a group of lanes.

Each kernel gets its own layout of the memory its reachable functions use: static shared
variables (module-scope ones it references and the function-scope ones nvcc "demotes"),
followed by dynamic (`extern` unsized) shared memory, and per-thread local memory holding
the `.local` variables and the `.param` variables of device-function calls (call arguments,
formal parameters and return values). Each function's frame has one place per thread; a
recursive call saves the caller's frame and registers aside and the return puts them back
(see `executor.py`), so the layout stays flat. A kernel that calls through a register may
reach any function whose address the module takes, so all of those are in its layout.

An instruction the emulator does not implement (`UnsupportedPtx`) does not stop the module
from loading: it is recorded against its function, and a kernel that can reach that
function carries the error, which its launches report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import (  # noqa: F401  (importing registers the opcodes)
    ops_atomic,
    ops_builtin,
    ops_compare,
    ops_control,
    ops_convert,
    ops_data,
    ops_float,
    ops_integer,
    ops_ldmatrix,
    ops_logic,
    ops_mbarrier,
    ops_memory,
    ops_mma,
    ops_texture,
    ops_warp,
    ops_wmma,
)
from .address_space import function_addresses
from .errors import CUDA_ERROR_NOT_SUPPORTED, UnsupportedPtx
from .ir import Address, Function, ListOperand, Module, Symbol, Variable, Vector
from .isa import CompileContext, Compiled, find_compiler
from .operands import kernel_param_layout
from .state import Fault

__all__ = ["Block", "KernelProgram", "Program"]

_CONTROL = {"bra", "brx", "call", "icall", "ret", "exit", "bar"}


@dataclass(eq=False)
class Block:
    start: int
    ops: list = field(default_factory=list)     # run(state, lanes) closures
    lines: list = field(default_factory=list)   # PTX line of each op
    term: Compiled | None = None                # control transfer ending the block
    term_pc: int = -1
    next_pc: int = -1                           # fall-through successor


@dataclass(eq=False)
class KernelProgram:
    name: str
    function: Function
    entry_pc: int
    params: list[tuple[Variable, int]]
    param_size: int
    functions: list[str]                        # reachable, the kernel first
    shared_offsets: dict[int, int]              # id(Variable) -> offset
    static_shared: int
    dynamic_offset: int
    local_offsets: dict[int, int]
    local_size: int                             # bytes of local memory per thread
    local_variables_size: int                   # the .local part of it (the "stack")
    # function -> (its frame's bytes in a thread's local memory, its register ids): what a
    # recursive call saves aside
    frames: dict[str, tuple[np.ndarray, list[int]]]
    global_symbols: set[str]                    # module variables the kernel addresses
    builtins_called: set[str]                   # runtime functions (malloc, ...) it may call
    register_count: int                         # registers of its reachable functions
    unsupported: UnsupportedPtx | None = None   # the first its functions hold, if any


class Program:
    def __init__(self, module: Module):
        self.module = module
        self.code: list[Compiled] = []
        self.entries: dict[str, int] = {}
        self.ends: dict[str, int] = {}
        self.callees: dict[str, set[str]] = {}
        self.symbols_used: dict[str, set[str]] = {}
        self.register_dtypes: list[np.dtype] = []
        self.unsupported: dict[str, UnsupportedPtx] = {}   # function -> its first one
        self.indirect_callers: set[str] = set()   # functions that call through a register
        self.builtins_called: dict[str, set[str]] = {}  # function -> runtime functions it calls
        self.function_addresses = function_addresses(module.functions)
        # address -> function, for calls through a register and device-side launches
        self.function_at = {a: n for n, a in self.function_addresses.items()}
        self._number_registers()
        for fn in module.functions.values():
            if fn.body is not None:
                self._compile_function(fn)
        self.blocks = self._build_blocks()
        # what a call through a register may reach: the functions whose address is taken
        self.address_taken = _address_taken(module)
        self.kernels = {name: self._kernel(fn) for name, fn in module.functions.items()
                        if fn.is_entry and fn.body is not None}

    def _number_registers(self) -> None:
        for fn in self.module.functions.values():
            for reg in fn.registers:
                reg.id = len(self.register_dtypes)
                self.register_dtypes.append(reg.type.dtype)

    def _compile_function(self, fn: Function) -> None:
        entry = len(self.code)
        self.entries[fn.name] = entry
        callees: set[str] = set()
        builtins = self.builtins_called[fn.name] = set()
        for instr in fn.body:
            try:
                compile_fn = find_compiler(instr)
                if compile_fn is None:
                    raise UnsupportedPtx(f"unsupported instruction {instr.text!r}", instr.line)
                compiled = compile_fn(instr, CompileContext(self.module, fn, instr))
            except UnsupportedPtx as exc:
                self.unsupported.setdefault(fn.name, exc)
                compiled = Compiled("op", instr.line, instr.text, run=_unsupported(exc))
            if compiled.kind == "call":
                callees.add(compiled.callee)
            elif compiled.kind == "icall":
                self.indirect_callers.add(fn.name)
            elif instr.opcode == "call":  # vprintf, malloc, ...: compiled to an op
                builtins.update(_callee_names(instr))
            self.code.append(compiled)
        last = self.code[-1] if len(self.code) > entry else None
        if last is None or last.guard is not None or last.kind not in ("ret", "exit", "bra"):
            end_line = fn.body[-1].line if fn.body else fn.line
            self.code.append(Compiled("ret", end_line, "ret"))
        self.ends[fn.name] = len(self.code)
        for compiled in self.code[entry:]:
            if compiled.target is not None:
                compiled.target_pc = entry + fn.labels[compiled.target]
            if compiled.targets:
                compiled.target_pcs = [entry + fn.labels[t] for t in compiled.targets]
        self.callees[fn.name] = callees
        self.symbols_used[fn.name] = _referenced_symbols(fn)

    def _build_blocks(self) -> dict[int, Block]:
        leaders = set(self.entries.values())
        for name, entry in self.entries.items():
            fn = self.module.functions[name]
            leaders.update(entry + index for index in fn.labels.values())
        for pc, compiled in enumerate(self.code):
            if compiled.kind in _CONTROL:
                leaders.add(pc + 1)
        blocks: dict[int, Block] = {}
        current: Block | None = None
        for pc, compiled in enumerate(self.code):
            if pc in leaders or current is None:
                if current is not None and current.term is None:
                    current.next_pc = pc
                current = blocks[pc] = Block(pc)
            if compiled.kind == "op":
                current.ops.append(compiled.run)
                current.lines.append(compiled.line)
            else:
                current.term = compiled
                current.term_pc = pc
                current.next_pc = pc + 1
        return blocks

    # -- kernels ----------------------------------------------------------------------------
    def function_of_pc(self, pc: int) -> str:
        """The function whose code holds program counter `pc`."""
        for name, entry in self.entries.items():
            if entry <= pc < self.ends[name]:
                return name
        raise KeyError(pc)

    def _reachable(self, name: str) -> list[str]:
        order = [name]
        seen = {name}
        for current in order:
            callees = self.address_taken if current in self.indirect_callers else \
                self.callees.get(current, ())
            for callee in sorted(callees):
                if callee not in seen and callee in self.entries:
                    seen.add(callee)
                    order.append(callee)
        return order

    def _kernel(self, fn: Function) -> KernelProgram:
        params = kernel_param_layout(fn.params)
        param_size = max((offset + p.size for p, offset in params), default=0)
        functions = self._reachable(fn.name)
        module_vars = self.module.variables
        used = set().union(*(self.symbols_used[f] for f in functions))
        shared_vars: list[Variable] = []
        for f in functions:
            shared_vars += [v for v in self.module.functions[f].variables if v.space == "shared"]
        shared_vars += [module_vars[n] for n in sorted(used)
                        if n in module_vars and module_vars[n].space == "shared"]
        shared_offsets: dict[int, int] = {}
        offset = 0
        dynamic = [v for v in shared_vars if v.unsized]
        for var in shared_vars:
            if not var.unsized:
                offset = _align(offset, var.align)
                shared_offsets[id(var)] = offset
                offset += var.size
        static_shared = offset
        dynamic_offset = _align(offset, max([16] + [v.align for v in dynamic]))
        for var in dynamic:
            shared_offsets[id(var)] = dynamic_offset
        local_offsets: dict[int, int] = {}
        local = 0
        local_vars = 0
        frames: dict[str, tuple[np.ndarray, list[int]]] = {}
        for f in functions:
            function = self.module.functions[f]
            frame = [v for v in function.variables if v.space in ("local", "param")]
            if f != fn.name:
                frame += function.params + function.returns
            spans = []
            for var in frame:
                local = _align(local, var.align)
                local_offsets[id(var)] = local
                spans.append(np.arange(local, local + var.size, dtype=np.intp))
                local += var.size
                if var.space == "local":
                    local_vars += var.size
            frames[f] = (np.concatenate(spans) if spans else np.zeros(0, np.intp),
                         [reg.id for reg in function.registers])
        global_symbols = {n for n in used if n in module_vars
                          and module_vars[n].space in ("global", "const")}
        registers = sum(len(self.module.functions[f].registers) for f in functions)
        unsupported = next((self.unsupported[f] for f in functions if f in self.unsupported),
                           None)
        return KernelProgram(fn.name, fn, self.entries[fn.name], params, param_size,
                             functions, shared_offsets, static_shared, dynamic_offset,
                             local_offsets, local, local_vars, frames, global_symbols,
                             set().union(*(self.builtins_called.get(f, set())
                                           for f in functions)),
                             registers, unsupported)


def _unsupported(exc: UnsupportedPtx):
    """Stands in for an instruction that was not compiled. Launches of the kernels that
    reach it are refused (`prepare`), so running it would be a bug in that check."""
    def run(state, lanes):
        raise Fault(CUDA_ERROR_NOT_SUPPORTED, str(exc), "not implemented by the emulator",
                    0 if lanes is None else int(lanes[0]), exc.line)
    return run


def _align(value: int, align: int) -> int:
    align = max(align, 1)
    return (value + align - 1) // align * align


def _address_taken(module: Module) -> set[str]:
    """The device functions whose address an instruction (other than a call naming it) or a
    variable's initializer (a function pointer table, a virtual function table) takes."""
    defined = {n for n, fn in module.functions.items() if fn.body is not None and not fn.is_entry}
    taken = {name for var in module.variables.values() for _, name, _, _ in var.relocations}
    for fn in module.functions.values():
        for instr in fn.body or ():
            if instr.opcode != "call":
                taken |= _referenced_symbols_of(instr)
    return taken & defined


def _callee_names(instr) -> list[str]:
    return [o.name for o in instr.operands if isinstance(o, Symbol)][:1]


def _referenced_symbols(fn: Function) -> set[str]:
    """Names of module-scope symbols a function's instructions mention."""
    names: set[str] = set()
    for instr in fn.body:
        names |= _referenced_symbols_of(instr)
    return names


def _referenced_symbols_of(instr) -> set[str]:
    names: set[str] = set()

    def visit(operand) -> None:
        if isinstance(operand, Symbol):
            if operand.variable is None:
                names.add(operand.name)
        elif isinstance(operand, Address):
            visit(operand.base)
        elif isinstance(operand, (Vector, ListOperand)):
            for element in operand.elements:
                visit(element)
    for operand in instr.operands:
        visit(operand)
    return names
