"""Data copied back compared as floats within a tolerance (`vgpu replay --rtol/--atol`):
which bytes count as different."""

from __future__ import annotations

import numpy as np

from vgpu.replay.replayer import Tolerance, _differing_bytes


def test_f64_values_within_the_tolerance_are_equal_and_the_rest_are_found():
    recorded = np.array([1.0, 2.0, 3.0, 4.0], "<f8")
    replayed = recorded.copy()
    replayed[1] = np.nextafter(2.0, 3.0)  # one ulp
    replayed[2] = 3.001
    f64 = Tolerance(rtol=1e-12, atol=0.0, floats="f64")
    assert _differing_bytes(recorded.tobytes(), replayed.tobytes(), f64) == (16, 24)
    assert _differing_bytes(recorded.tobytes(), replayed.tobytes(),
                            Tolerance(rtol=1e-3, atol=0.0, floats="f64")) is None
    assert _differing_bytes(recorded.tobytes(), replayed.tobytes(), None)[0] == 8  # bytewise


def test_nan_equals_nan_and_bytes_after_the_last_float_compare_exactly():
    recorded = np.array([np.nan, 1.0], "<f4").tobytes() + b"\x01\x02"
    f32 = Tolerance(rtol=1e-3, atol=1e-3)
    assert _differing_bytes(recorded, recorded, f32) is None
    assert _differing_bytes(recorded, recorded[:-1] + b"\x03", f32) == (9, 10)
