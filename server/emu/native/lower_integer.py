"""Integer instructions for the native compiler beyond codegen's core, as the interpreter's
ops_integer and ops_logic have them: the carry chain (add.cc addc sub.cc subc mad.cc
madc), add/sub.sat, mul/mad .hi/.wide on every width (mad.hi.sat), the packed .u16x2/.s16x2
add sub min max (.relu), min/max.relu, mul24 mad24, sad, bfind, bfe, bfi, prmt, shf, lop3,
cnot, dp4a dp2a, bmsk, szext.

The carry flag is one bit per thread, a stack slot (zero at the thread's start, as the
interpreter's); subtraction stores the borrow."""

from __future__ import annotations

from llvmlite import ir

from ..ir import Immediate
from ..ptx_types import TYPES, lookup_type
from .codegen import NotCompiled, ltype

__all__ = ["integer_handlers"]

I1, I16, I32, I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_U32 = TYPES["u32"]


def _types(instr):
    return [t for m in instr.modifiers if (t := lookup_type(m)) is not None]


def _flags(instr, allowed):
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    for flag in flags:
        if flag not in allowed:
            raise NotCompiled(f"{instr.text}: modifier .{flag}", instr.line)
    return set(flags)


def _one_type(instr, names):
    types = _types(instr)
    if len(types) != 1 or types[0].name not in names:
        raise NotCompiled(f"{instr.text}: operand types", instr.line)
    return types[0]


def _read_all(c, instr, ptypes):
    if len(instr.operands) != len(ptypes) + 1:
        raise NotCompiled(f"{instr.text}: operands", instr.line)
    return [c.read(op, t, instr) for op, t in zip(instr.operands[1:], ptypes, strict=True)]


def _c(ty, value):
    return ir.Constant(ty, value)


def _extend(b, value, signed, bits):
    return (b.sext if signed else b.zext)(value, ir.IntType(bits))


# -- the carry flag ------------------------------------------------------------------------------

def _with_carry(c, x, y, carry_in, subtract):
    """(result, carry or borrow out) of x + y + carry_in / x - y - borrow_in (unsigned)."""
    b = c.b
    if subtract:
        partial = b.sub(x, y)
        out = b.icmp_unsigned("<", x, y)
        if carry_in is None:
            return partial, out
        borrow = b.zext(carry_in, x.type)
        return b.sub(partial, borrow), b.or_(out, b.icmp_unsigned("<", partial, borrow))
    partial = b.add(x, y)
    out = b.icmp_unsigned("<", partial, x)
    if carry_in is None:
        return partial, out
    total = b.add(partial, b.zext(carry_in, x.type))
    return total, b.or_(out, b.icmp_unsigned("<", total, partial))


def _chain(c, instr, rtype, x, y, flags, subtract):
    """d = x + y (- for subtract) with the carry in (addc subc madc) and out (.cc)."""
    b = c.b
    uses_carry = instr.opcode in ("addc", "subc", "madc")
    carry_in = b.load(c.carry) if uses_carry else None
    result, carry = _with_carry(c, x, y, carry_in, subtract)
    c.write(instr.operands[0], rtype, result, instr)
    if "cc" in flags:
        b.store(carry, c.carry)


def _clamp_s32(b, wide):
    """An i64 clamped to the s32 range, as an i32 (.sat)."""
    low, high = _c(I64, -2**31), _c(I64, 2**31 - 1)
    wide = b.select(b.icmp_signed("<", wide, low), low, wide)
    return b.trunc(b.select(b.icmp_signed(">", wide, high), high, wide), I32)


def _integer_forms(original):
    """Decorate a handler of an opcode's integer forms; its float forms go to `original`."""
    def wrap(handler):
        def dispatch(c, instr):
            types = _types(instr)
            if types and types[0].kind == "f":
                return original(c, instr)
            return handler(c, instr, types)
        return dispatch
    return wrap


# -- add/sub -----------------------------------------------------------------------------------

_INT = {"s16", "u16", "s32", "u32", "s64", "u64", "b16", "b32", "b64"}


