"""Exact reference rounding for the emulator tests: a rational rounded to a float format."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

__all__ = ["round_exactly"]


def round_exactly(exact: Fraction, mode: str, dtype) -> float:
    """`exact` rounded to `dtype` in mode rn/rz/rm/rp, by exact comparisons."""
    with np.errstate(over="ignore"):
        return _round(exact, mode, dtype)


def _round(exact: Fraction, mode: str, dtype) -> float:
    dtype = np.dtype(dtype).type
    info = np.finfo(dtype)
    biggest = Fraction(float(info.max))
    if exact == 0:
        return dtype(0.0)
    try:
        guess = dtype(float(exact))
    except OverflowError:
        guess = dtype(np.inf)
    if abs(exact) > biggest:
        lower, upper = (dtype(info.max), dtype(np.inf)) if exact > 0 else \
            (dtype(-np.inf), dtype(-info.max))
    else:
        if not np.isfinite(guess):
            guess = dtype(info.max) if exact > 0 else dtype(-info.max)
        while Fraction(float(guess)) > exact:
            guess = np.nextafter(guess, dtype(-np.inf))
        while np.isfinite(np.nextafter(guess, dtype(np.inf))) and \
                Fraction(float(np.nextafter(guess, dtype(np.inf)))) <= exact:
            guess = np.nextafter(guess, dtype(np.inf))
        lower = guess
        upper = lower if Fraction(float(lower)) == exact else np.nextafter(lower, dtype(np.inf))
        if not np.isfinite(upper):   # exact lies between the largest finite value and inf
            upper = dtype(np.inf)
    if lower == upper:
        return lower
    if mode == "rz":
        return lower if exact > 0 else upper
    if mode == "rm":
        return lower
    if mode == "rp":
        return upper
    if not np.isfinite(upper):   # overflow threshold: halfway to the next power of two
        limit = biggest + Fraction(float(info.max - np.nextafter(info.max, dtype(0)))) / 2
        return upper if exact >= limit else lower
    if not np.isfinite(lower):
        limit = -biggest - Fraction(float(info.max - np.nextafter(info.max, dtype(0)))) / 2
        return lower if exact <= limit else upper
    below, above = exact - Fraction(float(lower)), Fraction(float(upper)) - exact
    if below != above:
        return lower if below < above else upper
    return lower if int(np.array(lower).view(f"u{np.dtype(dtype).itemsize}")) % 2 == 0 \
        else upper
