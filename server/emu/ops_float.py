"""Floating-point arithmetic: add sub mul fma mad div rcp sqrt rsqrt ex2 lg2 sin cos tanh
abs neg min max copysign testp, for f32 and f64, and add sub mul fma neg abs min max for
f16/bf16 and their packed x2 forms.

Rounding: `.rn` f32/f64 add, sub, mul, div, sqrt and rcp use numpy directly (IEEE
correctly rounded); fma and every directed mode (`.rz .rm .rp`) go through
`float_rounding`, which is exact. `.ftz` flushes f32 subnormal inputs and results to
sign-preserving zero; `.sat` clamps to [0, 1] with NaN -> 0. `.approx` operations (ex2,
lg2, sin, cos, tanh, rsqrt, approx rcp/sqrt/div) are computed accurately in float64 and
rounded: they may differ from the GPU's hardware approximations in the last bits, within
the error bounds the ISA states. min/max return the non-NaN operand when one is NaN
(`.NaN` propagates it) and order -0 below +0. NaN results keep numpy's NaN payload rather
than the GPU's canonical 0x7fffffff.
"""

from __future__ import annotations

import numpy as np

from . import float_rounding as fr
from .isa import CompileContext, Modifiers, opcode
from .ops_common import elementwise
from .ptx_types import TYPES, PtxType

__all__ = ["flush", "half_op", "saturate"]

_F32_TINY = np.float32(np.finfo(np.float32).tiny)
_ROUNDING = ("rn", "rz", "rm", "rp")
_HALF = {"f16", "bf16", "f16x2", "bf16x2"}


def flush(x):
    """f32 subnormals to sign-preserving zero (.ftz)."""
    x = np.asarray(x)
    return np.where((np.abs(x) < _F32_TINY) & (x != 0), np.copysign(np.float32(0), x), x)


def saturate(x):
    x = np.asarray(x)
    return np.where(np.isnan(x), x.dtype.type(0), np.clip(x, 0, 1)).astype(x.dtype)


def _finish_f32(fn, ftz: bool, sat: bool):
    """Wrap an f32 op with .ftz on inputs and result and .sat on the result."""
    if not ftz and not sat:
        return fn

    def wrapped(*args):
        if ftz:
            args = tuple(flush(a) for a in args)
        result = fn(*args)
        if ftz:
            result = flush(result)
        if sat:
            result = saturate(result)
        return result
    return wrapped


# -- half precision plumbing ---------------------------------------------------------------

def _half_codec(ptype: PtxType, mode: str):
    """(decode bits -> float64, encode float64 -> bits) for one f16/bf16 lane."""
    if ptype.name.startswith("bf16"):
        return (lambda b: fr.bf16_bits_to_f32(b).astype(np.float64),
                lambda v: fr.f64_to_bf16_bits(v, mode))
    return fr.f16_bits_to_f64, lambda v: fr.f64_to_f16_bits(v, mode)


def half_op(ptype: PtxType, mode: str, exact_fn):
    """Lift `exact_fn(*float64) -> (value, error sign)` to (packed) half lanes."""
    decode, encode = _half_codec(ptype, mode)

    def one(*bits):
        value, err = exact_fn(*(decode(b) for b in bits))
        return encode(fr.round_to_odd(value, err))
    if not ptype.name.endswith("x2"):
        return lambda *bits: one(*(np.asarray(b, np.uint16) for b in bits))

    def packed(*words):
        words = [np.asarray(w, np.uint32) for w in words]
        low = one(*((w & np.uint32(0xFFFF)).astype(np.uint16) for w in words))
        high = one(*((w >> np.uint32(16)).astype(np.uint16) for w in words))
        return (low.astype(np.uint32) | (high.astype(np.uint32) << np.uint32(16)))
    return packed


