"""Helpers shared by the opcode modules: element-wise op builders and small bit utilities."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .isa import CompileContext, Compiled
from .operands import reader, writer
from .ptx_types import PtxType, int_dtype

__all__ = ["bit_length", "elementwise", "unsigned", "wrap_scalar"]


def elementwise(ctx: CompileContext, dst: PtxType, srcs: list[PtxType],
                fn: Callable) -> Compiled:
    """`d = fn(a, b, ...)` with operands read as `srcs` and the result written as `dst`."""
    ops = ctx.instr.operands
    ctx.operand_count(1 + len(srcs))
    write = writer(ops[0], dst, ctx)
    reads = [reader(o, t, ctx) for o, t in zip(ops[1:], srcs, strict=True)]
    if len(reads) == 1:
        (ra,) = reads

        def run1(state, lanes):
            write(state, lanes, fn(ra(state, lanes)))
        return ctx.op(run1)
    if len(reads) == 2:
        ra, rb = reads

        def run2(state, lanes):
            write(state, lanes, fn(ra(state, lanes), rb(state, lanes)))
        return ctx.op(run2)
    if len(reads) == 3:
        ra, rb, rc = reads

        def run3(state, lanes):
            write(state, lanes, fn(ra(state, lanes), rb(state, lanes), rc(state, lanes)))
        return ctx.op(run3)

    def run_n(state, lanes):
        write(state, lanes, fn(*(r(state, lanes) for r in reads)))
    return ctx.op(run_n)


def unsigned(value, bits: int):
    """The same bits viewed as an unsigned integer."""
    return value.view(int_dtype(bits, False))


def wrap_scalar(value) -> np.ndarray:
    """A numpy scalar as a 1-element array (for code that needs indexing or views)."""
    return np.atleast_1d(value)


def bit_length(value) -> np.ndarray:
    """Number of significant bits of unsigned 32- or 64-bit values (0 for 0)."""
    value = np.asarray(value)
    if value.dtype.itemsize == 8:
        high = (value >> np.uint64(32)).astype(np.uint32)
        low = (value & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        return np.where(high != 0, 32 + bit_length(high), bit_length(low))
    _, exponent = np.frexp(value.astype(np.float64))
    return exponent.astype(np.int64)
