"""CUDA's virtual memory API for one session: address reservations, physical allocations
made apart from addresses, mappings of one into the other, and the access each mapping
allows.

Reservations take addresses in the session's arena, so cuMemAlloc never places memory inside
one. A physical allocation is backend memory with no address (`Backend.create_physical`);
each mapping shows a piece of one at an address, so one allocation mapped at two addresses
shows the same bytes at both. A mapping allows no access until cuMemSetAccess grants it:
the backend faults a kernel or copy that touches it. Physical memory counts as device memory
in use (cuMemGetInfo, out-of-memory) from cuMemCreate until it is released and unmapped.

Handles are the client's, like every object's; a handle lives while the program holds a
reference to it (cuMemCreate, each cuMemRetainAllocationHandle) and its memory while a
reference or a mapping is left. Errors are CUDA's: misuse is CUDA_ERROR_INVALID_VALUE, a
location on another device CUDA_ERROR_INVALID_DEVICE.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from vgpu.errors import CudaError
from vgpu.protocol import HOST_PAGE, VMM_GRANULARITY

from .handles import HandleTable

__all__ = ["VirtualMemory", "VMM_OPS"]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
ACCESS_FLAGS = (0, 1, 3)  # CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ, _READWRITE

# Wire op name -> VirtualMemory method; Session dispatches them to its `vmm`.
VMM_OPS: dict[str, Callable] = {}


def op(name: str):
    def register(fn):
        VMM_OPS[name] = fn
        return fn

    return register


@dataclass
class Physical:
    size: int
    prop: list  # the allocation's properties, as cuMemGetAllocationPropertiesFromHandle gives
    memory: object  # the backend's
    references: int = 1
    mappings: int = 0


@dataclass
class Mapping:
    size: int
    handle: int
    physical: Physical
    access: int = 0


class VirtualMemory:
    def __init__(self, session) -> None:
        self.session = session
        self.handles: HandleTable[Physical] = HandleTable("memory", CUDA_ERROR_INVALID_VALUE)
        self._starts: list[int] = []  # sorted starts of mappings
        self.mappings: dict[int, Mapping] = {}

    @property
    def in_use(self) -> bool:
        """Whether the session holds anything of the API (what a checkpoint cannot carry)."""
        return bool(len(self.handles) or self.mappings or self.session.arena.reservations())

    def find(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the mapping containing `address`, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            start = self._starts[i]
            if address < start + self.mappings[start].size:
                return start, self.mappings[start].size
        return None

    # ----------------------------------------------------------------- reservations

    @op("cuMemAddressReserve")
    def reserve(self, size: int, alignment: int, address: int) -> int:
        if size <= 0 or size % HOST_PAGE or address % HOST_PAGE:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            "the size and address of a reservation must be multiples of the "
                            f"host page size ({HOST_PAGE} bytes), the size positive")
        if alignment < 0 or alignment & (alignment - 1):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"alignment {alignment} is neither 0 nor a power of two")
        start = self.session.arena.reserve(size, max(alignment, VMM_GRANULARITY), address)
        if start is None:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"no room for a reservation of {size} bytes in the session's "
                            "address range")
        return start

    @op("cuMemAddressFree")
    def free(self, address: int, size: int) -> None:
        found = self.session.arena.find_reservation(address)
        if found is None or found != (address, size):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} is not a reservation (start and size must "
                            "be those cuMemAddressReserve gave)")
        if self._mapped_in(address, size):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"the reservation 0x{address:x}+{size} still has memory mapped: "
                            "unmap it first")
        self.session.arena.unreserve(address)

    # ----------------------------------------------------------------- physical memory

    @op("cuMemCreate")
    def create(self, handle: int, size: int, prop: list) -> None:
        if size <= 0 or size % VMM_GRANULARITY:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"size {size} is not a positive multiple of the allocation "
                            f"granularity ({VMM_GRANULARITY} bytes)")
        session = self.session
        arena = session.arena
        if size > session.device.total_memory - arena.bytes_in_use:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of device memory ({size} bytes)")
        physical = Physical(size, [int(v) for v in prop], session.backend.create_physical(size))
        self.handles.add(handle, physical)
        arena.hold(size)

    @op("cuMemRelease")
    def release(self, handle: int) -> None:
        physical = self.handles.get(handle)
        physical.references -= 1
        if physical.references == 0:
            self.handles.pop(handle)
            self._free_if_unused(physical)

    @op("cuMemRetainAllocationHandle")
    def retain(self, address: int) -> int:
        found = self.find(address)
        if found is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"0x{address:x} is not mapped memory")
        mapping = self.mappings[found[0]]
        if mapping.handle in self.handles:
            self.handles.get(mapping.handle).references += 1
        else:  # released while mapped: the handle lives again
            mapping.physical.references = 1
            self.handles.add(mapping.handle, mapping.physical)
        return mapping.handle

    @op("cuMemGetAllocationPropertiesFromHandle")
    def properties(self, handle: int) -> list:
        return self.handles.get(handle).prop

    def _free_if_unused(self, physical: Physical) -> None:
        if physical.references == 0 and physical.mappings == 0:
            self.session.backend.release_physical(physical.memory)
            self.session.arena.hold(-physical.size)

    # ----------------------------------------------------------------- mappings

    @op("cuMemMap")
    def map(self, address: int, size: int, offset: int, handle: int) -> None:
        physical = self.handles.get(handle)
        if size <= 0 or (address | size | offset) % VMM_GRANULARITY:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            "the address, size and offset of a mapping must be multiples of "
                            f"the allocation granularity ({VMM_GRANULARITY} bytes), the size "
                            "positive")
        if offset < 0 or offset + size > physical.size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"offset {offset} + size {size} runs past the allocation's "
                            f"{physical.size} bytes")
        reservation = self.session.arena.find_reservation(address)
        if reservation is None or address + size > sum(reservation):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} is not inside one reservation")
        if self._mapped_in(address, size):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} overlaps memory mapped already")
        self.session.backend.map_physical(address, size, physical.memory, offset)
        bisect.insort(self._starts, address)
        self.mappings[address] = Mapping(size, handle, physical)
        physical.mappings += 1

    @op("cuMemUnmap")
    def unmap(self, address: int, size: int) -> list[int]:
        """Unmap the whole mappings that make up [address, +size): the addresses they had."""
        starts = self._covering(address, size)
        for start in starts:
            self.session.backend.unmap(start)
            self._starts.remove(start)
            mapping = self.mappings.pop(start)
            mapping.physical.mappings -= 1
            self._free_if_unused(mapping.physical)
        return starts

    @op("cuMemSetAccess")
    def set_access(self, address: int, size: int, access: int) -> list[int]:
        """Give every mapping that makes up [address, +size) `access`: their addresses."""
        if access not in ACCESS_FLAGS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown access flags {access}")
        starts = self._covering(address, size)
        for start in starts:
            self.session.backend.set_access(start, access)
            self.mappings[start].access = access
        return starts

    def _covering(self, address: int, size: int) -> list[int]:
        """The starts of the mappings that make up [address, +size) exactly, without a gap
        or a mapping only partly inside; CudaError otherwise."""
        starts = []
        cursor = address
        while size > 0 and cursor < address + size:
            found = self.find(cursor)
            if found is None or found[0] != cursor:
                break
            starts.append(cursor)
            cursor += found[1]
        if size <= 0 or cursor != address + size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} is not a range of whole mappings (one "
                            "cannot unmap or set the access of a part of a mapping, or of "
                            "memory not mapped)")
        return starts

    def _mapped_in(self, address: int, size: int) -> bool:
        i = bisect.bisect_left(self._starts, address)
        if i < len(self._starts) and self._starts[i] < address + size:
            return True
        return i > 0 and self.find(address) is not None
