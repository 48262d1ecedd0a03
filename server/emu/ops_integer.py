"""Integer arithmetic: add sub mul mad (lo/hi/wide, carry) mul24 mad24 div rem abs neg min
max sad popc clz brev bfind bfe bfi prmt shf dp4a dp2a, and the packed `.u16x2`/`.s16x2`
forms of add sub min max (two 16-bit halves of a .b32 register, each computed on its own).

Semantics the ISA leaves open follow what NVIDIA GPUs do:
- integer division by zero: `div.u x/0` = all ones, `rem.u x%0` = x; `div.s x/0` = -1 for
  x >= 0 and 1 for x < 0 (the unsigned quotient with the operand signs applied), and
  `rem.s x%0` = x. `div.s MIN/-1` = MIN, `rem.s MIN%-1` = 0 (wrap-around, no trap).
- the carry flag (`.cc`, `addc`, `subc`, `madc`) is one bit per thread; subtraction stores
  the borrow, so `sub.cc` + `subc` chains compute multi-word differences.
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ops_common import bit_length, elementwise, unsigned, wrap_scalar
from .ptx_types import TYPES, PtxType, int_dtype

__all__: list[str] = []

_INT = {"s16", "u16", "s32", "u32", "s64", "u64", "b16", "b32", "b64"}
_U32 = TYPES["u32"]


def _packed16(signed: bool, fn):
    """`fn` applied to the low halves and to the high halves of two 32-bit words: a packed
    `.s16x2`/`.u16x2` operation. Each half wraps to 16 bits (no carry between halves); the
    halves are widened to int32 first so that wrapping is a truncation, not an overflow."""
    half = np.int16 if signed else np.uint16

    def run(a, b):
        a, b = np.asarray(a, np.uint32), np.asarray(b, np.uint32)
        out = np.uint32(0)
        for shift in (0, 16):
            x = (a >> np.uint32(shift)).astype(np.uint16).view(half).astype(np.int32)
            y = (b >> np.uint32(shift)).astype(np.uint16).view(half).astype(np.int32)
            out = out | (fn(x, y).astype(np.uint16).astype(np.uint32) << np.uint32(shift))
        return out
    return run


def _packed_type(mods: Modifiers) -> str | None:
    """The packed 16x2 type named by the instruction, if any. These names are not register
    types, so Modifiers leaves them among the flags."""
    return mods.take("s16x2", "u16x2")


def _wide(ptype: PtxType) -> PtxType:
    return TYPES[f"{'s' if ptype.is_signed else 'u'}{ptype.bits * 2}"]


def _read_carry(state, lanes) -> np.ndarray:
    carry = state.carry
    if carry is None:
        carry = state.carry = np.zeros(state.n, np.uint8)
    return carry if lanes is None else carry[lanes]


def _write_carry(state, lanes, value) -> None:
    value = np.asarray(value, np.uint8)
    if lanes is None:
        state.carry = np.broadcast_to(value, (state.n,)).copy() if value.ndim == 0 else value
    else:
        new = _read_carry(state, None).copy()
        new[lanes] = value
        state.carry = new


def _add_with_carry(a, b, carry_in, bits):
    """(sum, carry out) of unsigned a + b + carry_in."""
    dtype = int_dtype(bits, False)
    a = np.asarray(a).view(dtype)
    b = np.asarray(b).view(dtype)
    partial = a + b
    carry = partial < a
    if carry_in is None:
        return partial, carry
    total = partial + carry_in.astype(dtype)
    return total, carry | (total < partial)


def _sub_with_borrow(a, b, borrow_in, bits):
    dtype = int_dtype(bits, False)
    a = np.asarray(a).view(dtype)
    b = np.asarray(b).view(dtype)
    partial = a - b
    borrow = a < b
    if borrow_in is None:
        return partial, borrow
    borrow_in = borrow_in.astype(dtype)
    return partial - borrow_in, borrow | (partial < borrow_in)


@opcode("add", "sub", "addc", "subc", floating=False)
def _add_sub(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    sat = mods.has("sat")
    cc = mods.has("cc")
    is_add = instr.opcode in ("add", "addc")
    packed = _packed_type(mods) if instr.opcode in ("add", "sub") else None
    if packed:
        mods.done()
        if sat or cc:
            raise ctx.error(f"{instr.opcode}.{packed} takes no .sat or .cc")
        fn = _packed16(packed == "s16x2", (lambda a, b: a + b) if is_add else (lambda a, b: a - b))
        return elementwise(ctx, _U32, [_U32, _U32], fn)
    ptype = mods.type(_INT)
    mods.done()
    uses_carry = instr.opcode in ("addc", "subc")
    if sat and (ptype.name != "s32" or cc or uses_carry):
        raise ctx.error(".sat applies to add/sub.s32 only")
    if sat:
        def saturate(a, b):
            wide = a.astype(np.int64) + b if is_add else a.astype(np.int64) - b
            return np.clip(wide, -2**31, 2**31 - 1).astype(np.int32)
        return elementwise(ctx, ptype, [ptype, ptype], saturate)
    if not (cc or uses_carry):
        return elementwise(ctx, ptype, [ptype, ptype],
                           (lambda a, b: a + b) if is_add else (lambda a, b: a - b))
    ctx.operand_count(3)
    write = writer(instr.operands[0], ptype, ctx)
    ra = reader(instr.operands[1], ptype, ctx)
    rb = reader(instr.operands[2], ptype, ctx)
    bits = ptype.bits
    combine = _add_with_carry if is_add else _sub_with_borrow

    def run(state, lanes):
        carry_in = _read_carry(state, lanes) if uses_carry else None
        result, carry = combine(ra(state, lanes), rb(state, lanes), carry_in, bits)
        write(state, lanes, result.view(ptype.dtype))
        if cc:
            _write_carry(state, lanes, carry)
    return ctx.op(run)


def _mul_hi(a, b, ptype: PtxType):
    """High half of the full product of two `ptype` values."""
    bits = ptype.bits
    if bits < 64:
        wide = int_dtype(bits * 2, ptype.is_signed)
        product = np.asarray(a).astype(wide) * np.asarray(b).astype(wide)
        return (product >> wide.type(bits)).astype(ptype.dtype)
    u = np.uint64
    ua = np.asarray(a).view(u)
    ub = np.asarray(b).view(u)
    mask = u(0xFFFFFFFF)
    a_lo, a_hi = ua & mask, ua >> u(32)
    b_lo, b_hi = ub & mask, ub >> u(32)
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo + (lo_lo >> u(32))
    mid2 = a_lo * b_hi + (mid1 & mask)
    high = a_hi * b_hi + (mid1 >> u(32)) + (mid2 >> u(32))
    if ptype.is_signed:
        sa = np.asarray(a).view(np.int64)
        sb = np.asarray(b).view(np.int64)
        high = high - np.where(sa < 0, ub, u(0)) - np.where(sb < 0, ua, u(0))
    return np.asarray(high).view(ptype.dtype)


def _product(ctx, instr, ptype: PtxType):
    """(result type, product function) for mul/mad's .lo/.hi/.wide."""
    modes = [m for m in instr.modifiers if m in ("lo", "hi", "wide")]
    mode = modes[0] if modes else "lo"
    if mode == "wide":
        if ptype.bits == 64:
            raise ctx.error(".wide needs a 16- or 32-bit type")
        wide = _wide(ptype)
        return wide, lambda a, b: np.asarray(a).astype(wide.dtype) * np.asarray(b).astype(
            wide.dtype)
    if mode == "hi":
        return ptype, lambda a, b: _mul_hi(a, b, ptype)
    return ptype, lambda a, b: a * b


