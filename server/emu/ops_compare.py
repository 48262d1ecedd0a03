"""Comparisons and selection: setp set selp slct.

Float comparisons follow IEEE: the ordered operators (eq ne lt le gt ge) are false when
either operand is NaN, the unordered ones (equ neu ltu leu gtu geu) true; `num` and `nan`
test for NaNs. Integer `lo ls hi hs` compare as unsigned.
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ops_common import elementwise
from .ops_float import flush
from .ptx_types import TYPES, PtxType

__all__: list[str] = []

_PRED = TYPES["pred"]
_ORDERED = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
_UNSIGNED = {"lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
_UNORDERED = {"equ": "eq", "neu": "ne", "ltu": "lt", "leu": "le", "gtu": "gt", "geu": "ge"}
_COMBINE = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def comparison(op: str, ptype: PtxType, ctx: CompileContext):
    """`cmp(a, b) -> bool array` for operator `op` on operands of `ptype`."""
    if ptype.is_float:
        if op in _ORDERED:
            fn = _ORDERED[op]
            if op == "ne":
                return lambda a, b: (a != b) & ~np.isnan(a) & ~np.isnan(b)
            return lambda a, b: fn(a, b)
        if op in _UNORDERED:
            fn = _ORDERED[_UNORDERED[op]]
            return lambda a, b: fn(a, b) | np.isnan(a) | np.isnan(b)
        if op == "num":
            return lambda a, b: ~(np.isnan(a) | np.isnan(b))
        if op == "nan":
            return lambda a, b: np.isnan(a) | np.isnan(b)
        raise ctx.error(f"comparison .{op} is not defined for floats")
    if op in _UNSIGNED:
        fn = _UNSIGNED[op]
        udt = np.dtype(f"uint{ptype.bits}")
        return lambda a, b: fn(np.asarray(a).view(udt), np.asarray(b).view(udt))
    if op in _ORDERED:
        fn = _ORDERED[op]
        return lambda a, b: fn(a, b)
    raise ctx.error(f"comparison .{op} is not defined for integers")


_CMP_NAMES = set(_ORDERED) | set(_UNSIGNED) | set(_UNORDERED) | {"num", "nan"}
_HALF_TYPES = {"f16", "bf16"}


def _operand_decoder(ptype: PtxType):
    """Half types compare as the values they encode."""
    if ptype.name == "f16":
        return TYPES["f16"], lambda v: np.asarray(v, np.uint16).view(np.float16)
    if ptype.name == "bf16":
        return TYPES["bf16"], lambda v: (np.asarray(v, np.uint16).astype(np.uint32)
                                         << np.uint32(16)).view(np.float32)
    return ptype, None


_PACKED = {"f16x2": "f16", "bf16x2": "bf16"}


def _packed_comparison(instr, ctx: CompileContext, ptype: PtxType, op: str, ftz: bool,
                       combine):
    """For setp/set on f16x2/bf16x2 operands a, b (and predicate c with .and/.or/.xor):
    run(state, lanes) -> (low halves' results, high halves'), each combined with c."""
    _, decode = _operand_decoder(TYPES[_PACKED[ptype.name]])
    compare = comparison(op, TYPES["f32"], ctx)
    ctx.operand_count(4 if combine else 3)
    ra = reader(instr.operands[1], ptype, ctx)
    rb = reader(instr.operands[2], ptype, ctx)
    rc = reader(instr.operands[3], _PRED, ctx) if combine else None
    join = _COMBINE[combine] if combine else None

    def halves(v):
        v = np.asarray(v, np.uint32)
        low = decode((v & np.uint32(0xFFFF)).astype(np.uint16))
        high = decode((v >> np.uint32(16)).astype(np.uint16))
        return (flush(low), flush(high)) if ftz else (low, high)

    def run(state, lanes):
        (a_low, a_high), (b_low, b_high) = halves(ra(state, lanes)), halves(rb(state, lanes))
        low, high = compare(a_low, b_low), compare(a_high, b_high)
        if join is not None:
            c = rc(state, lanes)
            low, high = join(low, c), join(high, c)
        return low, high
    return run


def _compiled_comparison(ctx, mods):
    op = mods.take(*_CMP_NAMES)
    if op is None:
        raise ctx.error("missing comparison operator")
    ftz = mods.has("ftz")
    combine = mods.take(*_COMBINE)
    return op, ftz, combine


@opcode("setp")
def _setp(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    op, ftz, combine = _compiled_comparison(ctx, mods)
    ptype = mods.type()
    mods.done()
    if ptype.name in _PACKED:
        return _setp_packed(instr, ctx, ptype, op, ftz, combine)
    src, decode = _operand_decoder(ptype)
    compare = comparison(op, TYPES["f32"] if decode else ptype, ctx)
    ctx.operand_count(4 if combine else 3)
    write_p = writer(instr.operands[0], _PRED, ctx)
    write_q = writer(instr.pair, _PRED, ctx) if instr.pair is not None else None
    ra = reader(instr.operands[1], src, ctx)
    rb = reader(instr.operands[2], src, ctx)
    rc = reader(instr.operands[3], _PRED, ctx) if combine else None
    join = _COMBINE[combine] if combine else None

    def run(state, lanes):
        a, b = ra(state, lanes), rb(state, lanes)
        if decode is not None:
            a, b = decode(a), decode(b)
        if ftz:
            a, b = flush(a), flush(b)
        result = compare(a, b)
        if join is None:
            write_p(state, lanes, result)
            if write_q is not None:
                write_q(state, lanes, ~result)
            return
        c = rc(state, lanes)
        write_p(state, lanes, join(result, c))
        if write_q is not None:
            write_q(state, lanes, join(~result, c))
    return ctx.op(run)


def _setp_packed(instr, ctx, ptype, op, ftz, combine):
    """setp on f16x2/bf16x2: p gets the low halves' result, q the high halves' (each
    combined with c by .and/.or/.xor)."""
    if instr.pair is None:
        raise ctx.error(f"setp.{ptype.name} needs two destinations p|q")
    compare = _packed_comparison(instr, ctx, ptype, op, ftz, combine)
    write_p = writer(instr.operands[0], _PRED, ctx)
    write_q = writer(instr.pair, _PRED, ctx)

    def run(state, lanes):
        low, high = compare(state, lanes)
        write_p(state, lanes, low)
        write_q(state, lanes, high)
    return ctx.op(run)


# What set writes for true (false is 0): 1.0 for floats (f16/bf16 as their bits), all ones
# for integers.
_SET_TRUE = {"u32": np.uint32(0xFFFFFFFF), "s32": np.int32(-1), "f32": np.float32(1.0),
             "f16": np.uint16(0x3C00), "bf16": np.uint16(0x3F80)}


@opcode("set")
def _set(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    op, ftz, combine = _compiled_comparison(ctx, mods)
    if len(mods.types) != 2:
        raise ctx.error("set needs a destination and a source type")
    dtype, stype = mods.types
    mods.types = [dtype]
    mods.done()
    if stype.name in _PACKED:
        return _set_packed(instr, ctx, dtype, stype, op, ftz, combine)
    if dtype.name not in _SET_TRUE:
        raise ctx.unsupported(f"destination type .{dtype.name} is not supported")
    src, decode = _operand_decoder(stype)
    compare = comparison(op, TYPES["f32"] if decode else stype, ctx)
    true_value = _SET_TRUE[dtype.name]
    zero = dtype.dtype.type(0)
    join = _COMBINE[combine] if combine else None
    ctx.operand_count(4 if combine else 3)
    write = writer(instr.operands[0], dtype, ctx)
    ra = reader(instr.operands[1], src, ctx)
    rb = reader(instr.operands[2], src, ctx)
    rc = reader(instr.operands[3], _PRED, ctx) if combine else None

    def run(state, lanes):
        a, b = ra(state, lanes), rb(state, lanes)
        if decode is not None:
            a, b = decode(a), decode(b)
        if ftz:
            a, b = flush(a), flush(b)
        result = compare(a, b)
        if join is not None:
            result = join(result, rc(state, lanes))
        write(state, lanes, np.where(result, true_value, zero).astype(dtype.dtype))
    return ctx.op(run)


def _set_packed(instr, ctx, dtype, stype, op, ftz, combine):
    """set on f16x2/bf16x2 sources: each half of d is 1.0 (in the destination's half
    format) or all ones (.u32/.s32 destinations) where its halves compare true, else 0."""
    if dtype.name == stype.name:
        true_half = _SET_TRUE[_PACKED[dtype.name]].astype(np.uint32)
    elif dtype.name in ("u32", "s32"):
        true_half = np.uint32(0xFFFF)
    else:
        raise ctx.error(f"set.{dtype.name}.{stype.name}: the destination must be "
                        f".{stype.name}, .u32 or .s32")
    compare = _packed_comparison(instr, ctx, stype, op, ftz, combine)
    write = writer(instr.operands[0], dtype, ctx)
    zero = np.uint32(0)

    def run(state, lanes):
        low, high = compare(state, lanes)
        bits = np.where(low, true_half, zero) | (np.where(high, true_half, zero)
                                                  << np.uint32(16))
        write(state, lanes, np.asarray(bits, np.uint32).view(dtype.dtype))
    return ctx.op(run)


@opcode("selp")
def _selp(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type()
    mods.done()
    return elementwise(ctx, ptype, [ptype, ptype, _PRED],
                       lambda a, b, c: np.where(c, a, b).astype(ptype.dtype))


@opcode("slct")
def _slct(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ftz = mods.has("ftz")
    if len(mods.types) != 2:
        raise ctx.error("slct needs a destination and a selector type")
    dtype, ctype = mods.types
    mods.types = [dtype]
    mods.done()
    if ctype.name not in ("s32", "f32"):
        raise ctx.error("the selector type must be .s32 or .f32")

    def slct(a, b, c):
        if ftz:
            c = flush(c)
        return np.where(np.asarray(c) >= 0, a, b).astype(dtype.dtype)
    return elementwise(ctx, dtype, [dtype, dtype, ctype], slct)
