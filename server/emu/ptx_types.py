"""PTX fundamental types and the numpy dtypes that hold them.

Registers keep the raw bits of their declared type: signed and unsigned integers as numpy
signed/unsigned integers, `.f32`/`.f64` as float32/float64, `.f16`/`.bf16` (and the packed
`x2` forms) as their bit patterns in unsigned integers, `.pred` as bool. An instruction reads
a register through a zero-copy `view` when sizes agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PtxType", "TYPES", "float_dtype", "int_dtype", "lookup_type"]


@dataclass(frozen=True)
class PtxType:
    name: str   # "u32", "f16x2", "pred", ...
    kind: str   # "s" signed, "u" unsigned, "b" untyped bits, "f" float, "pred"
    bits: int

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype."""
        if self.kind == "pred":
            return np.dtype(np.bool_)
        if self.kind == "f" and self.name in ("f32", "f64"):
            return np.dtype(f"float{self.bits}")
        if self.kind == "s":
            return np.dtype(f"int{self.bits}")
        return np.dtype(f"uint{self.bits}")

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_signed(self) -> bool:
        return self.kind == "s"

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)


TYPES: dict[str, PtxType] = {
    t.name: t
    for t in (
        PtxType("pred", "pred", 1),
        *(PtxType(f"{k}{b}", k, b) for k in "sub" for b in (8, 16, 32, 64)),
        PtxType("f16", "f", 16),
        PtxType("bf16", "f", 16),
        PtxType("f16x2", "f", 32),
        PtxType("bf16x2", "f", 32),
        PtxType("f32", "f", 32),
        PtxType("f64", "f", 64),
    )
}


def lookup_type(name: str) -> PtxType | None:
    return TYPES.get(name)


def int_dtype(bits: int, signed: bool) -> np.dtype:
    return np.dtype(f"{'int' if signed else 'uint'}{bits}")


def float_dtype(bits: int) -> np.dtype:
    return np.dtype(f"float{bits}")