@opcode("mul", "mad", "madc", floating=False)
def _mul_mad(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("lo", "hi", "wide")
    cc = mods.has("cc")
    sat = mods.has("sat")
    ptype = mods.type(_INT)
    mods.done()
    result_type, product = _product(ctx, instr, ptype)
    if instr.opcode == "mul":
        if cc or sat:
            raise ctx.error("mul takes no .cc or .sat")
        return elementwise(ctx, result_type, [ptype, ptype], product)
    if sat:
        if ptype.name != "s32" or "hi" not in instr.modifiers:
            raise ctx.error(".sat applies to mad.hi.s32 only")

        def mad_hi_sat(a, b, c):
            full = (np.asarray(a).astype(np.int64) * b) >> 32
            return np.clip(full + c, -2**31, 2**31 - 1).astype(np.int32)
        return elementwise(ctx, ptype, [ptype, ptype, ptype], mad_hi_sat)
    uses_carry = instr.opcode == "madc"
    if not (cc or uses_carry):
        return elementwise(ctx, result_type, [ptype, ptype, result_type],
                           lambda a, b, c: product(a, b) + c)
    ctx.operand_count(4)
    write = writer(instr.operands[0], result_type, ctx)
    ra, rb = (reader(o, ptype, ctx) for o in instr.operands[1:3])
    rc = reader(instr.operands[3], result_type, ctx)
    bits = result_type.bits

    def run(state, lanes):
        carry_in = _read_carry(state, lanes) if uses_carry else None
        p = product(ra(state, lanes), rb(state, lanes))
        result, carry = _add_with_carry(p, rc(state, lanes), carry_in, bits)
        write(state, lanes, result.view(result_type.dtype))
        if cc:
            _write_carry(state, lanes, carry)
    return ctx.op(run)


def _low24(value, signed: bool):
    value = np.asarray(value)
    if signed:
        return ((value.astype(np.int64) << 40) >> 40)
    return value.astype(np.int64) & 0xFFFFFF


@opcode("mul24", "mad24")
def _mul24(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take("lo", "hi") or "lo"
    ptype = mods.type({"u32", "s32"})
    mods.done()
    signed = ptype.is_signed

    def product(a, b):
        full = _low24(a, signed) * _low24(b, signed)
        if mode == "hi":
            full = full >> 16
        return (full & 0xFFFFFFFF).astype(np.uint32).view(ptype.dtype)
    if instr.opcode == "mul24":
        return elementwise(ctx, ptype, [ptype, ptype], product)
    return elementwise(ctx, ptype, [ptype] * 3, lambda a, b, c: product(a, b) + c)


def divide(a, b, ptype: PtxType):
    """Integer division with the GPU's answers for zero divisors and MIN / -1."""
    a = np.asarray(a)
    b = np.asarray(b)
    if not ptype.is_signed:
        zero = b == 0
        safe = np.where(zero, 1, b).astype(ptype.dtype)
        return np.where(zero, np.iinfo(ptype.dtype).max, a // safe).astype(ptype.dtype)
    info = np.iinfo(ptype.dtype)
    zero = b == 0
    overflow = (a == info.min) & (b == -1)
    safe = np.where(zero | overflow, 1, b).astype(ptype.dtype)
    remainder = np.fmod(a, safe)
    quotient = (a - remainder) // safe
    quotient = np.where(overflow, info.min, quotient)
    return np.where(zero, np.where(a < 0, 1, -1), quotient).astype(ptype.dtype)


def remainder(a, b, ptype: PtxType):
    a = np.asarray(a)
    b = np.asarray(b)
    zero = b == 0
    if ptype.is_signed:
        safe = np.where(zero | (b == -1), 1, b).astype(ptype.dtype)
        result = np.where(b == -1, 0, np.fmod(a, safe))
    else:
        safe = np.where(zero, 1, b).astype(ptype.dtype)
        result = a % safe
    return np.where(zero, a, result).astype(ptype.dtype)


@opcode("div", "rem", floating=False)
def _div_rem(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type(_INT - {"b16", "b32", "b64"})
    mods.done()
    fn = divide if instr.opcode == "div" else remainder
    return elementwise(ctx, ptype, [ptype, ptype], lambda a, b: fn(a, b, ptype))


@opcode("abs", "neg", floating=False)
def _abs_neg(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"s16", "s32", "s64"})
    mods.done()
    if instr.opcode == "abs":
        return elementwise(ctx, ptype, [ptype], lambda a: np.abs(np.asarray(a)))
    return elementwise(ctx, ptype, [ptype], lambda a: np.negative(np.asarray(a)))


@opcode("min", "max", floating=False)
def _min_max(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    relu = mods.has("relu")
    packed = _packed_type(mods)
    fn = np.minimum if instr.opcode == "min" else np.maximum
    if packed:
        mods.done()
        if relu and packed != "s16x2":
            raise ctx.error(".relu needs .s16x2 or .s32")
        # .relu clamps each negative half to 0
        half = (lambda a, b: np.maximum(fn(a, b), 0)) if relu else fn
        return elementwise(ctx, _U32, [_U32, _U32], _packed16(packed == "s16x2", half))
    ptype = mods.type(_INT - {"b16", "b32", "b64"})
    mods.done()
    if relu:
        if ptype.name != "s32":
            raise ctx.error(".relu needs .s16x2 or .s32")
        return elementwise(ctx, ptype, [ptype, ptype],
                           lambda a, b: np.maximum(fn(a, b), np.int32(0)))
    return elementwise(ctx, ptype, [ptype, ptype], lambda a, b: fn(a, b))


@opcode("sad")
def _sad(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type(_INT - {"b16", "b32", "b64"})
    mods.done()

    def sad(a, b, c):
        diff = np.where(a > b, np.asarray(a) - b, np.asarray(b) - a)
        return (np.asarray(diff).view(int_dtype(ptype.bits, False)) + np.asarray(c).view(
            int_dtype(ptype.bits, False))).view(ptype.dtype)
    return elementwise(ctx, ptype, [ptype] * 3, sad)


@opcode("popc", "clz")
def _popc_clz(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"b32", "b64"})
    mods.done()
    if instr.opcode == "popc":
        return elementwise(ctx, _U32, [ptype],
                           lambda a: np.bitwise_count(np.asarray(a)).astype(np.uint32))
    bits = ptype.bits
    return elementwise(ctx, _U32, [ptype],
                       lambda a: (bits - bit_length(a)).astype(np.uint32))


_REVERSED_BYTE = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


@opcode("brev")
def _brev(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"b32", "b64"})
    mods.done()
    nbytes = ptype.bits // 8

    def brev(a):
        arr = wrap_scalar(a)
        as_bytes = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, nbytes)[:, ::-1]
        result = np.ascontiguousarray(_REVERSED_BYTE[as_bytes]).view(ptype.dtype).reshape(-1)
        return result if np.ndim(a) else result[0]
    return elementwise(ctx, ptype, [ptype], brev)


@opcode("bfind")
def _bfind(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    shiftamt = mods.has("shiftamt")
    ptype = mods.type({"u32", "s32", "u64", "s64"})
    mods.done()
    bits = ptype.bits

    def bfind(a):
        a = np.asarray(a)
        if ptype.is_signed:
            a = np.where(a < 0, ~a, a)
        length = bit_length(unsigned(a, bits))
        position = length - 1
        if shiftamt:
            position = bits - 1 - position
        return np.where(length == 0, 0xFFFFFFFF, position & 0xFFFFFFFF).astype(np.uint32)
    return elementwise(ctx, _U32, [ptype], bfind)


@opcode("bfe")
def _bfe(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"u32", "s32", "u64", "s64"})
    mods.done()
    bits = ptype.bits
    udt = int_dtype(bits, False)

    def bfe(a, b, c):
        a = np.asarray(a)
        pos = np.asarray(b).astype(np.int64) & 0xFF
        length = np.asarray(c).astype(np.int64) & 0xFF
        shift = np.minimum(pos, bits - 1).astype(udt)
        full = length >= bits
        mask = np.where(full, ~udt.type(0), (udt.type(1) << np.minimum(length, bits - 1)
                                             .astype(udt)) - udt.type(1))
        if not ptype.is_signed:
            field = np.where(pos >= bits, udt.type(0), unsigned(a, bits) >> shift)
            return (field & mask).astype(udt).view(ptype.dtype)
        field = unsigned(a >> shift.astype(ptype.dtype), bits)
        top = np.minimum(pos + length - 1, bits - 1).astype(udt)
        sign = ((unsigned(a, bits) >> top) & udt.type(1)) & (length != 0)
        result = (field & mask) | np.where(sign != 0, ~mask, udt.type(0))
        return np.asarray(result).astype(udt).view(ptype.dtype)
    return elementwise(ctx, ptype, [ptype, _U32, _U32], bfe)


@opcode("bfi")
def _bfi(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"b32", "b64"})
    mods.done()
    bits = ptype.bits
    udt = ptype.dtype
    ones = ~udt.type(0)

    def bfi(f, b, c, d):
        pos = np.asarray(c).astype(np.int64) & 0xFF
        length = np.asarray(d).astype(np.int64) & 0xFF
        field = np.where(length >= bits, ones,
                         (udt.type(1) << np.minimum(length, bits - 1).astype(udt)) - udt.type(1))
        shift = np.minimum(pos, bits - 1).astype(udt)
        mask = np.where(pos >= bits, udt.type(0), field << shift)
        inserted = (np.asarray(f) << shift) & mask
        return np.asarray((np.asarray(b) & ~mask) | inserted).astype(udt)
    return elementwise(ctx, ptype, [ptype, ptype, _U32, _U32], bfi)


_PRMT_MODES = {
    "f4e": lambda s, i: (s + i) & 7,
    "b4e": lambda s, i: (s - i) & 7,
    "rc8": lambda s, i: s,
    "ecl": lambda s, i: np.maximum(s, i),
    "ecr": lambda s, i: np.minimum(s, i),
    "rc16": lambda s, i: (s & 1) * 2 + (i & 1),
}


@opcode("prmt")
def _prmt(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_PRMT_MODES)
    ptype = mods.type({"b32"})
    mods.done()
    u64 = np.uint64

    def prmt(a, b, c):
        pool = np.asarray(a).astype(u64) | (np.asarray(b).astype(u64) << u64(32))
        c = np.asarray(c).astype(np.int64)
        result = np.zeros(np.broadcast(pool, c).shape, np.uint32)
        for i in range(4):
            if mode is None:
                selector = (c >> (4 * i)) & 0xF
                index = selector & 7
                replicate = (selector & 8) != 0
            else:
                index = _PRMT_MODES[mode](c & 3, i)
                replicate = False
            byte = ((pool >> (index * 8).astype(u64)) & u64(0xFF)).astype(np.uint32)
            byte = np.where(replicate, np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0)),
                            byte)
            result |= byte << np.uint32(8 * i)
        return result if result.ndim else result[()]
    return elementwise(ctx, ptype, [ptype] * 3, prmt)


