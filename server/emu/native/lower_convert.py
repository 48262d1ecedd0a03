"""cvt for the native compiler, as the interpreter's ops_convert: integer <-> integer (with
.sat), float -> integer (.rni .rzi .rmi .rpi, saturating, NaN -> 0), integer -> float and
float -> float in every rounding mode, .ftz, .sat, f16/bf16 and the packing f16x2/bf16x2
forms (.relu), and .tf32 (.satfinite). Every float value passes through float64, where it is
exact."""

from __future__ import annotations

from llvmlite import ir

from ..ptx_types import lookup_type
from .codegen import NotCompiled, ltype
from .rounding import (
    F32,
    F64,
    I32,
    I64,
    directed,
    flush,
    half_to_f64,
    round_to_half,
    saturate,
    to_odd,
)

__all__ = ["convert_handlers"]

_TO_INTEGRAL = {"rni": "llvm.roundeven", "rzi": "llvm.trunc", "rmi": "llvm.floor",
                "rpi": "llvm.ceil"}
_MODES = ("rn", "rz", "rm", "rp")
_HALVES = ("f16", "bf16")


def _integer(ptype) -> bool:
    return ptype.kind in ("s", "u", "b")


def _to_f64(c, value, ptype, ftz):
    """A float operand as an exact float64 (.ftz flushes f32 subnormals first)."""
    b = c.b
    if ptype.name in _HALVES:
        return half_to_f64(b, value, ptype.name)
    if ptype.name == "f32":
        return b.fpext(flush(b, value) if ftz else value, F64)
    return value


def _from_f64(c, value, ptype, mode, ftz):
    """An exact float64 rounded to a float type in `mode`."""
    b = c.b
    if ptype.name in _HALVES:
        return round_to_half(b, value, ptype.name, mode)
    if ptype.name == "f64":
        return value
    result = directed(c, "fptrunc", [value], mode, F32)
    return flush(b, result) if ftz else result


def _int_to_int(c, value, src, dst, sat):
    b = c.b
    if sat:
        low, high = _limits(dst)
        wide = max(src.bits, dst.bits) + 1
        extended = (b.sext if src.is_signed else b.zext)(value, ir.IntType(wide))
        lo, hi = ir.Constant(extended.type, low), ir.Constant(extended.type, high)
        extended = b.select(b.icmp_signed("<", extended, lo), lo, extended)
        extended = b.select(b.icmp_signed(">", extended, hi), hi, extended)
        return b.trunc(extended, ir.IntType(dst.bits))
    if dst.bits > src.bits:
        return (b.sext if src.is_signed else b.zext)(value, ir.IntType(dst.bits))
    if dst.bits < src.bits:
        return b.trunc(value, ir.IntType(dst.bits))
    return value


def _int_to_f64_odd(c, value, src):
    """An integer as a float64 rounded to odd: exact up to 53 bits; a 64-bit one is rounded
    to nearest, and the sign of its error (the integer against the float's own value) goes
    into the last bit, as the interpreter's two halves summed and rounded to odd."""
    b = c.b
    nearest = (b.sitofp if src.is_signed else b.uitofp)(value, F64)
    if src.bits < 64:
        return nearest
    name = "llvm.fptosi.sat" if src.is_signed else "llvm.fptoui.sat"
    back = b.call(c._intrinsic(name, F64, ret=I64), [nearest])
    cmp = b.icmp_signed if src.is_signed else b.icmp_unsigned
    error = b.select(cmp(">", value, back), ir.Constant(F64, 1.0),
                     b.select(cmp("<", value, back), ir.Constant(F64, -1.0),
                              ir.Constant(F64, 0.0)))
    # rounded up to 2**63 (2**64): beyond the integer type, so above the integer
    beyond = b.fcmp_ordered(">=", nearest, ir.Constant(F64, 2.0 ** (63 if src.is_signed
                                                                        else 64)))
    error = b.select(beyond, ir.Constant(F64, -1.0), error)
    return to_odd(b, nearest, error)


def _limits(ptype):
    if ptype.is_signed:
        return -(1 << (ptype.bits - 1)), (1 << (ptype.bits - 1)) - 1
    return 0, (1 << ptype.bits) - 1


def _half_saturate(c, bits, fmt):
    b = c.b
    return round_to_half(b, saturate(b, half_to_f64(b, bits, fmt)), fmt, "rn")


