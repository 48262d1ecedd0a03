"""D = A x B + C for a batch of warps, with the arithmetic of each tensor-core type.

Operands come as (warps, rows, columns) arrays of element values (`matrix_elements`).

- f16, bf16 and tf32 inputs: every product is exact in float64 (at most 11 x 11 significand
  bits); C and the products are added in k order in float64 and the sum is rounded once to
  the accumulator type (f32 or f16, to nearest even). That is the exact result rounded once
  whenever the sum fits float64's 53 bits (products within 2^30 of each other in
  magnitude), which covers ordinary data; the PTX ISA leaves the accumulation order and
  intermediate precision to the implementation (GPUs truncate while accumulating, so they
  differ from this, and from each other, in the last bits). NaN and infinity propagate as
  in IEEE.
- f64: a chain of fused multiply-adds in k order, each rounded to nearest: d = c;
  d = fma(a[k], b[k], d).
- Integers (s8, u8, s4, u4): exact in int64, wrapped to s32, or clamped with .satfinite.
- b1: popc(a AND b) or popc(a XOR b) summed over k, plus C, wrapped to s32.
"""

from __future__ import annotations

import numpy as np

from . import float_rounding as fr

__all__ = ["multiply_accumulate"]

_INT32 = np.iinfo(np.int32)


def multiply_accumulate(a, b, c, input_kind: str, result_kind: str, satfinite: bool = False,
                        bit_op: str | None = None) -> np.ndarray:
    """The result elements, as values of `result_kind` (f16 as bit patterns)."""
    if input_kind == "f64":
        return _fma_chain(a, b, c)
    if input_kind in ("f16", "bf16", "tf32"):
        return _rounded_sum(a, b, c, result_kind)
    if input_kind == "b1":
        if bit_op == "and":
            counts = np.matmul(a, b)
        else:
            counts = (a[:, :, :, None] ^ b[:, None, :, :]).sum(axis=2)
        return (c + counts).astype(np.int32)
    exact = c + np.matmul(a, b)          # int64: no overflow for k <= 64 and 8-bit inputs
    if satfinite:
        exact = np.clip(exact, _INT32.min, _INT32.max)
    return exact.astype(np.int32)


def _fma_chain(a, b, c):
    d = c.astype(np.float64)
    for k in range(a.shape[2]):
        d, _ = fr.exact_fma(a[:, :, k, None], b[:, None, k, :], d)
    return d


def _rounded_sum(a, b, c, result_kind):
    total = c.astype(np.float64)
    for k in range(a.shape[2]):
        total += a[:, :, k, None] * b[:, None, k, :]
    if result_kind == "f16":
        return fr.f64_to_f16_bits(total)
    return total.astype(np.float32)
