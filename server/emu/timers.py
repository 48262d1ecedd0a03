"""The emulated device's clocks: %clock/%clock64 and %globaltimer run in real time.

Kernels that wait on the clock (spin until `clock64()` has advanced by N cycles, a common way
to make work take a known time) must wait N / clock rate seconds, as on a GPU, however slowly
the emulator executes instructions. So the cycle counter is elapsed time at the clock rate
the device reports, and %globaltimer is wall-clock nanoseconds; both are monotonic.
"""

from __future__ import annotations

import time

__all__ = ["CLOCK_RATE_KHZ", "clock_cycles", "globaltimer_ns"]

# What cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE) reports for the emulated device.
CLOCK_RATE_KHZ = 1_410_000

# Monotonic nanoseconds shifted to the Unix epoch once, so %globaltimer reads like a GPU's
# (nanoseconds of wall time) and never goes back when the system clock is adjusted.
_EPOCH_OFFSET_NS = time.time_ns() - time.monotonic_ns()
_START_NS = time.monotonic_ns()


def clock_cycles() -> int:
    """%clock64: cycles at CLOCK_RATE_KHZ since the server started."""
    return (time.monotonic_ns() - _START_NS) * CLOCK_RATE_KHZ // 1_000_000


def globaltimer_ns() -> int:
    return time.monotonic_ns() + _EPOCH_OFFSET_NS

