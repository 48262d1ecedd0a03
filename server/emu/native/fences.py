"""Instructions that order or delay memory accesses and do nothing else here: `membar`,
`fence`, `nanosleep` (and `pmevent`, `griddepcontrol`, `brkpt`, as on the interpreter).

A thread runs alone until its turn ends and blocks' workers use LLVM atomics for atomics, so
as on the interpreter they need no code; the modifiers are checked as the interpreter checks
them (one it does not know leaves the kernel to the interpreter, which refuses it)."""

from __future__ import annotations

from ..ptx_types import TYPES
from .codegen import _HANDLERS, NotCompiled

__all__: list[str] = []

_ORDERING = frozenset({
    "cta", "gl", "sys", "gpu", "cluster", "sc", "acq_rel", "proxy", "async", "alias",
    "global", "shared::cta", "shared::cluster", "tensormap", "release", "acquire",
    "mbarrier_init", "shared"})


def _no_effect(c, instr) -> None:
    if instr.opcode in ("membar", "fence"):
        unknown = [m for m in instr.modifiers if m not in _ORDERING]
        if unknown:
            raise NotCompiled(instr.text, instr.line)
    elif instr.opcode == "nanosleep":
        if instr.modifiers != ("u32",) or len(instr.operands) != 1:
            raise NotCompiled(instr.text, instr.line)
        c.read(instr.operands[0], TYPES["u32"], instr)


_HANDLERS.update({name: _no_effect for name in (
    "membar", "fence", "nanosleep", "pmevent", "griddepcontrol", "brkpt")})