def _tf32(c, instr) -> None:
    """cvt.rna/.rn/.rz{.satfinite}.tf32.f32, as tf32_convert: integer rounding of the f32
    bits to 10 significand bits; NaN -> 0x7FFFFFFF; .satfinite turns an overflow into the
    largest finite tf32."""
    flags = [m for m in instr.modifiers if lookup_type(m) is None and m != "tf32"]
    types = [m for m in instr.modifiers if lookup_type(m) is not None]
    modes = [m for m in flags if m in ("rna", "rn", "rz")]
    if types != ["f32"] or len(modes) != 1 or set(flags) - {modes[0], "satfinite"} \
            or instr.modifiers.count("tf32") != 1 or len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    b = c.b
    bits = c.read(instr.operands[1], lookup_type("b32"), instr)

    def k(value):
        return ir.Constant(I32, value)
    if modes[0] == "rna":
        rounded = b.add(bits, k(0x1000))
    elif modes[0] == "rn":
        rounded = b.add(b.add(bits, k(0xFFF)), b.and_(b.lshr(bits, k(13)), k(1)))
    else:
        rounded = bits
    magnitude = b.and_(bits, k(0x7FFFFFFF))
    special = b.icmp_unsigned(">=", magnitude, k(0x7F800000))
    result = b.and_(b.select(special, bits, rounded), k(~0x1FFF & 0xFFFFFFFF))
    if "satfinite" in flags:
        overflow = b.icmp_unsigned("==", b.and_(result, k(0x7FFFFFFF)), k(0x7F800000))
        result = b.select(overflow, b.or_(b.and_(result, k(0x80000000)), k(0x7F7FE000)),
                          result)
    nan = b.icmp_unsigned(">", magnitude, k(0x7F800000))
    c.write(instr.operands[0], lookup_type("b32"), b.select(nan, k(0x7FFFFFFF), result), instr)


def _cvt(c, instr) -> None:
    if "tf32" in instr.modifiers:
        _tf32(c, instr)
        return
    if "satfinite" in instr.modifiers:
        raise NotCompiled(instr.text, instr.line)
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    types = [lookup_type(m) for m in instr.modifiers if lookup_type(m) is not None]
    irnd = next((m for m in flags if m in _TO_INTEGRAL), None)
    frnd = next((m for m in flags if m in _MODES), None)
    ftz, sat, relu = ("ftz" in flags), ("sat" in flags), ("relu" in flags)
    known = {irnd, frnd, "ftz", "sat", "relu"}
    if any(f not in known for f in flags) or len(types) != 2:
        raise NotCompiled(instr.text, instr.line)
    dst, src = types
    if dst.name in ("f16x2", "bf16x2"):
        _pack_pair(c, instr, dst, src, frnd, relu, sat)
        return
    if relu or len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    b = c.b
    value = c.read(instr.operands[1], src, instr)
    if _integer(dst) and _integer(src):
        if irnd or frnd:
            raise NotCompiled(instr.text, instr.line)
        result = _int_to_int(c, value, src, dst, sat)
    elif _integer(dst):
        if irnd is None or dst.kind == "b":
            raise NotCompiled(instr.text, instr.line)
        rounded = b.call(c._intrinsic(_TO_INTEGRAL[irnd], F64), [_to_f64(c, value, src, ftz)])
        name = "llvm.fptosi.sat" if dst.is_signed else "llvm.fptoui.sat"
        result = b.call(c._intrinsic(name, F64, ret=ltype(dst)), [rounded])
    elif _integer(src):
        if frnd is None or src.kind == "b":
            raise NotCompiled(instr.text, instr.line)
        if src.bits < 32:
            value = (b.sext if src.is_signed else b.zext)(value, I32)
        op = "sitofp" if src.is_signed else "uitofp"
        if dst.name in _HALVES:
            result = round_to_half(b, _int_to_f64_odd(c, value, src), dst.name, frnd)
        else:
            result = directed(c, op, [value], frnd, ltype(dst))
            if ftz and dst.name == "f32":
                result = flush(b, result)
    else:
        wide = _to_f64(c, value, src, ftz)
        if irnd is not None:
            if dst != src:
                raise NotCompiled(instr.text, instr.line)
            wide = b.call(c._intrinsic(_TO_INTEGRAL[irnd], F64), [wide])
            result = _from_f64(c, wide, dst, "rn", ftz)
        else:
            narrowing = dst.bits < src.bits or (dst.name in _HALVES and src.name in _HALVES
                                                and dst != src)
            if narrowing and frnd is None:
                raise NotCompiled(instr.text, instr.line)
            result = _from_f64(c, wide, dst, frnd or "rn", ftz)
    if sat and not _integer(dst):
        if dst.name in _HALVES:
            result = _half_saturate(c, result, dst.name)
        else:
            result = saturate(b, result)
    elif sat and not _integer(src):
        pass   # float -> integer conversions saturate anyway
    c.write(instr.operands[0], dst, result, instr)


def _pack_pair(c, instr, dst, src, frnd, relu, sat) -> None:
    """`cvt.rn.f16x2.f32 d, a, b`: cvt(a) in the upper half, cvt(b) in the lower."""
    if src.name != "f32" or frnd is None or len(instr.operands) != 3:
        raise NotCompiled(instr.text, instr.line)
    fmt = dst.name[:-2]
    b = c.b
    halves = []
    for operand in instr.operands[1:]:
        value = b.fpext(c.read(operand, src, instr), F64)
        if relu:   # numpy's maximum(x, 0): +0 for either zero, NaN kept
            zero = ir.Constant(F64, 0.0)
            value = b.select(b.fcmp_unordered("uno", value, value), value,
                             b.select(b.fcmp_ordered(">", value, zero), value, zero))
        if sat:
            value = saturate(b, value)
        halves.append(b.zext(round_to_half(b, value, fmt, frnd), I32))
    word = b.or_(b.shl(halves[0], ir.Constant(I32, 16)), halves[1])
    c.write(instr.operands[0], dst, word, instr)


def convert_handlers(_existing: dict) -> dict:
    """cvt is lowered here whole."""
    return {"cvt": _cvt}

