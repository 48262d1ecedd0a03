"""VaArena: the per-session window of device virtual addresses.

Every allocation a session makes is placed inside its arena, so an address means the same
allocation on any backend and after a restore: kernel arguments and pointers stored in device
memory need no translation. The arena only hands out addresses; backends back them.
"""

from __future__ import annotations

import bisect

__all__ = ["VaArena", "ALLOCATION_ALIGNMENT"]

# cudaMalloc guarantees 256-byte alignment; real drivers hand out 512-byte granules at least.
ALLOCATION_ALIGNMENT = 512


class VaArena:
    """First-fit allocator over [base, base + size), tracking live allocations by address."""

    def __init__(self, base: int, size: int, alignment: int = ALLOCATION_ALIGNMENT):
        self.base = base
        self.size = size
        self.alignment = alignment
        self._starts: list[int] = []  # sorted starts of live allocations
        self._sizes: dict[int, int] = {}  # start -> requested size
        self.bytes_in_use = 0

    def _round(self, n: int) -> int:
        return (max(n, 1) + self.alignment - 1) // self.alignment * self.alignment

    def alloc(self, size: int, address: int | None = None) -> int | None:
        """Reserve `size` bytes (at `address` when given, as a restore does); None when full."""
        span = self._round(size)
        if address is not None:
            return address if self._place(address, size, span) else None
        cursor = self.base
        for start in self._starts:
            if start - cursor >= span:
                break
            cursor = start + self._round(self._sizes[start])
        if cursor + span > self.base + self.size:
            return None
        self._place(cursor, size, span)
        return cursor

    def _place(self, address: int, size: int, span: int) -> bool:
        if address < self.base or address + span > self.base + self.size:
            return False
        i = bisect.bisect_left(self._starts, address)
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._round(self._sizes[prev]) > address:
                return False
        if i < len(self._starts) and self._starts[i] < address + span:
            return False
        self._starts.insert(i, address)
        self._sizes[address] = size
        self.bytes_in_use += size
        return True

    def free(self, address: int) -> int:
        """Release the allocation starting at `address`; returns its size. KeyError if none."""
        size = self._sizes.pop(address)
        self._starts.pop(bisect.bisect_left(self._starts, address))
        self.bytes_in_use -= size
        return size

    def find(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the live allocation containing `address`, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            start = self._starts[i]
            if address < start + self._sizes[start]:
                return start, self._sizes[start]
        return None

    @property
    def count(self) -> int:
        return len(self._starts)

    def allocations(self) -> list[tuple[int, int]]:
        return [(s, self._sizes[s]) for s in self._starts]