def _packed(c, instr, signed, fn):
    """fn on each 16-bit half of two words (each half widened to i32 and wrapped back)."""
    a, b_ = _read_all(c, instr, [_U32, _U32])
    b = c.b
    out = _c(I32, 0)
    for shift in (0, 16):
        x, y = (_extend(b, b.trunc(b.lshr(v, _c(I32, shift)), I16), signed, 32) for v in (a, b_))
        half = b.and_(fn(b, x, y), _c(I32, 0xFFFF))
        out = b.or_(out, b.shl(half, _c(I32, shift)))
    c.write(instr.operands[0], _U32, out, instr)


def _add_sub(original, subtract):
    @_integer_forms(original)
    def handler(c, instr, types):
        uses_carry = instr.opcode in ("addc", "subc")
        flags = _flags(instr, ("sat", "cc", "s16x2", "u16x2"))
        packed = flags & {"s16x2", "u16x2"}
        if packed:
            if flags - packed or types:
                raise NotCompiled(instr.text, instr.line)
            _packed(c, instr, "s16x2" in packed,
                    (lambda b, x, y: b.sub(x, y)) if subtract else (lambda b, x, y: b.add(x, y)))
            return None
        if not flags and not uses_carry:
            return original(c, instr)
        ptype = _one_type(instr, _INT)
        x, y = _read_all(c, instr, [ptype, ptype])
        b = c.b
        if "sat" in flags:
            if ptype.name != "s32" or "cc" in flags or uses_carry:
                raise NotCompiled(instr.text, instr.line)
            wide = (b.sub if subtract else b.add)(b.sext(x, I64), b.sext(y, I64))
            c.write(instr.operands[0], ptype, _clamp_s32(b, wide), instr)
            return None
        _chain(c, instr, ptype, x, y, flags, subtract)
        return None
    return handler


# -- mul/mad -----------------------------------------------------------------------------------

def _product_type(ptype, mode):
    if mode == "wide":
        return TYPES[f"{'s' if ptype.is_signed else 'u'}{2 * ptype.bits}"]
    return ptype


def _product(b, x, y, ptype, mode):
    """mul's .lo/.hi/.wide."""
    if mode == "lo":
        return b.mul(x, y)
    bits = ptype.bits
    wide = b.mul(_extend(b, x, ptype.is_signed, 2 * bits), _extend(b, y, ptype.is_signed,
                                                                    2 * bits))
    if mode == "wide":
        return wide
    return b.trunc(b.lshr(wide, _c(wide.type, bits)), ltype(ptype))


def _mul_mad(original, is_mad):
    @_integer_forms(original)
    def handler(c, instr, types):
        uses_carry = instr.opcode == "madc"
        flags = _flags(instr, ("lo", "hi", "wide", "cc", "sat"))
        ptype = _one_type(instr, _INT)
        mode = next((m for m in ("lo", "hi", "wide") if m in flags), "lo")
        if mode == "wide" and ptype.bits == 64:
            raise NotCompiled(instr.text, instr.line)
        b = c.b
        if not is_mad:
            if flags & {"cc", "sat"}:
                raise NotCompiled(instr.text, instr.line)
            x, y = _read_all(c, instr, [ptype, ptype])
            c.write(instr.operands[0], _product_type(ptype, mode), _product(b, x, y, ptype, mode),
                    instr)
            return None
        rtype = _product_type(ptype, mode)
        x, y, z = _read_all(c, instr, [ptype, ptype, rtype])
        if "sat" in flags:
            if ptype.name != "s32" or mode != "hi" or "cc" in flags or uses_carry:
                raise NotCompiled(instr.text, instr.line)
            full = b.ashr(b.mul(b.sext(x, I64), b.sext(y, I64)), _c(I64, 32))
            c.write(instr.operands[0], ptype, _clamp_s32(b, b.add(full, b.sext(z, I64))), instr)
            return None
        value = _product(b, x, y, ptype, mode)
        if not ({"cc"} & flags or uses_carry):
            c.write(instr.operands[0], rtype, b.add(value, z), instr)
            return None
        _chain(c, instr, rtype, value, z, flags, False)
        return None
    return handler