def _exact(ptype: PtxType, mode: str, exact_fn, native_fn=None, zero_sum=None,
           divisor: int | None = None):
    """An op on f32/f64 in `mode`: numpy's own arithmetic when it is exact enough.

    `zero_sum(*args)`, for sums (add, sub, fma), gives the result's sign when the exact sum
    is zero while rounding down: IEEE 754 makes it -0 unless both terms are +0, which is
    the negated round-to-nearest sum of the negated terms. `divisor` (div, rcp) is the
    argument whose zero makes the result an exact infinity, which no directed mode turns
    into the largest finite number as it does an overflow."""
    if mode == "rn" and native_fn is not None:
        return native_fn
    dtype = ptype.dtype
    if mode != "rm":
        zero_sum = None

    def fn(*args):
        value, err = exact_fn(*args)
        finite = True
        for a in args:
            finite = finite & np.isfinite(a)
        if divisor is not None:
            finite = finite & (np.asarray(args[divisor]) != 0)
        result = fr.finish(value, err, dtype, mode, finite).astype(dtype)
        if zero_sum is not None:
            exact_zero = (value == 0) & (err == 0)
            if exact_zero.any():
                result = np.where(exact_zero, zero_sum(*args), result).astype(dtype)
        return result
    return fn


@opcode("add", "sub", "mul", floating=True)
def _add_sub_mul(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_ROUNDING) or "rn"
    ftz = mods.has("ftz")
    sat = mods.has("sat")
    ptype = mods.type({"f32", "f64"} | _HALF)
    mods.done()
    name = instr.opcode
    zero_sum = None
    if name == "mul":
        exact = fr.exact_mul
        native = np.multiply
    elif name == "add":
        exact = fr.exact_add
        native = np.add

        def zero_sum(a, b):
            return -((-a) + (-b))
    else:
        def exact(a, b):
            return fr.exact_add(a, -np.asarray(b, np.float64))
        native = np.subtract

        def zero_sum(a, b):
            return -((-a) + b)
    if ptype.name in _HALF:
        fn = half_op(ptype, mode, exact)
        if sat:
            inner = fn
            decode, encode = _half_codec(ptype, "rn")
            fn = _half_sat(ptype, inner, decode, encode)
        return elementwise(ctx, ptype, [ptype, ptype], fn)
    if (ftz or sat) and ptype.name == "f64":
        raise ctx.error(".ftz/.sat apply to f32 only")
    fn = _exact(ptype, mode, exact, lambda a, b: native(a, b), zero_sum)
    return elementwise(ctx, ptype, [ptype, ptype], _finish_f32(fn, ftz, sat))


def _half_lanes(ptype, fn, clamp_one):
    """`fn` (half lanes -> bits) followed by `clamp_one` on each 16-bit result."""
    def wrapped(*args):
        bits = np.asarray(fn(*args))
        if not ptype.name.endswith("x2"):
            return clamp_one(bits)
        low = clamp_one((bits & np.uint32(0xFFFF)).astype(np.uint16)).astype(np.uint32)
        high = clamp_one((bits >> np.uint32(16)).astype(np.uint16)).astype(np.uint32)
        return low | (high << np.uint32(16))
    return wrapped


def _half_sat(ptype, fn, decode, encode):
    def clamp_one(bits):
        return encode(np.where(np.isnan(decode(bits)), 0.0, np.clip(decode(bits), 0.0, 1.0)))
    return _half_lanes(ptype, fn, clamp_one)


_CANONICAL_HALF_NAN = np.uint16(0x7FFF)  # f16 and bf16 alike


def _half_relu(ptype, fn, decode):
    """.relu: negative results (-0 included, as max(x, +0) orders it) become +0, NaN the
    canonical NaN."""
    def clamp_one(bits):
        bits = np.asarray(bits, np.uint16)
        zeroed = np.where(bits & np.uint16(0x8000), np.uint16(0), bits)
        return np.where(np.isnan(decode(bits)), _CANONICAL_HALF_NAN, zeroed).astype(np.uint16)
    return _half_lanes(ptype, fn, clamp_one)


def _fma32(a, b, c):
    product = np.asarray(a, np.float64) * np.asarray(b, np.float64)  # exact for f32 inputs
    return fr.exact_add(product, c)


@opcode("fma", "mad", floating=True)
def _fma(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_ROUNDING)
    ftz = mods.has("ftz")
    sat = mods.has("sat")
    relu = mods.has("relu")
    ptype = mods.type({"f32", "f64"} | _HALF)
    mods.done()
    if mode is None and not (instr.opcode == "mad" and ptype.name == "f32"):
        raise ctx.error("a rounding modifier is required")
    mode = mode or "rn"  # mad.f32 without rounding is fused on sm_20 and later
    if relu and (sat or mode != "rn" or ptype.name not in _HALF):
        raise ctx.error(".relu applies to fma.rn on f16/bf16 (x2) without .sat")
    if ptype.name in _HALF:
        fn = half_op(ptype, mode, fr.exact_fma)
        decode, encode = _half_codec(ptype, "rn")
        if sat:
            fn = _half_sat(ptype, fn, decode, encode)
        if relu:
            fn = _half_relu(ptype, fn, decode)
        return elementwise(ctx, ptype, [ptype] * 3, fn)
    exact = _fma32 if ptype.name == "f32" else fr.exact_fma
    native = fr.fma_f32_nearest if ptype.name == "f32" else None
    fn = _exact(ptype, mode, exact, native, lambda a, b, c: -(((-a) * b) + (-c)))
    return elementwise(ctx, ptype, [ptype] * 3, _finish_f32(fn, ftz, sat))


