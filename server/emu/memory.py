"""Sparse device memory: the emu backend's global (and const) memory for a whole session.

Each allocation is a numpy uint8 array placed at a device address the server chose; it is
either fresh and zero-filled or a view over a buffer the caller owns (an mmap'd shared-memory
segment for host-mapped memory).

Mapped granules: a GPU maps memory in pages, so an access a little past the end of an
allocation reads or writes memory that is there and does not fault. DeviceMemory models that
with a `granule`: each fresh allocation is backed up to its size rounded up to the granule
(the emu backend uses the arena's allocation alignment, 512 bytes, the least any GPU maps),
and an access inside that span but past the allocation's end is a *stray* access: a fault
only where the caller asks for strictness (VGPU_MEMCHECK=strict), else reported by the caller
and carried out. Outside every granule an access always raises `IllegalAddress`.

Access: each allocation is readable and writable, unless mapped otherwise (`map`'s
`access`, `set_access`: CUDA's virtual memory API maps memory inaccessible until the program
grants read or read-write access). An access it does not allow raises `IllegalAddress`
saying so, as a GPU's page tables fault it.

Scalar accesses (`read`, `write`, `view`, `fill`, `copy`) serve the server's memcpy/memset
calls and must lie inside one live allocation. Vector accesses (`gather`, `scatter`,
`segments`) serve the executor: one address per lane, every lane checked, with a fast path
when all lanes fall into the same allocation (the usual case: a kernel walking one array).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from .address_space import DEVICE_ADDRESS_LIMIT
from .errors import IllegalAddress

__all__ = ["DENIED", "DeviceMemory", "load_elements", "store_elements", "typed_elements",
           "NO_ACCESS", "READ", "READ_WRITE"]

# Access an allocation allows, as CUmemAccess_flags numbers them.
NO_ACCESS, READ, READ_WRITE = 0, 1, 3
DENIED = {NO_ACCESS: "the address is mapped without access for the device",
           READ: "the address is mapped read-only"}


class _Allocations(NamedTuple):
    """DeviceMemory's allocations at one moment: parallel lists in address order, never
    changed once made (a change makes new ones), so a reader that takes them once sees one
    consistent set while another thread maps or unmaps memory."""
    bases: list[int]
    arrays: list[np.ndarray]  # each one's mapped span
    sizes: list[int]          # the allocated sizes
    access: list[int]         # READ_WRITE, READ, NO_ACCESS


_NONE = _Allocations([], [], [], [])


class _Index(NamedTuple):
    """DeviceMemory's allocations as arrays, in address order."""
    bases: np.ndarray
    sizes: np.ndarray
    spans: np.ndarray    # each one's mapped span
    access: np.ndarray
    all_read_write: bool
    arrays: list[np.ndarray]  # the allocations' own, at the same positions


