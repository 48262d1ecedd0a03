"""cvt to .tf32 (`cvt.rna.tf32.f32`, what nvcuda::wmma::__float_to_tf32 compiles to; .rn and
.rz, .satfinite): an f32 rounded to tf32's 10 significand bits, kept as an f32 bit pattern
whose low 13 bits are zero. NaN gives the canonical NaN 0x7FFFFFFF; an overflow gives
infinity, or with .satfinite the largest finite tf32 of the same sign.
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, Modifiers
from .ops_common import elementwise
from .ptx_types import TYPES

__all__ = ["tf32_conversion"]

_LOW = np.uint32(0x1FFF)
_HALF = np.uint32(0x1000)
_MAGNITUDE = np.uint32(0x7FFFFFFF)
_INFINITY = np.uint32(0x7F800000)
_MAX_FINITE = np.uint32(0x7F7FE000)
_SIGN = np.uint32(0x80000000)


def tf32_conversion(instr, ctx: CompileContext):
    mods = Modifiers(ctx, frozenset({"tf32"}))
    mode = mods.take("rna", "rn", "rz")
    satfinite = mods.has("satfinite")
    if mods.has("relu"):
        raise ctx.unsupported(".relu is not supported on tf32 conversions")
    if [t.name for t in mods.types] != ["f32"] or instr.modifiers.count("tf32") != 1 \
            or mode is None:
        raise ctx.error("expected cvt.rna/.rn/.rz{.satfinite}.tf32.f32")
    mods.types = []
    mods.done()

    def convert(value):
        bits = np.asarray(value, np.float32).view(np.uint32)
        if mode == "rna":
            rounded = bits + _HALF
        elif mode == "rn":
            rounded = bits + (_HALF - np.uint32(1)) + ((bits >> np.uint32(13)) & np.uint32(1))
        else:
            rounded = bits
        magnitude = bits & _MAGNITUDE
        result = np.where(magnitude >= _INFINITY, bits, rounded) & ~_LOW
        if satfinite:
            overflow = (result & _MAGNITUDE) == _INFINITY
            result = np.where(overflow, (result & _SIGN) | _MAX_FINITE, result)
        result = np.where(magnitude > _INFINITY, _MAGNITUDE, result)
        return result.astype(np.uint32).view(np.float32)
    return elementwise(ctx, TYPES["f32"], [TYPES["f32"]], convert)