@opcode("div", floating=True)
def _div(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_ROUNDING)
    approx = mods.take("approx", "full")
    ftz = mods.has("ftz")
    ptype = mods.type({"f32", "f64"})
    mods.done()
    if approx and (mode or ptype.name == "f64"):
        raise ctx.error(".approx/.full apply to f32 without a rounding modifier")
    if not approx and mode is None:
        raise ctx.error("a rounding modifier is required")
    fn = _exact(ptype, mode or "rn", fr.exact_div, lambda a, b: np.divide(a, b), divisor=1)
    return elementwise(ctx, ptype, [ptype, ptype], _finish_f32(fn, ftz, False))


@opcode("rcp", floating=True)
def _rcp(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_ROUNDING)
    approx = mods.has("approx")
    ftz = mods.has("ftz")
    ptype = mods.type({"f32", "f64"})
    mods.done()
    if approx == bool(mode):
        raise ctx.error("rcp needs either .approx or a rounding modifier")
    one = ptype.dtype.type(1)
    fn = _exact(ptype, mode or "rn", lambda a: fr.exact_div(1.0, a),
                lambda a: np.divide(one, a), divisor=0)
    return elementwise(ctx, ptype, [ptype], _finish_f32(fn, ftz and ptype.name == "f32", False))


@opcode("sqrt", floating=True)
def _sqrt(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mode = mods.take(*_ROUNDING)
    approx = mods.has("approx")
    ftz = mods.has("ftz")
    ptype = mods.type({"f32", "f64"})
    mods.done()
    if approx == bool(mode):
        raise ctx.error("sqrt needs either .approx or a rounding modifier")
    fn = _exact(ptype, mode or "rn", fr.exact_sqrt, lambda a: np.sqrt(a))
    return elementwise(ctx, ptype, [ptype], _finish_f32(fn, ftz, False))


def _via_f64(fn, dtype):
    def compute(a):
        return fn(np.asarray(a, np.float64)).astype(dtype)
    return compute


_APPROX = {
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "ex2": np.exp2,
    "lg2": np.log2,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
}

# The NaN an approximate function gives where its argument has no value (lg2 of a negative
# number, sin of an infinity): fixed here, because the sign of the NaN numpy's functions give
# differs between numpy builds and CPUs. The compiler (native/lower_float.py) gives the same.
APPROX_INVALID_NAN = {"lg2": 0x7FF8000000000000, "sin": 0xFFF8000000000000,
                      "cos": 0xFFF8000000000000, "rsqrt": 0xFFF8000000000000,
                      "ex2": 0x7FF8000000000000, "tanh": 0x7FF8000000000000}


def _approx_function(opcode: str):
    """The float64 formula of an approximate function, with APPROX_INVALID_NAN where the
    argument has no value; a NaN argument comes back quieted (tanh: that same NaN)."""
    fn = _APPROX[opcode]
    invalid = np.uint64(APPROX_INVALID_NAN[opcode]).view(np.float64)

    def compute(x):
        x = np.asarray(x, np.float64)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            value = np.asarray(fn(x), np.float64)
        unvalued = np.isnan(value) if opcode == "tanh" else np.isnan(value) & ~np.isnan(x)
        return np.where(unvalued, invalid, value)
    return compute


@opcode(*_APPROX, floating=True)
def _approx(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    if not mods.has("approx"):
        raise ctx.error(".approx is required")
    ftz = mods.has("ftz")
    ptype = mods.type({"f32", "f64", "f16", "bf16", "f16x2", "bf16x2"})
    mods.done()
    if ptype.name == "f64" and instr.opcode != "rsqrt":
        raise ctx.error(f"{instr.opcode} has no .f64 form")
    fn = _approx_function(instr.opcode)
    if ptype.name in _HALF:
        if instr.opcode not in ("ex2", "tanh"):
            raise ctx.error(f"{instr.opcode} has no .{ptype.name} form")
        return elementwise(ctx, ptype, [ptype], half_op(ptype, "rn", lambda x: (fn(x), 0.0)))
    return elementwise(ctx, ptype, [ptype],
                       _finish_f32(_via_f64(fn, ptype.dtype), ftz and ptype.name == "f32",
                                   False))


def _sign_bit(ptype: PtxType):
    bits = ptype.bits if not ptype.name.endswith("x2") else 16
    mask = 1 << (bits - 1)
    if ptype.name.endswith("x2"):
        mask |= mask << 16
    return np.dtype(f"uint{ptype.bits}").type(mask)


@opcode("abs", "neg", floating=True)
def _abs_neg(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ftz = mods.has("ftz")
    ptype = mods.type({"f32", "f64"} | _HALF)
    mods.done()
    sign = _sign_bit(ptype)
    udt = np.dtype(f"uint{ptype.bits}")
    is_abs = instr.opcode == "abs"

    def fn(a):
        if ftz and ptype.name == "f32":
            a = flush(a)
        bits = np.asarray(a).view(udt)
        result = (bits & ~sign) if is_abs else (bits ^ sign)
        return result.view(ptype.dtype)
    return elementwise(ctx, ptype, [ptype], fn)


def _min_max_f(a, b, is_min: bool, propagate_nan: bool):
    a = np.asarray(a)
    b = np.asarray(b)
    if propagate_nan:
        result = np.minimum(a, b) if is_min else np.maximum(a, b)
    else:
        result = np.fmin(a, b) if is_min else np.fmax(a, b)
    both_zero = (a == 0) & (b == 0)
    if both_zero.any():
        negative = (np.signbit(a) | np.signbit(b)) if is_min else (np.signbit(a) & np.signbit(b))
        zero = np.where(negative, -0.0, 0.0).astype(result.dtype)
        result = np.where(both_zero, zero, result)
    return result


@opcode("min", "max", floating=True)
def _min_max(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ftz = mods.has("ftz")
    propagate = mods.has("NaN")
    ptype = mods.type({"f32", "f64"} | _HALF)
    mods.done()
    is_min = instr.opcode == "min"
    if ptype.name in _HALF:
        decode, encode = _half_codec(ptype, "rn")

        def one(x, y):
            return encode(_min_max_f(decode(x), decode(y), is_min, propagate))
        if ptype.name.endswith("x2"):
            def packed(x, y):
                x, y = np.asarray(x, np.uint32), np.asarray(y, np.uint32)
                low = one((x & 0xFFFF).astype(np.uint16), (y & 0xFFFF).astype(np.uint16))
                high = one((x >> 16).astype(np.uint16), (y >> 16).astype(np.uint16))
                return low.astype(np.uint32) | (high.astype(np.uint32) << np.uint32(16))
            return elementwise(ctx, ptype, [ptype, ptype], packed)
        return elementwise(ctx, ptype, [ptype, ptype], one)
    fn = _finish_f32(lambda a, b: _min_max_f(a, b, is_min, propagate),
                     ftz and ptype.name == "f32", False)
    return elementwise(ctx, ptype, [ptype, ptype], fn)


@opcode("copysign", floating=True)
def _copysign(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    ptype = mods.type({"f32", "f64"})
    mods.done()
    return elementwise(ctx, ptype, [ptype, ptype], lambda a, b: np.copysign(b, a))


_TESTP = {
    "finite": np.isfinite,
    "infinite": np.isinf,
    "number": lambda x: ~np.isnan(x),
    "notanumber": np.isnan,
    "normal": lambda x: np.isfinite(x) & (np.abs(x) >= np.finfo(x.dtype).tiny),
    "subnormal": lambda x: (np.abs(x) < np.finfo(x.dtype).tiny) & (x != 0),
}


@opcode("testp", floating=True)
def _testp(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    test = mods.take(*_TESTP)
    ptype = mods.type({"f32", "f64"})
    mods.done()
    if test is None:
        raise ctx.error("testp needs a test (.finite, .nan, ...)")
    fn = _TESTP[test]
    return elementwise(ctx, TYPES["pred"], [ptype], lambda a: fn(np.asarray(a)))