def _mul24(c, instr):
    flags = _flags(instr, ("lo", "hi"))
    ptype = _one_type(instr, ("u32", "s32"))
    count = 3 if instr.opcode == "mad24" else 2
    args = _read_all(c, instr, [ptype] * count)
    b = c.b
    signed = ptype.is_signed

    def low24(v):
        if signed:
            return b.ashr(b.shl(b.sext(v, I64), _c(I64, 40)), _c(I64, 40))
        return b.and_(b.zext(v, I64), _c(I64, 0xFFFFFF))
    full = b.mul(low24(args[0]), low24(args[1]))
    if "hi" in flags:
        full = b.ashr(full, _c(I64, 16))
    value = b.trunc(full, I32)
    if count == 3:
        value = b.add(value, args[2])
    c.write(instr.operands[0], ptype, value, instr)


def _min_max(original, is_min):
    @_integer_forms(original)
    def handler(c, instr, types):
        flags = _flags(instr, ("relu", "s16x2", "u16x2"))
        if not flags:
            return original(c, instr)
        b = c.b

        def pick(x, y, signed):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<" if is_min else ">", x, y), x, y)

        def relu(v):
            return b.select(b.icmp_signed("<", v, _c(v.type, 0)), _c(v.type, 0), v)
        packed = flags & {"s16x2", "u16x2"}
        if packed:
            signed = "s16x2" in packed
            if types or ("relu" in flags and not signed):
                raise NotCompiled(instr.text, instr.line)
            if "relu" in flags:
                _packed(c, instr, True, lambda _, x, y: relu(pick(x, y, True)))
            else:
                _packed(c, instr, signed, lambda _, x, y: pick(x, y, signed))
            return None
        ptype = _one_type(instr, ("s32",))
        x, y = _read_all(c, instr, [ptype, ptype])
        c.write(instr.operands[0], ptype, relu(pick(x, y, True)), instr)
        return None
    return handler


def _sad(c, instr):
    _flags(instr, ())
    ptype = _one_type(instr, ("s16", "u16", "s32", "u32", "s64", "u64"))
    x, y, z = _read_all(c, instr, [ptype] * 3)
    b = c.b
    cmp = b.icmp_signed if ptype.is_signed else b.icmp_unsigned
    diff = b.select(cmp(">", x, y), b.sub(x, y), b.sub(y, x))
    c.write(instr.operands[0], ptype, b.add(diff, z), instr)


# -- bit fields --------------------------------------------------------------------------------

def _bfind(c, instr):
    flags = _flags(instr, ("shiftamt",))
    ptype = _one_type(instr, ("u32", "s32", "u64", "s64"))
    (x,) = _read_all(c, instr, [ptype])
    b = c.b
    if ptype.is_signed:
        x = b.select(b.icmp_signed("<", x, _c(x.type, 0)), b.not_(x), x)
    ctlz = c.module.globals.get(f"llvm.ctlz.{x.type}") or ir.Function(
        c.module, ir.FunctionType(x.type, [x.type, I1]), f"llvm.ctlz.{x.type}")
    zeros = b.call(ctlz, [x, _c(I1, 0)])
    length = b.sub(_c(x.type, ptype.bits), zeros)
    position = b.sub(length, _c(x.type, 1))
    if "shiftamt" in flags:
        position = b.sub(_c(x.type, ptype.bits - 1), position)
    position = b.trunc(position, I32) if ptype.bits == 64 else position
    none = b.icmp_unsigned("==", length, _c(x.type, 0))
    c.write(instr.operands[0], _U32, b.select(none, _c(I32, 0xFFFFFFFF), position), instr)


def _field_mask(b, length, bits, ty):
    """Ones in the low `length` bits (all of them when length >= bits)."""
    full = b.icmp_unsigned(">=", length, _c(ty, bits))
    clamped = b.select(full, _c(ty, bits - 1), length)
    return b.select(full, _c(ty, -1), b.sub(b.shl(_c(ty, 1), clamped), _c(ty, 1)))


