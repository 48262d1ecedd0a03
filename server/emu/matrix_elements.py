"""The element types of tensor-core fragments and how registers hold them.

A fragment register is a 32-bit word packing `32 // bits` elements, lowest-indexed element in
the lowest bits (f16/bf16 two per word, s8/u8 four, s4/u4 eight, b1 thirty-two), or one
f32, tf32, s32 or f64 value. `decode` turns a warp's registers into element values (float64
for floating types, exact for all of them; int64 for integers) and `encode` turns results
back into register words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import float_rounding as fr
from .ptx_types import TYPES, PtxType

__all__ = ["ELEMENTS", "ElementType"]

# tf32 keeps an f32's sign, exponent and top 10 significand bits: the tensor cores ignore
# the low 13 bits of each operand (cvt.rna.tf32.f32 rounds them away beforehand).
TF32_MASK = np.uint32(0xFFFFE000)


@dataclass(frozen=True)
class ElementType:
    name: str
    bits: int
    register: PtxType          # how a fragment register is read and written

    @property
    def per_register(self) -> int:
        return 32 // self.bits if self.bits < 32 else 1

    def decode(self, words: np.ndarray) -> np.ndarray:
        """(..., registers) words -> (..., registers * per_register) element values."""
        name = self.name
        if name in ("f32", "f64"):
            return words.astype(np.float64)
        if name == "tf32":
            return (words.view(np.uint32) & TF32_MASK).view(np.float32).astype(np.float64)
        if name == "s32":
            return words.astype(np.int64)
        words = words.view(np.uint32)
        per = self.per_register
        shifts = (np.arange(per, dtype=np.uint32) * np.uint32(self.bits))
        fields = (words[..., None] >> shifts) & np.uint32((1 << self.bits) - 1)
        fields = fields.reshape(*words.shape[:-1], words.shape[-1] * per)
        if name == "f16":
            return fr.f16_bits_to_f64(fields.astype(np.uint16))
        if name == "bf16":
            return fr.bf16_bits_to_f32(fields.astype(np.uint16)).astype(np.float64)
        values = fields.astype(np.int64)
        if name[0] == "s":   # two's complement fields
            values = np.where(values >> (self.bits - 1), values - (1 << self.bits), values)
        return values

    def encode(self, values: np.ndarray) -> np.ndarray:
        """(..., elements) results (already rounded to this type) -> (..., registers) words
        of the register type's dtype. f16 results come as their bit patterns."""
        if self.name in ("f32", "f64", "s32"):
            return values.astype(self.register.dtype)
        if self.name != "f16":
            raise ValueError(f"results are never .{self.name}")
        pairs = values.astype(np.uint32).reshape(*values.shape[:-1], -1, 2)
        return pairs[..., 0] | (pairs[..., 1] << np.uint32(16))


_B32 = TYPES["b32"]
ELEMENTS: dict[str, ElementType] = {
    e.name: e for e in (
        ElementType("f16", 16, _B32), ElementType("bf16", 16, _B32),
        ElementType("tf32", 32, _B32), ElementType("f32", 32, TYPES["f32"]),
        ElementType("f64", 64, TYPES["f64"]), ElementType("s32", 32, TYPES["s32"]),
        ElementType("s8", 8, _B32), ElementType("u8", 8, _B32),
        ElementType("s4", 4, _B32), ElementType("u4", 4, _B32), ElementType("b1", 1, _B32),
    )
}
