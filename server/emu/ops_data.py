"""Data movement between registers: mov (incl. vector pack/unpack, special registers and
symbol addresses), cvta, isspacep."""

from __future__ import annotations

import numpy as np

from .address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from .ir import Vector
from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ops_common import elementwise
from .ptx_types import TYPES, int_dtype

__all__: list[str] = []

_WINDOW = {"shared": GENERIC_SHARED_BASE, "local": GENERIC_LOCAL_BASE,
           "param": GENERIC_PARAM_BASE, "global": 0, "const": 0}


@opcode("mov")
def _mov(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type()
    mods.done()
    ctx.operand_count(2)
    dst, src = instr.operands
    if isinstance(src, Vector):
        return _pack(ctx, ptype, dst, src)
    if isinstance(dst, Vector):
        return _unpack(ctx, ptype, dst, src)
    return elementwise(ctx, ptype, [ptype], lambda a: a)


def _part_type(ctx, ptype, count):
    bits = ptype.bits // count
    if bits not in (8, 16, 32) or count not in (2, 4):
        raise ctx.error(f"cannot split .{ptype.name} into {count} parts")
    return TYPES[f"b{bits}"]


def _pack(ctx, ptype, dst, src: Vector):
    part = _part_type(ctx, ptype, len(src.elements))
    write = writer(dst, ptype, ctx)
    reads = [reader(e, part, ctx) for e in src.elements]
    wide = int_dtype(ptype.bits, False)

    def run(state, lanes):
        result = None
        for k, read in enumerate(reads):
            piece = np.asarray(read(state, lanes)).astype(wide) << wide.type(part.bits * k)
            result = piece if result is None else result | piece
        write(state, lanes, result.view(ptype.dtype) if result.ndim else result.view(
            ptype.dtype)[()])
    return ctx.op(run)


def _unpack(ctx, ptype, dst: Vector, src):
    part = _part_type(ctx, ptype, len(dst.elements))
    read = reader(src, ptype, ctx)
    writes = [writer(e, part, ctx) for e in dst.elements]
    wide = int_dtype(ptype.bits, False)
    small = part.dtype
    mask = wide.type((1 << part.bits) - 1)

    def run(state, lanes):
        value = np.asarray(read(state, lanes)).view(wide)
        for k, write in enumerate(writes):
            piece = ((value >> wide.type(part.bits * k)) & mask).astype(small)
            write(state, lanes, piece if piece.ndim else piece[()])
    return ctx.op(run)


@opcode("cvta")
def _cvta(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    to = mods.has("to")
    space = mods.take("global", "shared", "local", "const", "param", "shared::cta")
    ptype = mods.type({"u32", "u64"})
    mods.done()
    if space is None:
        raise ctx.error("cvta needs a state space")
    base = _WINDOW["shared" if space == "shared::cta" else space]
    offset = ptype.dtype.type(base & ((1 << ptype.bits) - 1))
    if base == 0:
        return elementwise(ctx, ptype, [ptype], lambda a: a)
    if to:
        return elementwise(ctx, ptype, [ptype], lambda a: a - offset)
    return elementwise(ctx, ptype, [ptype], lambda a: a + offset)


@opcode("isspacep")
def _isspacep(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    space = mods.take("global", "shared", "local", "const", "param", "shared::cta")
    mods.done()
    if space is None:
        raise ctx.error("isspacep needs a state space")
    space = "shared" if space == "shared::cta" else space
    u64 = np.uint64
    tags = {name: u64(base >> 56) for name, base in _WINDOW.items() if base}

    def test(a):
        tag = np.asarray(a) >> u64(56)
        if space in ("global", "const"):
            return tag < u64(0xF0)
        return tag == tags[space]
    return elementwise(ctx, TYPES["pred"], [TYPES["u64"]], test)
