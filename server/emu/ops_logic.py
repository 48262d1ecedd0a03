"""Bitwise logic and shifts: and or xor not cnot lop3 shl shr.

Shift amounts are unsigned 32-bit and clamp at the type width, as PTX specifies: `shl` and
`shr.u`/`shr.b` by >= width give 0, `shr.s` gives the sign fill.
"""

from __future__ import annotations

import numpy as np

from .ir import Immediate
from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ops_common import elementwise
from .ptx_types import TYPES, int_dtype

__all__: list[str] = []

_BITS = {"b16", "b32", "b64", "u16", "u32", "u64", "s16", "s32", "s64"}
_U32 = TYPES["u32"]


@opcode("and", "or", "xor")
def _binary_logic(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type(_BITS | {"pred"})
    mods.done()
    fn = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[instr.opcode]
    return elementwise(ctx, ptype, [ptype, ptype], lambda a, b: fn(a, b))


@opcode("not", "cnot")
def _not(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type(_BITS | {"pred"})
    mods.done()
    if instr.opcode == "not":
        return elementwise(ctx, ptype, [ptype], lambda a: np.invert(a))
    if ptype.kind == "pred":
        raise ctx.error("cnot takes an integer type")
    return elementwise(ctx, ptype, [ptype],
                       lambda a: (np.asarray(a) == 0).astype(ptype.dtype))


@opcode("lop3")
def _lop3(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"b32"})
    mods.done()
    ctx.operand_count(5)
    if not isinstance(instr.operands[4], Immediate):
        raise ctx.error("lop3 needs an immediate lookup table")
    lut = int(instr.operands[4].value) & 0xFF
    write = writer(instr.operands[0], ptype, ctx)
    ra, rb, rc = (reader(o, ptype, ctx) for o in instr.operands[1:4])

    def run(state, lanes):
        a, b, c = np.asarray(ra(state, lanes)), rb(state, lanes), rc(state, lanes)
        result = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
        for k in range(8):
            if lut >> k & 1:
                term = (a if 0xF0 >> k & 1 else ~a) & (b if 0xCC >> k & 1 else ~b)
                result |= term & (c if 0xAA >> k & 1 else ~c)
        write(state, lanes, result if result.ndim else result[()])
    return ctx.op(run)


@opcode("shl", "shr")
def _shift(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type(_BITS)
    mods.done()
    bits = ptype.bits
    if instr.opcode == "shl":
        udt = int_dtype(bits, False)

        def shl(a, n):
            n = np.asarray(n)
            shifted = np.asarray(a).view(udt) << np.minimum(n, bits - 1).astype(udt)
            return np.where(n >= bits, udt.type(0), shifted).astype(udt).view(ptype.dtype)
        return elementwise(ctx, ptype, [ptype, _U32], shl)
    if ptype.is_signed:
        def sar(a, n):
            return np.asarray(a) >> np.minimum(np.asarray(n), bits - 1).astype(ptype.dtype)
        return elementwise(ctx, ptype, [ptype, _U32], sar)
    udt = int_dtype(bits, False)

    def shr(a, n):
        n = np.asarray(n)
        shifted = np.asarray(a).view(udt) >> np.minimum(n, bits - 1).astype(udt)
        return np.where(n >= bits, udt.type(0), shifted).astype(udt).view(ptype.dtype)
    return elementwise(ctx, ptype, [ptype, _U32], shr)
