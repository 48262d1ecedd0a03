"""The instruction table: how each PTX opcode compiles to a closure, and what closures are.

Every opcode module (`ops_*.py`) registers compile functions with `@opcode(...)`. A compile
function receives the parsed instruction and a `CompileContext` and returns a `Compiled`:
either a straight-line operation `run(state, lanes)` or a control transfer that the
executor's scheduler interprets. Compiling happens when a module is loaded, so an
malformed instruction is a `PtxError` at load; one the emulator does not implement is an
`UnsupportedPtx`, which the program records against its function (see `program.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import PtxError, UnsupportedPtx
from .ir import Function, Instruction, RegisterOperand
from .ptx_types import PtxType, lookup_type

__all__ = [
    "OPCODES",
    "CompileContext",
    "Compiled",
    "Modifiers",
    "find_compiler",
    "narrow",
    "opcode",
]


@dataclass(eq=False)
class Compiled:
    """One compiled instruction.

    kind: "op" (straight-line, `run(state, lanes)`), "bra", "brx", "call", "ret", "exit" or
    "bar". `guard(state, lanes) -> bool array` is the predicate of a guarded control
    transfer (straight-line ops fold their guard into `run`).
    """
    kind: str
    line: int
    text: str
    run: Callable | None = None
    guard: Callable | None = None
    target: str | None = None                  # bra: label
    targets: list[str] = field(default_factory=list)  # brx.idx: labels
    index: Callable | None = None              # brx.idx: index reader
    callee: str | None = None                  # call: function name
    arguments: list = field(default_factory=list)  # call: caller .param variables
    results: list = field(default_factory=list)    # call: caller .param variables
    before: list = field(default_factory=list)     # call: run(state, lanes) ops staging
    after: list = field(default_factory=list)      # register arguments in, results out
    release: Callable | None = None            # bar: work done when the barrier opens
    arrive: Callable | None = None             # bar: work done when lanes reach it
    target_pc: int = -1                        # bra: resolved by the program
    target_pcs: list[int] = field(default_factory=list)  # brx.idx: resolved likewise


# (opcode, floating) -> compile function. `floating` is True/False for opcodes whose
# integer and float forms compile differently (decided by the type modifier), None otherwise.
OPCODES: dict[tuple[str, bool | None], Callable[[Instruction, CompileContext], Compiled]] = {}
FLOAT_TYPE_NAMES = frozenset({"f16", "bf16", "f16x2", "bf16x2", "f32", "f64"})


def opcode(*names: str, floating: bool | None = None):
    def register(fn):
        for name in names:
            OPCODES[(name, floating)] = fn
        return fn
    return register


def find_compiler(instr: Instruction):
    floating = any(m in FLOAT_TYPE_NAMES for m in instr.modifiers)
    return OPCODES.get((instr.opcode, floating)) or OPCODES.get((instr.opcode, None))


class CompileContext:
    """What a compile function may ask about the module and the instruction at hand."""

    def __init__(self, module, function: Function, instr: Instruction):
        self.module = module          # ir.Module
        self.function = function
        self.instr = instr

    def error(self, message: str) -> PtxError:
        return PtxError(f"{self.instr.text}: {message}", self.instr.line)

    def unsupported(self, message: str) -> UnsupportedPtx:
        """For PTX the emulator does not implement (as opposed to PTX that is wrong)."""
        return UnsupportedPtx(f"{self.instr.text}: {message}", self.instr.line)

    def op(self, run: Callable) -> Compiled:
        """A straight-line op, with the instruction's guard folded in."""
        if self.instr.guard is not None:
            run = guarded(run, self.instr.guard)
        return Compiled("op", self.instr.line, self.instr.text, run=run)

    def control(self, kind: str, **fields) -> Compiled:
        guard = predicate_reader(self.instr.guard) if self.instr.guard is not None else None
        return Compiled(kind, self.instr.line, self.instr.text, guard=guard, **fields)

    def operand_count(self, *counts: int) -> None:
        if len(self.instr.operands) not in counts:
            raise self.error(f"expected {' or '.join(map(str, counts))} operands, "
                             f"got {len(self.instr.operands)}")


class Modifiers:
    """An instruction's modifiers split into types (in order) and the other flags.

    `take(*names)` consumes flags; `done()` raises for anything left unconsumed, so each
    compile function accepts exactly the modifiers it implements.
    """

    def __init__(self, ctx: CompileContext, ignorable: frozenset[str] = frozenset()):
        self.ctx = ctx
        self.types: list[PtxType] = []
        self.flags: list[str] = []
        for mod in ctx.instr.modifiers:
            ptype = lookup_type(mod)
            if ptype is not None:
                self.types.append(ptype)
            elif mod not in ignorable:
                self.flags.append(mod)

    def take(self, *names: str) -> str | None:
        """Consume and return the first of `names` present, else None."""
        for name in names:
            if name in self.flags:
                self.flags.remove(name)
                return name
        return None

    def has(self, name: str) -> bool:
        return self.take(name) is not None

    def type(self, allowed: set[str] | None = None, count: int = 1) -> PtxType:
        if len(self.types) != count:
            raise self.ctx.error(f"expected {count} type modifier(s)")
        ptype = self.types[0]
        if allowed is not None and ptype.name not in allowed:
            raise self.ctx.unsupported(f"type .{ptype.name} is not supported")
        return ptype

    def done(self) -> None:
        if self.flags:
            unknown = ", ".join("." + f for f in self.flags)
            raise self.ctx.unsupported(f"unsupported modifier(s) {unknown}")


def narrow(lanes, mask: np.ndarray):
    """The lanes (None = all) where `mask` (one bool per executing lane) is true."""
    return np.flatnonzero(mask) if lanes is None else lanes[mask]


def predicate_reader(operand: RegisterOperand) -> Callable:
    index = operand.reg.id
    if operand.reg.type.kind != "pred":
        raise PtxError(f"{operand.reg.name} is not a predicate")
    negate = operand.negate

    def read(state, lanes):
        value = state.reg(index)
        if lanes is not None:
            value = value[lanes]
        return ~value if negate else value
    return read


def guarded(run: Callable, guard: RegisterOperand) -> Callable:
    pred = predicate_reader(guard)

    def run_guarded(state, lanes):
        mask = pred(state, lanes)
        if mask.all():
            run(state, lanes)
        elif mask.any():
            run(state, narrow(lanes, mask))
    return run_guarded
