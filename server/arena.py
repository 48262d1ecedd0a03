"""VaArena: the per-session window of device virtual addresses.

Every allocation a session makes is placed inside its arena, so an address means the same
allocation on any backend and after a restore: kernel arguments and pointers stored in device
memory need no translation. The arena only hands out addresses; backends back them.

Reservations (cuMemAddressReserve) take addresses too, so that no allocation lands inside
one, but are no allocation: `find` and `allocations` pass them by, and they hold no memory.
One asked for at a fixed address may lie outside the arena, inside its `fixed_window` (the
server's range of session addresses, where no host memory is; None: the arena only): a
session whose backend gives it an address space of its own can have any free address there,
as a GPU's driver gives any free one.
What the arena counts in use is its allocations' sizes plus memory the session holds
outside them (`hold`: physical memory of the virtual memory API, mapped or not).
A session with several devices splits its arena into equal regions, one per device: each
device's allocations are placed first-fit inside its own (a restore's fixed addresses and
reservations may lie anywhere), so that memory of two devices never shares a granule.

First fit walks the arena's free ranges, kept beside the allocations, not the allocations
themselves: a module loads its variables as one allocation each (CuPy's CUB kernels have over
a thousand), and a session may hold tens of thousands, packed with few holes between them.
"""

from __future__ import annotations

import bisect

__all__ = ["VaArena", "ALLOCATION_ALIGNMENT"]

# cudaMalloc guarantees 256-byte alignment; real drivers hand out 512-byte granules at least.
ALLOCATION_ALIGNMENT = 512