def _field(b, pos, length, bits, ty):
    """(position, length, shift): the low 8 bits of the u32 operands as `ty`, and the
    position clamped to bits - 1 as a shift amount."""
    pos, length = (b.and_(v, _c(I32, 0xFF)) for v in (pos, length))
    if bits == 64:
        pos, length = b.zext(pos, ty), b.zext(length, ty)
    shift = b.select(b.icmp_unsigned(">", pos, _c(ty, bits - 1)), _c(ty, bits - 1), pos)
    return pos, length, shift


def _bfe(c, instr):
    _flags(instr, ())
    ptype = _one_type(instr, ("u32", "s32", "u64", "s64"))
    a, pos, length = _read_all(c, instr, [ptype, _U32, _U32])
    b = c.b
    bits = ptype.bits
    ty = a.type
    pos, length, shift = _field(b, pos, length, bits, ty)
    mask = _field_mask(b, length, bits, ty)
    if not ptype.is_signed:
        field = b.select(b.icmp_unsigned(">=", pos, _c(ty, bits)), _c(ty, 0), b.lshr(a, shift))
        c.write(instr.operands[0], ptype, b.and_(field, mask), instr)
        return
    field = b.ashr(a, shift)
    top = b.sub(b.add(pos, length), _c(ty, 1))
    top = b.select(b.icmp_unsigned(">", top, _c(ty, bits - 1)), _c(ty, bits - 1), top)
    sign = b.and_(b.trunc(b.lshr(a, top), I1), b.icmp_unsigned("!=", length, _c(ty, 0)))
    result = b.or_(b.and_(field, mask), b.select(sign, b.not_(mask), _c(ty, 0)))
    c.write(instr.operands[0], ptype, result, instr)


def _bfi(c, instr):
    _flags(instr, ())
    ptype = _one_type(instr, ("b32", "b64"))
    f, base, pos, length = _read_all(c, instr, [ptype, ptype, _U32, _U32])
    b = c.b
    bits = ptype.bits
    ty = f.type
    pos, length, shift = _field(b, pos, length, bits, ty)
    field = _field_mask(b, length, bits, ty)
    mask = b.select(b.icmp_unsigned(">=", pos, _c(ty, bits)), _c(ty, 0), b.shl(field, shift))
    inserted = b.and_(b.shl(f, shift), mask)
    c.write(instr.operands[0], ptype, b.or_(b.and_(base, b.not_(mask)), inserted), instr)


_PRMT_MODES = ("f4e", "b4e", "rc8", "ecl", "ecr", "rc16")


def _prmt(c, instr):
    flags = _flags(instr, _PRMT_MODES)
    _one_type(instr, ("b32",))
    mode = next(iter(flags), None)
    a, b_, selector = _read_all(c, instr, [TYPES["b32"]] * 3)
    b = c.b
    pool = b.or_(b.zext(a, I64), b.shl(b.zext(b_, I64), _c(I64, 32)))
    result = _c(I32, 0)
    s = b.and_(selector, _c(I32, 3))
    for i in range(4):
        replicate = None
        if mode is None:
            nibble = b.and_(b.lshr(selector, _c(I32, 4 * i)), _c(I32, 0xF))
            index = b.and_(nibble, _c(I32, 7))
            replicate = b.icmp_unsigned("!=", b.and_(nibble, _c(I32, 8)), _c(I32, 0))
        elif mode == "f4e":
            index = b.and_(b.add(s, _c(I32, i)), _c(I32, 7))
        elif mode == "b4e":
            index = b.and_(b.sub(s, _c(I32, i)), _c(I32, 7))
        elif mode == "rc8":
            index = s
        elif mode in ("ecl", "ecr"):
            smaller = b.icmp_unsigned("<", s, _c(I32, i))
            index = b.select(smaller, _c(I32, i), s) if mode == "ecl" else \
                b.select(smaller, s, _c(I32, i))
        else:
            index = b.add(b.mul(b.and_(s, _c(I32, 1)), _c(I32, 2)), _c(I32, i & 1))
        byte = b.trunc(b.lshr(pool, b.zext(b.mul(index, _c(I32, 8)), I64)), I32)
        byte = b.and_(byte, _c(I32, 0xFF))
        if replicate is not None:
            fill = b.select(b.icmp_unsigned("!=", b.and_(byte, _c(I32, 0x80)), _c(I32, 0)),
                            _c(I32, 0xFF), _c(I32, 0))
            byte = b.select(replicate, fill, byte)
        result = b.or_(result, b.shl(byte, _c(I32, 8 * i)))
    c.write(instr.operands[0], TYPES["b32"], result, instr)


