"""Correctly rounded floating-point arithmetic in every PTX rounding mode, with numpy.

numpy computes in round-to-nearest-even only and has no fused multiply-add. The approach:

- Results are first obtained in float64 together with the sign of their error, using
  error-free transformations (Knuth's TwoSum, Dekker/Veltkamp's TwoProduct, and exact
  remainders for division and square root).
- That pair is folded into one float64 rounded to odd ("sticky" last bit) when the error is
  non-zero. Rounding a round-to-odd value with at least two more bits than the target gives
  the same result as rounding the exact value (Boldo & Melquiond), in every mode, so f32,
  f16 and bf16 results are then rounded from it exactly: nearest by numpy's cast, and
  toward zero / -inf / +inf by comparing the cast with the value and stepping one ulp.
- float64 results in directed modes step the nearest result one ulp according to the sign
  of the error. fma.f64 follows Boldo & Melquiond's emulation (TwoProduct, TwoSum, an odd
  rounding of the low parts, one final addition).
- Lanes outside the range where the transformations are exact (huge or tiny magnitudes,
  infinities) are recomputed with Python's exact `fractions.Fraction`; they are rare.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

__all__ = [
    "f16_bits_to_f64",
    "bf16_bits_to_f32",
    "directed_f64",
    "exact_add",
    "exact_div",
    "exact_fma",
    "exact_mul",
    "exact_sqrt",
    "fma_f32_nearest",
    "f64_to_bf16_bits",
    "f64_to_f16_bits",
    "round_f64",
    "round_to_odd",
]

_F64 = np.float64
_SPLITTER = _F64(134217729.0)  # 2**27 + 1
_SAFE_HIGH = 2.0 ** 995
_SAFE_LOW = 2.0 ** -960


def two_sum(a, b):
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return s, err


def _split(a):
    c = _SPLITTER * a
    high = c - (c - a)
    return high, a - high


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    err = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, err


def round_to_odd(value, err):
    """Fold the sign of `err` (exact - value) into value's last bit (round to odd).

    An inexact value with an even significand moves one ulp toward the exact result (that
    neighbour is odd); on the bit pattern that is +1 away from zero, -1 toward it.
    """
    value = np.asarray(value, _F64)
    err = np.asarray(err, _F64)
    bits = value.view(np.int64)
    step = (err != 0) & ((bits & 1) == 0) & np.isfinite(value)
    if not step.any():
        return value
    away = (err > 0) == (value > 0)
    return (bits + np.where(step, np.where(away, 1, -1), 0)).view(_F64)


def directed_f64(value, err, mode: str):
    """Round-to-nearest `value` with error sign `err`, re-rounded in `mode` (rn rz rm rp)."""
    if mode == "rn":
        return value
    value = np.asarray(value, _F64)
    err = np.asarray(err, _F64)
    if mode == "rm":
        down = err < 0
        return np.where(down, np.nextafter(value, -np.inf), value)
    if mode == "rp":
        up = err > 0
        return np.where(up, np.nextafter(value, np.inf), value)
    toward_zero = ((err < 0) & (value > 0)) | ((err > 0) & (value < 0))
    return np.where(toward_zero, np.nextafter(value, 0.0), value)


def _overflow_fix(result, mode: str, finite_inputs):
    """Directed modes never round a finite exact result to an infinity pointing away."""
    if mode == "rn":
        return result
    over = np.isinf(result) & finite_inputs
    if not over.any():
        return result
    big = np.finfo(np.float64).max
    positive = result > 0
    keep = {"rz": np.zeros_like(positive), "rm": ~positive, "rp": positive}[mode]
    return np.where(over & ~keep, np.where(positive, big, -big), result)


def round_f64(value, dtype, mode: str):
    """A float64 (exact or rounded to odd) rounded to float32/float64 in `mode`."""
    value = np.asarray(value, _F64)
    if np.dtype(dtype) == _F64:
        return value
    result = value.astype(dtype)
    if mode == "rn":
        return result
    back = result.astype(_F64)
    if mode == "rz":
        step = np.abs(back) > np.abs(value)
        target = 0.0
    elif mode == "rm":
        step = back > value
        target = -np.inf
    else:
        step = back < value
        target = np.inf
    if not step.any():
        return result
    return np.where(step, np.nextafter(result, np.asarray(target, dtype)), result)


# -- exact float64 operations returning (nearest result, error sign) -------------------------

def _fraction_lanes(select, fn, *args):
    """Recompute lanes in `select` with exact rationals: (values, error signs)."""
    idx = np.flatnonzero(select)
    values = np.empty(len(idx))
    errors = np.zeros(len(idx))
    for out, k in enumerate(idx):
        exact = fn(*(float(a[k]) if np.ndim(a) else float(a) for a in args))
        if exact is None:
            values[out] = np.nan
            continue
        values[out], errors[out] = _nearest(exact)
    return idx, values, errors


def _nearest(exact: Fraction) -> tuple[float, float]:
    try:
        value = float(exact)
    except OverflowError:
        return (np.inf if exact > 0 else -np.inf), (-1.0 if exact > 0 else 1.0)
    diff = exact - Fraction(value) if np.isfinite(value) else 0
    return value, float(np.sign(diff)) if diff else 0.0


def _patch(result, err, idx, values, errors):
    if len(idx):
        result = np.array(result, _F64, copy=True, ndmin=1)
        err = np.array(err, _F64, copy=True, ndmin=1)
        result[idx] = values
        err[idx] = errors
    return result, err


_F32_TIES = np.uint64((1 << 29) - 1)
_F32_HALF = np.uint64(1 << 28)
_F32_TINY = float(np.finfo(np.float32).tiny)


def fma_f32_nearest(a, b, c) -> np.ndarray:
    """fma.rn.f32: the f32 product is exact in float64; the float64 sum rounds once more,
    which changes the f32 result only when it lands exactly on an f32 halfway point (or
    in the subnormal range): only those lanes need the exact treatment."""
    a, b, c = np.broadcast_arrays(np.asarray(a, _F64), np.asarray(b, _F64),
                                  np.asarray(c, _F64))
    product = a * b
    total = product + c
    result = total.astype(np.float32)
    suspicious = ((total.view(np.uint64) & _F32_TIES) == _F32_HALF) | (np.abs(total) < _F32_TINY)
    if suspicious.any():
        idx = np.flatnonzero(suspicious)
        s, err = two_sum(product[idx], c[idx])
        result = np.array(result, copy=True, ndmin=1)
        result[idx] = round_to_odd(s, err).astype(np.float32)
    return result


def exact_add(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, _F64), np.asarray(b, _F64))
    return two_sum(a, b)


def exact_mul(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, _F64), np.asarray(b, _F64))
    p, err = two_prod(a, b)
    awkward = np.isfinite(p) & ((np.abs(a) > _SAFE_HIGH) | (np.abs(b) > _SAFE_HIGH)
                                | ((np.abs(p) < _SAFE_LOW) & (a != 0) & (b != 0)))
    awkward |= np.isinf(p) & np.isfinite(a) & np.isfinite(b)
    if awkward.any():
        idx, values, errors = _fraction_lanes(
            awkward, lambda x, y: Fraction(x) * Fraction(y), a, b)
        p, err = _patch(p, err, idx, values, errors)
        # A Fraction has no signed zero: a zero product (0 times a huge number) takes the
        # sign IEEE 754 gives every product, the exclusive or of the operands' signs.
        return np.where(p == 0, np.where(np.signbit(a) ^ np.signbit(b), -0.0, 0.0), p), err
    return p, np.where(np.isfinite(p), err, 0.0)


def exact_fma(a, b, c):
    """(nearest a*b+c with a single rounding, error sign)."""
    a, b, c = np.broadcast_arrays(np.asarray(a, _F64), np.asarray(b, _F64),
                                  np.asarray(c, _F64))
    p, pe = two_prod(a, b)
    s, se = two_sum(c, p)
    t, te = two_sum(se, pe)
    v = round_to_odd(t, te)
    result = np.where(v == 0, s, s + v)
    # exact - result: the rounding error of s + v when there is one (it is a multiple of
    # ulp(v), larger than v's own error), else the error of rounding se + pe to odd.
    _, final_err = two_sum(s, v)
    low_err = np.where(te == 0, 0.0, np.where(v == t, te, -te))
    err = np.where(final_err != 0, final_err, low_err)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    awkward = finite & ((np.abs(a) > _SAFE_HIGH) | (np.abs(b) > _SAFE_HIGH)
                        | (np.abs(c) > _SAFE_HIGH)
                        | ((np.abs(p) < _SAFE_LOW) & (a != 0) & (b != 0))
                        | ~np.isfinite(result))
    special = ~finite
    if special.any():
        # IEEE: an infinite addend wins over a finite product; otherwise a*b+c as usual.
        plain = np.where(np.isinf(c) & np.isfinite(a) & np.isfinite(b), c, a * b + c)
        result = np.where(special, plain, result)
        err = np.where(special, 0.0, err)
    if awkward.any():
        idx, values, errors = _fraction_lanes(
            awkward, lambda x, y, z: Fraction(x) * Fraction(y) + Fraction(z), a, b, c)
        result, err = _patch(result, err, idx, values, errors)
        zero = awkward & (result == 0) & (err == 0)
        if zero.any():
            # exact zero (not a tiny result rounded to a signed zero, whose sign is right):
            # -0 only when both the product and the addend are -0
            neg = (np.signbit(a) ^ np.signbit(b)) & np.signbit(c) & (a * b == 0)
            result = np.where(zero, np.where(neg, -0.0, 0.0), result)
    return result, err


def exact_div(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, _F64), np.asarray(b, _F64))
    q = a / b
    ph, pl = two_prod(q, b)
    remainder = (a - ph) - pl
    err = np.where(np.isfinite(q) & (b != 0), np.sign(remainder) * np.sign(b), 0.0)
    awkward = (np.isfinite(q) & (a != 0) & np.isfinite(a) & np.isfinite(b)
               & ((np.abs(b) > _SAFE_HIGH) | (np.abs(q) > _SAFE_HIGH) | (np.abs(q) < _SAFE_LOW)
                  | (np.abs(a) < _SAFE_LOW)))
    awkward |= np.isinf(q) & np.isfinite(a) & np.isfinite(b) & (b != 0)
    if awkward.any():
        idx, values, errors = _fraction_lanes(
            awkward, lambda x, y: Fraction(x) / Fraction(y), a, b)
        return _patch(q, err, idx, values, errors)
    return q, err


def exact_sqrt(a):
    a = np.asarray(a, _F64)
    # Scale tiny and huge inputs by an even power of two so TwoProduct stays exact; the
    # square root scales by half that power, exactly (results are always normal numbers).
    scale = np.where(a < _SAFE_LOW, 2.0 ** 600, np.where(a > _SAFE_HIGH, 2.0 ** -600, 1.0))
    unscale = np.where(a < _SAFE_LOW, 2.0 ** -300, np.where(a > _SAFE_HIGH, 2.0 ** 300, 1.0))
    scaled = a * scale
    root = np.sqrt(scaled)
    ph, pl = two_prod(root, root)
    remainder = (scaled - ph) - pl
    err = np.where(np.isfinite(root) & (root > 0), np.sign(remainder), 0.0)
    return root * unscale, err


def finish(value, err, dtype, mode: str, finite_inputs=True):
    """Round an exact (value, error sign) pair to `dtype` in `mode`."""
    if np.dtype(dtype) == _F64:
        return _overflow_fix(directed_f64(value, err, mode), mode, finite_inputs)
    return round_f64(round_to_odd(value, err), dtype, mode)


# -- half precision ----------------------------------------------------------------------------

def f16_bits_to_f64(bits):
    return np.asarray(bits, np.uint16).view(np.float16).astype(_F64)


def f64_to_f16_bits(value, mode: str = "rn"):
    """float64 (exact or rounded to odd) -> IEEE half bits, rounded in `mode`."""
    value = np.asarray(value, _F64)
    result = value.astype(np.float16)
    if mode != "rn":
        back = result.astype(_F64)
        step = {"rz": np.abs(back) > np.abs(value), "rm": back > value,
                "rp": back < value}[mode]
        target = {"rz": 0.0, "rm": -np.inf, "rp": np.inf}[mode]
        result = np.where(step, np.nextafter(result, np.float16(target)), result)
    return result.view(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f64_to_bf16_bits(value, mode: str = "rn"):
    """float64 (exact or rounded to odd) -> bfloat16 bits, rounded in `mode`."""
    as_f32 = round_f64(round_to_odd(value, 0.0), np.float32, "rz")
    # round-to-odd into float32 (8 bits to spare for bf16's 8-bit significand)
    f32_back = as_f32.astype(_F64)
    odd = (np.asarray(value, _F64) != f32_back) & np.isfinite(f32_back)
    bits = np.asarray(as_f32).view(np.uint32) | odd.astype(np.uint32)
    nan = np.isnan(np.asarray(value))
    upper = bits >> np.uint32(16)
    lower = bits & np.uint32(0xFFFF)
    negative = (bits >> np.uint32(31)) != 0
    if mode == "rn":
        up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & np.uint32(1)) != 0))
    elif mode == "rz":
        up = np.zeros_like(lower, bool)
    elif mode == "rm":
        up = (lower != 0) & negative
    else:
        up = (lower != 0) & ~negative
    result = (upper + up.astype(np.uint32)).astype(np.uint16)
    return np.where(nan, np.uint16(0x7FFF), result).astype(np.uint16)
