"""Placing a module's variables in a session's arena: CuPy's CUB reduction kernels load
about 1300 variables, each an allocation, into a session that may already hold thousands.
VaArena's first fit (it walks the free ranges) against first fit by a walk of every
allocation (what the arena did before), same run, same requests; prints a table.

    python benchmarks/bench_arena.py
"""

from __future__ import annotations

import bisect
import time

from vgpu.server.arena import VaArena

BASE = 1 << 44
VARIABLES = 1327  # CuPy 14.2's CUB block reduction module


class ScanningArena(VaArena):
    """The baseline: first fit by walking every allocation from the arena's start."""

    def _first_fit(self, span: int, alignment: int,
                   within: tuple[int, int] | None = None) -> int | None:
        low, high = within or (self.base, self.base + self.size)
        first = bisect.bisect_left(self._starts, low)
        cursor = low
        if first:  # one placed before the region may reach into it
            before = self._starts[first - 1]
            cursor = max(low, before + self._round(self._sizes[before]))
        for start in self._starts[first:]:
            cursor = -(-cursor // alignment) * alignment
            if start - cursor >= span:
                break
            cursor = max(cursor, start + self._round(self._sizes[start]))
        cursor = -(-cursor // alignment) * alignment
        return cursor if cursor + span <= high else None

def load_time(arena_class, held: int) -> float:
    """Seconds to place VARIABLES small allocations in an arena already holding `held`,
    with a hole left by a freed one among them."""
    arena = arena_class(BASE, 1 << 40)
    placed = [arena.alloc(4096) for _ in range(held)]
    if placed:
        arena.free(placed[len(placed) // 2])
    start = time.perf_counter()
    for _ in range(VARIABLES):
        arena.alloc(8)
    return time.perf_counter() - start


def main() -> None:
    print(f"{'held':>7} {'free ranges ms':>15} {'scan ms':>9} {'ratio':>7}")
    for held in (0, 1000, 10000):
        ours, scan = load_time(VaArena, held), load_time(ScanningArena, held)
        print(f"{held:>7} {ours * 1e3:>15.1f} {scan * 1e3:>9.1f} {scan / ours:>6.0f}x")


if __name__ == "__main__":
    main()