def _shf(c, instr):
    flags = _flags(instr, ("l", "r", "wrap", "clamp"))
    _one_type(instr, ("b32",))
    if not (flags & {"l", "r"}) or not (flags & {"wrap", "clamp"}):
        raise NotCompiled(instr.text, instr.line)
    a, b_, amount = _read_all(c, instr, [TYPES["b32"]] * 3)
    b = c.b
    pair = b.or_(b.zext(a, I64), b.shl(b.zext(b_, I64), _c(I64, 32)))
    n = b.zext(amount, I64)
    if "wrap" in flags:
        n = b.and_(n, _c(I64, 31))
    else:
        n = b.select(b.icmp_unsigned(">", n, _c(I64, 32)), _c(I64, 32), n)
    out = b.lshr(b.shl(pair, n), _c(I64, 32)) if "l" in flags else b.lshr(pair, n)
    c.write(instr.operands[0], TYPES["b32"], b.trunc(out, I32), instr)


def _lop3(c, instr):
    _flags(instr, ())
    _one_type(instr, ("b32",))
    if len(instr.operands) != 5 or not isinstance(instr.operands[4], Immediate):
        raise NotCompiled(instr.text, instr.line)
    lut = int(instr.operands[4].value) & 0xFF
    b32 = TYPES["b32"]
    a, b_, cc = (c.read(o, b32, instr) for o in instr.operands[1:4])
    b = c.b
    result = _c(I32, 0)
    for k in range(8):
        if lut >> k & 1:
            term = b.and_(a if 0xF0 >> k & 1 else b.not_(a), b_ if 0xCC >> k & 1 else b.not_(b_))
            result = b.or_(result, b.and_(term, cc if 0xAA >> k & 1 else b.not_(cc)))
    c.write(instr.operands[0], b32, result, instr)


def _cnot(c, instr):
    _flags(instr, ())
    ptype = _one_type(instr, _INT)
    (x,) = _read_all(c, instr, [ptype])
    value = c.b.zext(c.b.icmp_unsigned("==", x, _c(x.type, 0)), x.type)
    c.write(instr.operands[0], ptype, value, instr)


def _dot(c, instr):
    flags = _flags(instr, ("lo", "hi") if instr.opcode == "dp2a" else ())
    types = _types(instr)
    if len(types) != 2 or any(t.name not in ("u32", "s32") for t in types):
        raise NotCompiled(instr.text, instr.line)
    ta, tb = types
    dst = TYPES["s32"] if (ta.is_signed or tb.is_signed) else _U32
    a, b_, z = _read_all(c, instr, [ta, tb, dst])
    b = c.b

    def parts(v, signed, width, count, offset=0):
        out = []
        for k in range(count):
            piece = b.trunc(b.lshr(v, _c(I32, width * (k + offset))), ir.IntType(width))
            out.append(_extend(b, piece, signed, 32))
        return out
    if instr.opcode == "dp4a":
        pa, pb = parts(a, ta.is_signed, 8, 4), parts(b_, tb.is_signed, 8, 4)
    else:
        pa = parts(a, ta.is_signed, 16, 2)
        pb = parts(b_, tb.is_signed, 8, 2, 2 if "hi" in flags else 0)
    total = z
    for x, y in zip(pa, pb, strict=True):
        total = b.add(total, b.mul(x, y))
    c.write(instr.operands[0], dst, total, instr)