class VaArena:
    """First-fit allocator over [base, base + size), tracking live allocations by address."""

    def __init__(self, base: int, size: int, alignment: int = ALLOCATION_ALIGNMENT,
                 fixed_window: tuple[int, int] | None = None):
        self.base = base
        self.size = size
        self.alignment = alignment
        self.fixed_window = fixed_window or (base, size)  # (start, size)
        self._starts: list[int] = []  # sorted starts of live allocations
        self._sizes: dict[int, int] = {}  # start -> requested size
        self._reserved: set[int] = set()  # starts that are reservations
        # The arena's free ranges, in address order: sorted starts, and start -> end.
        self._free: list[int] = [base]
        self._free_end: dict[int, int] = {base: base + size}
        self.bytes_in_use = 0
        self.regions = 1

    def split(self, regions: int) -> None:
        """One region per device, in order from the base (see the module's docstring)."""
        self.regions = max(1, regions)

    def _round(self, n: int) -> int:
        return (max(n, 1) + self.alignment - 1) // self.alignment * self.alignment

    def alloc(self, size: int, address: int | None = None,
              alignment: int | None = None, region: int = 0) -> int | None:
        """Reserve `size` bytes (at `address` when given, as a restore does; else in region
        `region`, aligned to `alignment`, a multiple of the arena's, or the arena's own);
        None when full."""
        span = self._round(size)
        if address is not None:
            return address if self._place(address, size, span) else None
        cursor = self._first_fit(span, alignment or self.alignment, self._region(region))
        if cursor is None:
            return None
        self._place(cursor, size, span)
        return cursor

    def reserve(self, size: int, alignment: int, address: int = 0,
                anywhere: bool = False) -> int | None:
        """Take [start, start+size) for a reservation: at `address` when it is free (in the
        arena or, `anywhere`, in its fixed window), else at the first free place in the
        arena aligned to `alignment` (a power of two, a multiple of the arena's); None when
        there is no room."""
        span = self._round(size)
        window = self.fixed_window if anywhere else (self.base, self.size)
        if address and address % alignment == 0 and self._place(address, 0, span, window):
            start = address
        else:
            start = self._first_fit(span, alignment)
            if start is None:
                return None
            self._place(start, 0, span)
        self._sizes[start] = span
        self._reserved.add(start)
        return start

    def unreserve(self, address: int) -> None:
        """Give back the reservation starting at `address`."""
        self._reserved.remove(address)
        self._release(address, self._sizes.pop(address))
        self._starts.pop(bisect.bisect_left(self._starts, address))

    def hold(self, size: int) -> None:
        """Count `size` bytes more (a negative size: fewer) in use outside allocations."""
        self.bytes_in_use += size

    def region_starts(self) -> list[int]:
        """Where each device's region begins (the base alone when the arena is not split)."""
        return [self._region(region)[0] for region in range(self.regions)]

    def _region(self, region: int) -> tuple[int, int]:
        """(start, end) of region `region` (the whole arena when it is not split)."""
        length = self.size // self.regions // self.alignment * self.alignment
        if not 0 <= region < self.regions:
            raise ValueError(f"no region {region} in an arena of {self.regions}")
        start = self.base + region * length
        return start, self.base + self.size if region == self.regions - 1 else start + length

    def _first_fit(self, span: int, alignment: int,
                   within: tuple[int, int] | None = None) -> int | None:
        low, high = within or (self.base, self.base + self.size)
        i = max(bisect.bisect_right(self._free, low) - 1, 0)  # the range holding low, or after
        for start in self._free[i:]:
            if start >= high:
                break
            cursor = -(-max(start, low) // alignment) * alignment
            if cursor + span <= min(self._free_end[start], high):
                return cursor
        return None

    def _occupy(self, address: int, span: int) -> None:
        """Take [address, address + span) out of the free ranges (the part in the arena:
        a fixed address may lie outside it); the caller checked that it is free."""
        low, high = max(address, self.base), min(address + span, self.base + self.size)
        if low >= high:
            return
        i = bisect.bisect_right(self._free, low) - 1
        start = self._free[i]
        end = self._free_end.pop(start)
        self._free.pop(i)
        if high < end:
            self._free.insert(i, high)
            self._free_end[high] = end
        if start < low:
            self._free.insert(i, start)
            self._free_end[start] = low

    def _release(self, address: int, size: int) -> None:
        """Give [address, address + round(size)) back to the free ranges, joined to those
        it touches."""
        low = max(address, self.base)
        high = min(address + self._round(size), self.base + self.size)
        if low >= high:
            return
        i = bisect.bisect_left(self._free, low)
        if i < len(self._free) and self._free[i] == high:  # the range after it joins
            high = self._free_end.pop(self._free.pop(i))
        if i > 0 and self._free_end[self._free[i - 1]] == low:  # the range before it too
            self._free_end[self._free[i - 1]] = high
        else:
            self._free.insert(i, low)
            self._free_end[low] = high

    def _place(self, address: int, size: int, span: int,
               window: tuple[int, int] | None = None) -> bool:
        low, length = window or (self.base, self.size)
        if address < low or address + span > low + length:
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
        self._occupy(address, span)
        self.bytes_in_use += size
        return True

    def free(self, address: int) -> int:
        """Release the allocation starting at `address`; returns its size. KeyError if none."""
        size = self._sizes.pop(address)
        self._starts.pop(bisect.bisect_left(self._starts, address))
        self._release(address, size)
        self.bytes_in_use -= size
        return size

    def find(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the live allocation containing `address`, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            start = self._starts[i]
            if address < start + self._sizes[start] and start not in self._reserved:
                return start, self._sizes[start]
        return None

    def find_reservation(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the reservation containing `address`, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            start = self._starts[i]
            if address < start + self._sizes[start] and start in self._reserved:
                return start, self._sizes[start]
        return None

    @property
    def count(self) -> int:
        return len(self._starts)

    def allocations(self) -> list[tuple[int, int]]:
        return [(s, self._sizes[s]) for s in self._starts if s not in self._reserved]

    def reservations(self) -> list[tuple[int, int]]:
        return [(s, self._sizes[s]) for s in self._starts if s in self._reserved]