@opcode("shf")
def _shf(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    direction = mods.take("l", "r")
    mode = mods.take("wrap", "clamp")
    ptype = mods.type({"b32"})
    mods.done()
    if direction is None or mode is None:
        raise ctx.error("shf needs .l/.r and .wrap/.clamp")
    u64 = np.uint64

    def shf(a, b, c):
        pair = np.asarray(a).astype(u64) | (np.asarray(b).astype(u64) << u64(32))
        c = np.asarray(c).astype(u64)
        n = c & u64(31) if mode == "wrap" else np.minimum(c, u64(32))
        if direction == "l":
            out = (pair << n) >> u64(32)
        else:
            out = pair >> n
        return (out & u64(0xFFFFFFFF)).astype(np.uint32)
    return elementwise(ctx, ptype, [ptype] * 3, shf)


@opcode("dp4a", "dp2a")
def _dot(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    half = mods.take("lo", "hi") if instr.opcode == "dp2a" else None
    if len(mods.types) != 2 or any(t.name not in ("u32", "s32") for t in mods.types):
        raise ctx.error("expected two .u32/.s32 types")
    ta, tb = mods.types
    mods.types = mods.types[:1]
    mods.done()
    dst = TYPES["s32"] if (ta.is_signed or tb.is_signed) else _U32

    def parts(value, signed, width, count, offset=0):
        value = np.asarray(value).astype(np.int64) & 0xFFFFFFFF
        out = []
        for k in range(count):
            part = (value >> (width * (k + offset))) & ((1 << width) - 1)
            if signed:
                part = np.where(part >= 1 << (width - 1), part - (1 << width), part)
            out.append(part)
        return out

    def dot(a, b, c):
        if instr.opcode == "dp4a":
            pa, pb = parts(a, ta.is_signed, 8, 4), parts(b, tb.is_signed, 8, 4)
        else:
            pa = parts(a, ta.is_signed, 16, 2)
            pb = parts(b, tb.is_signed, 8, 2, 2 if half == "hi" else 0)
        total = np.asarray(c).astype(np.int64)
        for x, y in zip(pa, pb, strict=True):
            total = total + x * y
        return (total & 0xFFFFFFFF).astype(np.uint32).view(dst.dtype)
    return elementwise(ctx, dst, [ta, tb, dst], dot)


@opcode("bmsk")
def _bmsk(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take("clamp", "wrap")
    ptype = mods.type({"b32"})
    mods.done()
    if mode is None:
        raise ctx.error("bmsk needs .clamp or .wrap")
    u64 = np.uint64

    def bmsk(a, b):
        a = np.asarray(a).astype(np.int64)
        b = np.asarray(b).astype(np.int64)
        a1, b1 = a & 31, b & 31
        ones = u64(0xFFFFFFFF)
        mask0 = (ones << a1.astype(u64)) & ones
        total = a1 + b1
        overflow = total >= 32
        mask1 = (ones << np.minimum(total, 32).astype(u64)) & ones
        if mode == "clamp":
            mask0 = np.where(a >= 32, u64(0), mask0)
            overflow = overflow | (a >= 32) | (b >= 32)
        mask1 = np.where(overflow, u64(0), np.where(b1 == 0, ones, mask1))
        return (mask0 & ~mask1 & ones).astype(np.uint32)
    return elementwise(ctx, ptype, [_U32, _U32], bmsk)


@opcode("szext")
def _szext(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take("clamp", "wrap")
    ptype = mods.type({"u32", "s32"})
    mods.done()
    if mode is None:
        raise ctx.error("szext needs .clamp or .wrap")

    def szext(a, b):
        a = np.asarray(a).astype(np.int64) & 0xFFFFFFFF
        b = np.asarray(b).astype(np.int64)
        n = np.minimum(b, 32) if mode == "clamp" else b & 31
        low = np.where(n >= 32, a, a & ((1 << np.minimum(n, 31)) - 1))
        if ptype.is_signed:
            sign = (n > 0) & (n < 32) & (((a >> np.maximum(n - 1, 0)) & 1) != 0)
            low = np.where(sign, low - (1 << np.minimum(n, 31)), low)
        return (low & 0xFFFFFFFF).astype(np.uint32).view(ptype.dtype)
    return elementwise(ctx, ptype, [ptype, _U32], szext)
