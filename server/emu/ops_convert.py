"""cvt: conversions between every integer and float type.

- integer -> integer: truncation or sign/zero extension; `.sat` clamps to the destination.
- float -> integer: needs `.rni .rzi .rmi .rpi`; always saturates (NaN -> 0), as PTX says.
- integer -> float and narrowing float -> float: `.rn .rz .rm .rp`, exact (64-bit integers
  are split in two halves whose float sum is rounded once, see `float_rounding`).
- float -> same float with `.rni` etc. rounds to an integral value; `.sat` clamps to [0, 1];
  `.ftz` flushes f32 subnormals.
- f16/bf16 are IEEE half / bfloat16 bit patterns; `cvt.rn.f16x2.f32 d, a, b` packs
  cvt(a) into the upper and cvt(b) into the lower half.
"""

from __future__ import annotations

import numpy as np

from . import float_rounding as fr
from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ops_common import elementwise
from .ops_float import flush, saturate
from .ptx_types import TYPES, PtxType
from .tf32_convert import tf32_conversion

__all__: list[str] = []

_INTEGER_ROUNDING = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}
_HALF = ("f16", "bf16")


def _is_int(ptype: PtxType) -> bool:
    return ptype.kind in ("s", "u", "b")


def to_f64(value, ptype: PtxType, ftz: bool = False) -> np.ndarray:
    """A float operand as float64 values (exact)."""
    if ptype.name == "f16":
        return fr.f16_bits_to_f64(value)
    if ptype.name == "bf16":
        return fr.bf16_bits_to_f32(value).astype(np.float64)
    if ftz and ptype.name == "f32":
        value = flush(value)
    return np.asarray(value).astype(np.float64)


def from_f64(value, err, ptype: PtxType, mode: str, ftz: bool = False):
    """float64 `value` with error sign `err` rounded to float `ptype` in `mode`."""
    if ptype.name == "f64":
        return fr.finish(value, err, np.float64, mode).astype(np.float64)
    odd = fr.round_to_odd(value, err)
    if ptype.name == "f16":
        return fr.f64_to_f16_bits(odd, mode)
    if ptype.name == "bf16":
        return fr.f64_to_bf16_bits(odd, mode)
    result = fr.round_f64(odd, np.float32, mode).astype(np.float32)
    return flush(result) if ftz else result


