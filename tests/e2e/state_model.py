"""What the state-moving programs (programs/state_loop.*, programs/rt_state_loop.cu) compute,
computed on the host with numpy: the checksum an uninterrupted run prints."""

from __future__ import annotations

import numpy as np

__all__ = ["expected_checksum", "managed_loop_checksum"]

_CHUNK = 1 << 22  # words at a time: a few hundred MiB of state needs no GiB of temporaries


def _initial(j: int, start: int, stop: int) -> np.ndarray:
    i = np.arange(start, stop, dtype=np.uint64)
    return ((i * np.uint64(2654435761) + np.uint64(j * 97)) & np.uint64(0xFFFFFFFF)).astype(
        np.uint32)


def _weighted_sum(x: np.ndarray, start: int) -> int:
    weights = np.arange(start, start + len(x), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return int(np.sum(x.astype(np.uint64) * weights, dtype=np.uint64))


def expected_checksum(count: int, total_kib: int, iterations: int, stride: int = 1,
                      only: int | None = None) -> str:
    """The checksum line's value: allocation j's word i starts as i*2654435761 + 97j, and
    every stride-th word goes through x = x*(2j+3) + (16k+j+1) for k in 0..iterations-1
    (modulo 2^32; with `only`, in that allocation alone); the checksum is the sum of
    x*(2i+1)*(j+1) modulo 2^64, in 16 hex digits."""
    words = total_kib * 1024 // count // 4
    checksum = 0
    with np.errstate(over="ignore"):
        for j in range(count):
            total = 0
            for start in range(0, words, _CHUNK):
                stop = min(words, start + _CHUNK)
                x = _initial(j, start, stop)
                first = -start % stride  # the first word of the chunk that kernels update
                updated = x[first::stride]
                for k in range(iterations if only in (None, j) else 0):
                    updated = updated * np.uint32(2 * j + 3) + np.uint32(16 * k + j + 1)
                x[first::stride] = updated
                total += _weighted_sum(x, start)
            checksum += (total % 2**64) * (j + 1)
    return f"{checksum % 2**64:016x}"


def managed_loop_checksum(words: int, iterations: int) -> str:
    """programs/managed_loop.cu's checksum: word i starts as i*2654435761 + 7; iteration k
    adds k to word k % words (the host), then x = 3x + k for every word and the counter,
    1000 at the start, goes up by one (a kernel), then the host adds word 7k % words to a
    running sum; the checksum is that sum, plus the counter, plus the sum of x*(i+1), modulo
    2^64, in 16 hex digits."""
    mask = 0xFFFFFFFF
    x = [(i * 2654435761 + 7) & mask for i in range(words)]
    seen = 0
    for k in range(iterations):
        x[k % words] = (x[k % words] + k) & mask
        x = [(v * 3 + k) & mask for v in x]
        seen += x[(k * 7) % words]
    checksum = seen + 1000 + iterations + sum((i + 1) * v for i, v in enumerate(x))
    return f"{checksum % (1 << 64):016x}"