class DeviceMemory:
    """Allocations keyed by base address, found by binary search."""

    def __init__(self, granule: int = 1) -> None:
        self.granule = granule
        # Kernels on the streams' threads read the allocations while the session's thread
        # maps memory: each change publishes a new _Allocations in one assignment.
        self._allocations = _NONE
        self._changing = threading.Lock()  # one change at a time
        # The allocations as arrays for lanes' lookups, and as the compiled kernels' table,
        # made at the first use after they change (a module's load maps its variables one
        # by one: over a thousand in CuPy's), each with the _Allocations it was made from:
        # one made by a kernel's thread while another thread mapped memory describes the
        # allocations before the change, and is made again at the next use.
        self._index: tuple[_Allocations, _Index] | None = None
        self._native_table: tuple[_Allocations, np.ndarray] | None = None

    # -- allocation ---------------------------------------------------------------------
    def map(self, address: int, size: int, backing: memoryview | None = None,
            access: int = READ_WRITE) -> None:
        """Place a new allocation of `size` bytes at `address` (zero-filled unless backed),
        allowing `access`."""
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        if address < 0 or address + size > DEVICE_ADDRESS_LIMIT:
            raise ValueError(
                f"allocation [0x{address:x}, +{size}) is outside the device address range "
                f"(below 0x{DEVICE_ADDRESS_LIMIT:x})")
        with self._changing:
            bases, arrays, sizes, accesses = (list(a) for a in self._allocations)
            pos = bisect.bisect_right(bases, address)
            if pos > 0 and bases[pos - 1] + sizes[pos - 1] > address:
                raise ValueError(f"allocation at 0x{address:x} overlaps 0x{bases[pos - 1]:x}")
            if pos < len(bases) and address + size > bases[pos]:
                raise ValueError(f"allocation at 0x{address:x} overlaps 0x{bases[pos]:x}")
            if backing is None:
                span = -(-size // self.granule) * self.granule
                if pos < len(bases):  # never reach into the next allocation
                    span = min(span, bases[pos] - address)
                array = np.zeros(span, np.uint8)
            else:
                view = memoryview(backing).cast("B")
                if view.readonly:
                    raise ValueError("backing buffer must be writable")
                if view.nbytes < size:
                    raise ValueError(f"backing buffer holds {view.nbytes} bytes, {size} needed")
                array = np.frombuffer(view, np.uint8, count=size)
            if pos > 0 and bases[pos - 1] + arrays[pos - 1].size > address:
                # The previous allocation's granule padding reached this far: it ends here now.
                arrays[pos - 1] = arrays[pos - 1][:address - bases[pos - 1]]
            bases.insert(pos, address)
            arrays.insert(pos, array)
            sizes.insert(pos, size)
            accesses.insert(pos, access)
            self._publish(_Allocations(bases, arrays, sizes, accesses))

    def unmap(self, address: int) -> None:
        """Remove the allocation whose base is `address`."""
        with self._changing:
            bases, arrays, sizes, accesses = (list(a) for a in self._allocations)
            pos = bisect.bisect_left(bases, address)
            if pos == len(bases) or bases[pos] != address:
                raise IllegalAddress(address, 0)
            for parallel in (bases, arrays, sizes, accesses):
                del parallel[pos]
            self._publish(_Allocations(bases, arrays, sizes, accesses))

    def set_access(self, address: int, access: int) -> None:
        """What the allocation whose base is `address` allows from now on."""
        with self._changing:
            now = self._allocations
            pos = bisect.bisect_left(now.bases, address)
            if pos == len(now.bases) or now.bases[pos] != address:
                raise IllegalAddress(address, 0)
            accesses = list(now.access)
            accesses[pos] = access
            self._publish(now._replace(access=accesses))

    def _publish(self, allocations: _Allocations) -> None:
        self._allocations = allocations
        # The index and table made from the old set hold its arrays: an unmapped buffer
        # (a host segment's mmap) could not be closed while they do.
        self._index = self._native_table = None

    def _lookup_index(self) -> _Index:
        now, made = self._allocations, self._index
        if made is not None and made[0] is now:
            return made[1]
        index = _Index(np.array(now.bases, np.uint64), np.array(now.sizes, np.uint64),
                       np.array([a.size for a in now.arrays], np.uint64),
                       np.array(now.access, np.uint8),
                       # Access is checked lane by lane only where some allocation restricts it.
                       all(a == READ_WRITE for a in now.access), now.arrays)
        self._index = (now, index)
        return index

    def native_table(self) -> np.ndarray:
        """The allocations for compiled kernels (see native/codegen.py): one int64 row each,
        (base, size, mapped span, host address, access), in address order. Made again only
        after the allocations change (the same array until then)."""
        now, made = self._allocations, self._native_table
        if made is not None and made[0] is now:
            return made[1]
        rows = [(base, size, array.size, array.ctypes.data, access) for base, size, array,
                access in zip(now.bases, now.sizes, now.arrays, now.access, strict=True)]
        table = np.array(rows, np.uint64).view(np.int64) if rows else np.zeros((0, 5),
                                                                                np.int64)
        table = np.ascontiguousarray(table.reshape(-1, 5))
        self._native_table = (now, table)
        return table

    def find(self, address: int) -> tuple[int, int] | None:
        """(base, size) of the allocation containing `address`, or None."""
        now = self._allocations
        pos = bisect.bisect_right(now.bases, address) - 1
        if pos >= 0 and address < now.bases[pos] + now.sizes[pos]:
            return now.bases[pos], now.sizes[pos]
        return None

    def nearest(self, address: int) -> tuple[int, int] | None:
        """(base, size) of the allocation that starts at or below `address`, or None: what
        a memory checker names for an access past an allocation's end."""
        now = self._allocations
        pos = bisect.bisect_right(now.bases, address) - 1
        return (now.bases[pos], now.sizes[pos]) if pos >= 0 else None

    def allocations(self) -> list[tuple[int, int]]:
        """(base, size) of every live allocation, in address order."""
        now = self._allocations
        return list(zip(now.bases, now.sizes, strict=True))

    # -- scalar access ------------------------------------------------------------------
    def _locate(self, address: int, size: int, need: int) -> tuple[np.ndarray, int]:
        now = self._allocations
        pos = bisect.bisect_right(now.bases, address) - 1
        if pos >= 0:
            offset = address - now.bases[pos]
            if size >= 0 and offset + size <= now.sizes[pos]:
                if (now.access[pos] & need) != need:
                    raise IllegalAddress(address, size, denied=DENIED[now.access[pos]])
                return now.arrays[pos], offset
        raise IllegalAddress(address, size)

    def read(self, address: int, size: int) -> bytes:
        array, offset = self._locate(address, size, READ)
        return array[offset:offset + size].tobytes()

    def write(self, address: int, data) -> None:
        source = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        array, offset = self._locate(address, source.size, READ_WRITE)
        array[offset:offset + source.size] = source

    def view(self, address: int, size: int, writing: bool = True) -> memoryview:
        """A zero-copy writable view of `size` bytes inside one allocation (which must
        allow writing, unless the caller only reads it)."""
        array, offset = self._locate(address, size, READ_WRITE if writing else READ)
        return memoryview(array[offset:offset + size])

    def fill(self, address: int, pattern: bytes, count: int) -> None:
        """memset D8/D16/D32: `pattern` (1, 2 or 4 bytes) repeated `count` times."""
        if len(pattern) not in (1, 2, 4):
            raise ValueError(f"fill pattern must be 1, 2 or 4 bytes, got {len(pattern)}")
        array, offset = self._locate(address, len(pattern) * count, READ_WRITE)
        target = array[offset:offset + len(pattern) * count]
        target.reshape(count, len(pattern))[:] = np.frombuffer(pattern, np.uint8)

    def copy(self, dst: int, src: int, size: int) -> None:
        src_array, src_offset = self._locate(src, size, READ)
        dst_array, dst_offset = self._locate(dst, size, READ_WRITE)
        # numpy detects overlap within one buffer and copies through a temporary.
        dst_array[dst_offset:dst_offset + size] = src_array[src_offset:src_offset + size]

    # -- per-lane access ----------------------------------------------------------------
    def segments(self, addrs: np.ndarray, size: int,
                 stray: Callable[[int], None] | None = None, need: int = READ
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """Split per-lane accesses of `size` bytes by allocation, each allocation allowing
        the access `need` (READ, or READ_WRITE for stores and atomics).

        Yields (allocation bytes, byte offsets, lane positions or None for "all lanes").
        Raises IllegalAddress naming the first lane whose access is not inside one live
        allocation, or, when `stray` is given, not inside one allocation's mapped granule;
        `stray(position)` then hears of the first lane that is inside a granule but past
        its allocation's end, before anything is yielded. Lane order is preserved inside
        each segment.
        """
        addrs = np.asarray(addrs, np.uint64)
        if addrs.size == 0:
            return
        lo = int(addrs.min())
        hi = int(addrs.max())
        now = self._allocations
        pos = bisect.bisect_right(now.bases, lo) - 1
        if pos >= 0 and hi + size <= now.bases[pos] + now.sizes[pos] \
                and (now.access[pos] & need) == need:
            yield now.arrays[pos], addrs - np.uint64(now.bases[pos]), None
            return
        index = self._lookup_index()
        idx = np.searchsorted(index.bases, addrs, side="right").astype(np.int64) - 1
        safe = np.maximum(idx, 0)
        offsets = addrs - (index.bases[safe] if index.bases.size else 0)
        valid = _inside(idx, safe, offsets, index.sizes, size)
        if not valid.all():
            mapped = valid if stray is None else _inside(idx, safe, offsets, index.spans, size)
            if not mapped.all():
                bad = int(np.flatnonzero(~mapped)[0])
                raise IllegalAddress(int(addrs[bad]), size, index=bad)
            stray(int(np.flatnonzero(~valid)[0]))
        if not index.all_read_write:
            allowed = index.access[safe]
            denied = (idx >= 0) & ((allowed & np.uint8(need)) != np.uint8(need))
            if denied.any():
                bad = int(np.flatnonzero(denied)[0])
                raise IllegalAddress(int(addrs[bad]), size, index=bad,
                                     denied=DENIED[int(allowed[bad])])
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.flatnonzero(np.diff(sorted_idx)) + 1
        for lanes in np.split(order, starts):
            yield index.arrays[int(idx[lanes[0]])], offsets[lanes], lanes

    def gather(self, addrs: np.ndarray, dtype, count: int = 1) -> np.ndarray:
        """Per-lane loads of `count` consecutive `dtype` elements: shape (n,) or (n, count)."""
        dtype = np.dtype(dtype)
        addrs = np.asarray(addrs, np.uint64)
        shape = (addrs.size,) if count == 1 else (addrs.size, count)
        out = None
        for array, offsets, lanes in self.segments(addrs, dtype.itemsize * count):
            values = load_elements(array, offsets, dtype, count)
            if lanes is None:
                return values
            if out is None:
                out = np.empty(shape, dtype)
            out[lanes] = values
        return out if out is not None else np.empty(shape, dtype)

    def scatter(self, addrs: np.ndarray, values: np.ndarray) -> None:
        """Per-lane stores; `values` has shape (n,) or (n, count). Later lanes win ties."""
        values = np.asarray(values)
        count = 1 if values.ndim == 1 else values.shape[1]
        for array, offsets, lanes in self.segments(addrs, values.dtype.itemsize * count,
                                                   need=READ_WRITE):
            store_elements(array, offsets, values if lanes is None else values[lanes])


def _inside(idx, safe, offsets, limits, size: int) -> np.ndarray:
    """Per lane: does an access of `size` bytes at `offsets` from the allocation `idx` end
    within `limits` (the allocations' sizes or mapped spans)?"""
    if not limits.size:
        return np.zeros(len(idx), bool)
    ends = limits[safe]
    return (idx >= 0) & (ends >= np.uint64(size)) & (offsets <= ends - np.uint64(size))


def typed_elements(array: np.ndarray, offsets: np.ndarray, dtype
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """A typed view of the uint8 `array` and element indices for byte `offsets`, when all
    offsets are congruent modulo the element size (else None)."""
    dtype = np.dtype(dtype)
    size = dtype.itemsize
    if size == 1:   # int8 too: a view, so that signed bytes read as signed
        return array.view(dtype), offsets.astype(np.intp)
    if len(offsets) == 0:
        return array[:0].view(dtype), offsets.astype(np.intp)
    shift = int(offsets[0]) % size
    relative = offsets - np.uint64(shift) if shift else offsets
    if (relative & np.uint64(size - 1)).any():
        return None
    usable = (array.size - shift) // size * size
    typed = array[shift:shift + usable].view(dtype)
    return typed, (relative // np.uint64(size)).astype(np.intp)


def load_elements(array: np.ndarray, offsets: np.ndarray, dtype: np.dtype,
                  count: int = 1) -> np.ndarray:
    """Elements of `dtype` at byte `offsets` of the uint8 `array` (bounds already checked)."""
    dtype = np.dtype(dtype)
    found = typed_elements(array, offsets, dtype)
    if found is not None:
        typed, index = found
        if count == 1:
            return typed[index]
        return typed[index[:, None] + np.arange(count)]
    byte_index = offsets.astype(np.intp)[:, None] + np.arange(dtype.itemsize * count)
    values = np.ascontiguousarray(array[byte_index]).view(dtype)
    return values[:, 0] if count == 1 else values


def store_elements(array: np.ndarray, offsets: np.ndarray, values: np.ndarray) -> None:
    """Store `values` (shape (n,) or (n, count)) at byte `offsets` of the uint8 `array`."""
    count = 1 if values.ndim == 1 else values.shape[1]
    found = typed_elements(array, offsets, values.dtype)
    if found is not None:
        typed, index = found
        if count == 1:
            typed[index] = values
        else:
            typed[index[:, None] + np.arange(count)] = values
        return
    raw = np.ascontiguousarray(values).reshape(len(offsets), -1).view(np.uint8)
    byte_index = offsets.astype(np.intp)[:, None] + np.arange(raw.shape[1])
    array[byte_index] = raw