def _bmsk(c, instr):
    flags = _flags(instr, ("clamp", "wrap"))
    _one_type(instr, ("b32",))
    if not flags:
        raise NotCompiled(instr.text, instr.line)
    a, b_ = _read_all(c, instr, [_U32, _U32])
    b = c.b
    a64, b64 = b.zext(a, I64), b.zext(b_, I64)
    a1, b1 = b.and_(a64, _c(I64, 31)), b.and_(b64, _c(I64, 31))
    ones = _c(I64, 0xFFFFFFFF)
    mask0 = b.and_(b.shl(ones, a1), ones)
    total = b.add(a1, b1)
    overflow = b.icmp_unsigned(">=", total, _c(I64, 32))
    capped = b.select(overflow, _c(I64, 32), total)
    mask1 = b.and_(b.select(b.icmp_unsigned("==", capped, _c(I64, 32)), _c(I64, 0),
                            b.shl(ones, capped)), ones)
    if "clamp" in flags:
        big_a = b.icmp_unsigned(">=", a64, _c(I64, 32))
        mask0 = b.select(big_a, _c(I64, 0), mask0)
        overflow = b.or_(overflow, b.or_(big_a, b.icmp_unsigned(">=", b64, _c(I64, 32))))
    mask1 = b.select(overflow, _c(I64, 0),
                     b.select(b.icmp_unsigned("==", b1, _c(I64, 0)), ones, mask1))
    result = b.and_(b.and_(mask0, b.not_(mask1)), ones)
    c.write(instr.operands[0], _U32, b.trunc(result, I32), instr)


def _szext(c, instr):
    flags = _flags(instr, ("clamp", "wrap"))
    ptype = _one_type(instr, ("u32", "s32"))
    if not flags:
        raise NotCompiled(instr.text, instr.line)
    a, n = _read_all(c, instr, [ptype, _U32])
    b = c.b
    a64 = b.zext(a, I64)
    n64 = b.zext(n, I64)
    if "clamp" in flags:
        n64 = b.select(b.icmp_unsigned(">", n64, _c(I64, 32)), _c(I64, 32), n64)
    else:
        n64 = b.and_(n64, _c(I64, 31))
    width = b.select(b.icmp_unsigned(">", n64, _c(I64, 31)), _c(I64, 31), n64)
    full = b.icmp_unsigned(">=", n64, _c(I64, 32))
    low = b.select(full, a64, b.and_(a64, b.sub(b.shl(_c(I64, 1), width), _c(I64, 1))))
    if ptype.is_signed:
        top = b.select(b.icmp_unsigned(">", n64, _c(I64, 0)), b.sub(n64, _c(I64, 1)),
                       _c(I64, 0))
        negative = b.and_(b.and_(b.icmp_unsigned(">", n64, _c(I64, 0)), b.not_(full)),
                          b.trunc(b.lshr(a64, top), I1))
        low = b.select(negative, b.sub(low, b.shl(_c(I64, 1), width)), low)
    c.write(instr.operands[0], ptype, b.trunc(low, I32), instr)


def integer_handlers(existing: dict) -> dict:
    """The handlers this module adds or extends, given the compiler's table."""
    return {
        "add": _add_sub(existing["add"], False), "sub": _add_sub(existing["sub"], True),
        "addc": _add_sub(existing["add"], False), "subc": _add_sub(existing["sub"], True),
        "mul": _mul_mad(existing["mul"], False), "mad": _mul_mad(existing["mad"], True),
        "madc": _mul_mad(existing["mad"], True),
        "min": _min_max(existing["min"], True), "max": _min_max(existing["max"], False),
        "mul24": _mul24, "mad24": _mul24, "sad": _sad, "bfind": _bfind, "bfe": _bfe,
        "bfi": _bfi, "prmt": _prmt, "shf": _shf, "lop3": _lop3, "cnot": _cnot,
        "dp4a": _dot, "dp2a": _dot, "bmsk": _bmsk, "szext": _szext,
    }