def _int_to_f64_parts(value, ptype: PtxType):
    """An integer operand as an exact float64 pair (high part, low part)."""
    value = np.asarray(value)
    if ptype.bits <= 32:
        return value.astype(np.float64), np.zeros(value.shape)
    if ptype.is_signed:
        high = (value.view(np.int64) >> np.int64(32)).astype(np.float64) * 2.0 ** 32
    else:
        high = (value.view(np.uint64) >> np.uint64(32)).astype(np.float64) * 2.0 ** 32
    low = (value.view(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return fr.two_sum(high, low)


def _int_limits(ptype: PtxType) -> tuple[int, int]:
    info = np.iinfo(TYPES[f"{'s' if ptype.is_signed else 'u'}{ptype.bits}"].dtype)
    return int(info.min), int(info.max)


def _float_to_int(dtype: PtxType, round_fn):
    low, high = _int_limits(dtype)
    target = np.dtype(f"{'int' if dtype.is_signed else 'uint'}{dtype.bits}")

    def convert(values: np.ndarray) -> np.ndarray:
        r = round_fn(values)
        nan = np.isnan(r)
        too_high = r >= float(high) + 1 if high < 2**53 else r >= float(high)
        too_low = r < float(low)
        safe = np.where(nan | too_high | too_low, 0.0, r)
        out = safe.astype(np.int64 if dtype.is_signed or dtype.bits < 64 else np.uint64)
        out = np.where(too_high, high, np.where(too_low, low, out))
        return np.asarray(out).astype(target).view(dtype.dtype)
    return convert


def _int_to_int(dtype: PtxType, atype: PtxType, sat: bool):
    src = np.dtype(f"{'int' if atype.is_signed else 'uint'}{atype.bits}")
    dst = np.dtype(f"{'int' if dtype.is_signed else 'uint'}{dtype.bits}")
    low, high = _int_limits(dtype)

    def convert(a):
        a = np.asarray(a).view(src)
        if sat:
            if atype.is_signed and low == 0:
                a = np.where(a < 0, 0, a).astype(src)
            if high < int(np.iinfo(src).max):
                a = np.where(a > src.type(high), src.type(high), a).astype(src)
            if atype.is_signed and low > int(np.iinfo(src).min):
                a = np.where(a < src.type(low), src.type(low), a).astype(src)
        return a.astype(dst).view(dtype.dtype)
    return convert


def conversion(ctx, dtype: PtxType, atype: PtxType, irnd, frnd, ftz: bool, sat: bool):
    if _is_int(dtype) and _is_int(atype):
        if irnd or frnd:
            raise ctx.error("integer to integer conversions take no rounding modifier")
        return _int_to_int(dtype, atype, sat)
    if _is_int(dtype):
        if irnd is None:
            raise ctx.error("float to integer conversions need .rni, .rzi, .rmi or .rpi")
        to_int = _float_to_int(dtype, _INTEGER_ROUNDING[irnd])
        return lambda a: to_int(to_f64(a, atype, ftz))
    if _is_int(atype):
        if frnd is None:
            raise ctx.error("integer to float conversions need .rn, .rz, .rm or .rp")

        def int_to_float(a):
            value, err = _int_to_f64_parts(a, atype)
            result = from_f64(value, err, dtype, frnd, ftz)
            return saturate(result) if sat and dtype.name in ("f32", "f64") else result
        return int_to_float
    # float -> float
    if irnd is not None:
        if dtype != atype:
            raise ctx.error("rounding to an integral value needs equal types")
        round_fn = _INTEGER_ROUNDING[irnd]

        def integral(a):
            values = to_f64(a, atype, ftz)
            return from_f64(round_fn(values), 0.0, dtype, "rn", ftz)
        fn = integral
    else:
        narrowing = dtype.bits < atype.bits or (dtype.name in _HALF and atype.name in _HALF
                                                and dtype != atype)
        if narrowing and frnd is None:
            raise ctx.error("narrowing float conversions need .rn, .rz, .rm or .rp")

        def float_to_float(a):
            return from_f64(to_f64(a, atype, ftz), 0.0, dtype, frnd or "rn", ftz)
        fn = float_to_float
    if not sat:
        return fn
    if dtype.name in _HALF:
        def saturated_half(a):
            values = to_f64(fn(a), dtype)
            return from_f64(np.where(np.isnan(values), 0.0, np.clip(values, 0.0, 1.0)), 0.0,
                            dtype, "rn")
        return saturated_half
    return lambda a: saturate(fn(a))


@opcode("cvt")
def _cvt(instr, ctx: CompileContext):
    if "tf32" in instr.modifiers:
        return tf32_conversion(instr, ctx)
    mods = Modifiers(ctx)
    irnd = mods.take(*_INTEGER_ROUNDING)
    frnd = mods.take("rn", "rz", "rm", "rp")
    ftz = mods.has("ftz")
    sat = mods.has("sat")
    relu = mods.has("relu")
    if len(mods.types) != 2:
        raise ctx.error("cvt needs a destination and a source type")
    dtype, atype = mods.types
    mods.types = [dtype]
    mods.done()
    if dtype.name in ("f16x2", "bf16x2"):
        return _pack_pair(instr, ctx, dtype, atype, frnd, relu, sat)
    if relu:
        raise ctx.error(".relu applies to f16/bf16 destinations only")
    return elementwise(ctx, dtype, [atype], conversion(ctx, dtype, atype, irnd, frnd, ftz, sat))


def _pack_pair(instr, ctx, dtype: PtxType, atype: PtxType, frnd, relu: bool, sat: bool):
    if atype.name != "f32" or frnd is None:
        raise ctx.error("packing conversions take .f32 sources and a rounding modifier")
    half = TYPES[dtype.name[:-2]]
    ctx.operand_count(3)
    write = writer(instr.operands[0], dtype, ctx)
    ra = reader(instr.operands[1], atype, ctx)
    rb = reader(instr.operands[2], atype, ctx)

    def convert(value):
        value = np.asarray(value, np.float64)
        if relu:
            value = np.where(np.isnan(value), value, np.maximum(value, 0.0))
        if sat:
            value = np.where(np.isnan(value), 0.0, np.clip(value, 0.0, 1.0))
        return from_f64(value, 0.0, half, frnd).astype(np.uint32)

    def run(state, lanes):
        high = convert(ra(state, lanes))
        low = convert(rb(state, lanes))
        write(state, lanes, (high << np.uint32(16)) | low)
    return ctx.op(run)
