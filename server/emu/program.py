"""A parsed module compiled for execution: flat code, basic blocks and per-kernel layouts.

A kernel's functions (it and those it calls) are compiled (to closures, see `isa.py`) when
the kernel is first asked for (`Program.kernel`), each function once, into one flat code
array, so a program counter names an instruction anywhere in the module; a function whose
body a lazy parse left pending is parsed then. Basic blocks start at function entries,
labels, and after every control transfer; the scheduler always runs a whole block for a
group of lanes.

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

import re
from collections import Counter
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
from .errors import CUDA_ERROR_NOT_SUPPORTED, PtxError, UnsupportedPtx
from .ir import Function, Module, Variable
from .isa import CompileContext, Compiled, find_compiler
from .operands import kernel_param_layout
from .parser import parse_body, referenced_symbols
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
        self.register_dtypes: list[np.dtype] = []
        self.unsupported: dict[str, UnsupportedPtx] = {}   # function -> its first one
        self.blocks: dict[int, Block] = {}
        self.kernels: dict[str, KernelProgram] = {}          # those compiled so far
        self.broken: dict[str, PtxError] = {}                 # function -> why it cannot be
        self.function_addresses = function_addresses(module.functions)
        # address -> function, for calls through a register and device-side launches
        self.function_at = {a: n for n, a in self.function_addresses.items()}
        self._address_taken: set[str] | None = None          # see address_taken

    def kernel(self, name: str) -> KernelProgram | None:
        """The kernel `name` compiled, with its functions (None: no such kernel). A pending
        body's PtxError is raised here."""
        kernel = self.kernels.get(name)
        if kernel is not None:
            return kernel
        fn = self.module.functions.get(name)
        if fn is None or not fn.is_entry or not fn.defined:
            return None
        for function in self.reachable(name):
            if function not in self.entries:
                self._compile_function(self.module.functions[function])
        kernel = self.kernels[name] = self.layout(fn)
        return kernel

    def compile_all(self) -> None:
        """Parse and compile every function now (errors anywhere come out here)."""
        for fn in self.module.functions.values():
            if fn.defined and fn.name not in self.entries:
                self._compile_function(fn)
        for fn in self.module.functions.values():
            if fn.is_entry and fn.defined:
                self.kernel(fn.name)

    def _compile_function(self, fn: Function) -> None:
        """Compile `fn` (parsing its pending body first). A PtxError leaves nothing of it
        behind, and is raised again by every later attempt: the kernels reaching it stay
        unlaunchable, each launch saying why."""
        if fn.name in self.broken:
            raise self.broken[fn.name]
        code_size, register_count = len(self.code), len(self.register_dtypes)
        try:
            self._compile_body(fn)
        except PtxError as exc:
            del self.code[code_size:], self.register_dtypes[register_count:]
            self.entries.pop(fn.name, None)
            self.unsupported.pop(fn.name, None)
            self.broken[fn.name] = exc
            raise

    def _compile_body(self, fn: Function) -> None:
        if fn.pending is not None:
            parse_body(self.module, fn)
        for reg in fn.registers:
            reg.id = len(self.register_dtypes)
            self.register_dtypes.append(reg.type.dtype)
        entry = len(self.code)
        self.entries[fn.name] = entry
        for instr in fn.body:
            try:
                compile_fn = find_compiler(instr)
                if compile_fn is None:
                    raise UnsupportedPtx(f"unsupported instruction {instr.text!r}", instr.line)
                compiled = compile_fn(instr, CompileContext(self.module, fn, instr))
            except UnsupportedPtx as exc:
                self.unsupported.setdefault(fn.name, exc)
                compiled = Compiled("op", instr.line, instr.text, run=_unsupported(exc))
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
        self._build_blocks(fn, entry, len(self.code))

    def _build_blocks(self, fn: Function, entry: int, end: int) -> None:
        leaders = {entry} | {entry + index for index in fn.labels.values()}
        for pc in range(entry, end):
            if self.code[pc].kind in _CONTROL:
                leaders.add(pc + 1)
        current: Block | None = None
        for pc in range(entry, end):
            compiled = self.code[pc]
            if pc in leaders or current is None:
                if current is not None and current.term is None:
                    current.next_pc = pc
                current = self.blocks[pc] = Block(pc)
            if compiled.kind == "op":
                current.ops.append(compiled.run)
                current.lines.append(compiled.line)
            else:
                current.term = compiled
                current.term_pc = pc
                current.next_pc = pc + 1

    # -- kernels ----------------------------------------------------------------------------
    def function_of_pc(self, pc: int) -> str:
        """The function whose code holds program counter `pc`."""
        for name, entry in self.entries.items():
            if entry <= pc < self.ends[name]:
                return name
        raise KeyError(pc)

    def address_taken(self) -> set[str]:
        """What a call through a register may reach: the device functions whose address an
        instruction (other than a call naming it) or a variable's initializer (a function
        pointer table, a virtual function table) takes. Worked out when first needed."""
        if self._address_taken is None:
            self._address_taken = _address_taken(self.module)
        return self._address_taken

    def reachable(self, name: str) -> list[str]:
        """The function `name` and the defined functions it calls, directly or not."""
        order = [name]
        seen = {name}
        functions = self.module.functions
        for current in order:
            function = functions[current]
            callees = self.address_taken() if function.calls_indirectly else function.callees
            for callee in sorted(callees):
                if callee not in seen and callee in functions and functions[callee].defined:
                    seen.add(callee)
                    order.append(callee)
        return order

    def layout(self, fn: Function) -> KernelProgram:
        """Kernel `fn`'s layout from what its functions declare and call. Before they are
        compiled (a module's load reports every kernel's attributes), the entry point and
        unsupported instruction are not known yet and the layout's offsets name the scan's
        variables; `kernel` makes the layout again once its functions are compiled."""
        params = kernel_param_layout(fn.params)
        param_size = max((offset + p.size for p, offset in params), default=0)
        functions = self.reachable(fn.name)
        module_vars = self.module.variables
        used = set().union(*(self.module.functions[f].symbols for f in functions))
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
        return KernelProgram(fn.name, fn, self.entries.get(fn.name, -1), params, param_size,
                             functions, shared_offsets, static_shared, dynamic_offset,
                             local_offsets, local, local_vars, frames, global_symbols,
                             self._runtime_calls(functions), registers, unsupported)

    def _runtime_calls(self, functions: list[str]) -> set[str]:
        """The functions `functions` call that the module declares without a body: those
        the emulator provides (vprintf, malloc, the device runtime's launches, ...)."""
        declared = self.module.functions
        return {callee for f in functions for callee in declared[f].callees
                if callee in declared and not declared[callee].defined}


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


# A pending body (see parser.py) is searched as text: calls name their target after an
# optional list of results; any other mention of a function's name takes its address.
_CALL_TARGET_RE = re.compile(r"call(?<![\w$.%]call)(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?"
                             r"([A-Za-z_$][\w$]*)")
_NAME_RE = re.compile(r"(?<![\w$.%])[A-Za-z_$][\w$]*")


def _address_taken(module: Module) -> set[str]:
    """See Program.address_taken."""
    defined = {n for n, fn in module.functions.items() if fn.defined and not fn.is_entry}
    taken = {name for var in module.variables.values() for _, name, _, _ in var.relocations}
    for fn in module.functions.values():
        if fn.body is not None:
            for instr in fn.body:
                if instr.opcode != "call":
                    taken |= referenced_symbols(instr)
        elif fn.pending is not None:
            text = fn.pending[0]
            calls = Counter(n for n in _CALL_TARGET_RE.findall(text) if n in defined)
            mentions = Counter(n for n in _NAME_RE.findall(text) if n in defined)
            taken |= {n for n, count in mentions.items() if count > calls[n]}
    return taken & defined

