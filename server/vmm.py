"""CUDA's virtual memory API for one session: address reservations, physical allocations
made apart from addresses, mappings of one into the other, and the access each mapping
allows.

Reservations take addresses in the session's arena, so cuMemAlloc never places memory inside
one. A physical allocation is backend memory with no address (`Backend.create_physical`);
each mapping shows one from its start at an address (CUDA maps from offset 0 only), so one
allocation mapped at two addresses shows the same bytes at both. A mapping allows no access
until cuMemSetAccess grants it: the backend faults a kernel or copy that touches it. Physical
memory counts as device memory in use (cuMemGetInfo, out-of-memory) from cuMemCreate until it
is released and unmapped.

Handles are the client's, like every object's; a handle lives while the program holds a
reference to it (cuMemCreate, each cuMemRetainAllocationHandle) and its memory while a
reference or a mapping is left; memory exported to other sessions lives while any holds it
(server/vmm_sharing.py). Errors are CUDA's: misuse is CUDA_ERROR_INVALID_VALUE, a
location on another device CUDA_ERROR_INVALID_DEVICE, a mapping offset other than zero
CUDA_ERROR_NOT_SUPPORTED.

What moves with the session: reservations, physical allocations and mappings are journaled
like every object (a restore makes them again, at the same addresses and handles, so one
allocation mapped twice is one again), and each physical allocation's contents are a region
of the checkpoint, named by its handle (handles lie far above every device address).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from vgpu.errors import CudaError
from vgpu.protocol import HOST_PAGE, VMM_GRANULARITY

from .handles import HandleTable
from .vmm_sharing import SharedPhysical, give_back

__all__ = ["VirtualMemory", "VMM_OPS"]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_SUPPORTED = 801
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
    handle: int
    size: int
    prop: list  # the allocation's properties, as cuMemGetAllocationPropertiesFromHandle gives
    memory: object  # the backend's
    references: int = 1
    mappings: int = 0
    shared: SharedPhysical | None = None  # exported or imported (server/vmm_sharing.py)

    def journal_fields(self) -> list:
        return [self.size, self.prop, self.references]


@dataclass
class Mapping:
    size: int  # bytes of the physical allocation, from its start
    physical: Physical


class VirtualMemory:
    def __init__(self, session) -> None:
        self.session = session
        self._empty()

    def _empty(self) -> None:
        # Handles the program holds references to; `physical`: every physical allocation
        # with memory, referenced or still mapped.
        self.handles: HandleTable[Physical] = HandleTable("memory", CUDA_ERROR_INVALID_VALUE)
        self.physical: dict[int, Physical] = {}
        self._starts: list[int] = []  # sorted starts of mappings
        self.mappings: dict[int, Mapping] = {}

    def regions(self) -> list[tuple[int, int]]:
        """(handle, size) of every physical allocation: its contents, for a checkpoint."""
        return [(handle, p.size) for handle, p in self.physical.items()]

    def forget(self) -> None:
        """Give back every address and byte the API holds (the backend's memory goes with
        the backend): a suspended session's, which its restore makes again."""
        arena = self.session.arena
        for start, _ in arena.reservations():
            arena.unreserve(start)
        arena.hold(-sum(p.size for p in self.physical.values()))
        self._empty()

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
        start = self.session.arena.reserve(size, max(alignment, VMM_GRANULARITY), address,
                                           self._anywhere)
        if start is None:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"no room for a reservation of {size} bytes in the session's "
                            "address range")
        self.session.journal.created("reserve", start, size)
        return start

    @property
    def _anywhere(self) -> bool:
        """Whether a fixed address may lie outside the session's own range: where its
        backend gives it an address space of its own, which no other session's use."""
        return not self.session.backend.shares_address_space

    def restore_reservation(self, address: int, size: int) -> None:
        arena = self.session.arena
        start = arena.reserve(size, VMM_GRANULARITY, address, self._anywhere)
        if start != address:
            if start is not None:
                arena.unreserve(start)
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"0x{address:x}+{size} is not free in the session's address range")
        self.session.journal.created("reserve", address, size)

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
        self.session.journal.destroyed("reserve", address)

    # ----------------------------------------------------------------- physical memory

    @op("cuMemCreate")
    def create(self, handle: int, size: int, prop: list) -> None:
        self._create(handle, size, prop, 1, None)

    def restore_memory(self, handle: int, size: int, prop: list, references: int,
                       backing: bytearray | None) -> None:
        """A physical allocation again, with the references the program held (0: memory
        only mapped) and, where given, `backing` as its memory (its contents)."""
        self._create(handle, size, prop, references, backing)

    def adopt(self, handle: int, shared: SharedPhysical) -> None:
        """Another session's physical memory as allocation `handle` of this one (imported:
        server/vmm_sharing.py), held until it is released and unmapped here."""
        self._create(handle, shared.size, shared.prop, 1, None, shared)

    def share(self, physical: Physical) -> SharedPhysical:
        """`physical` as memory other sessions may hold (exported)."""
        if physical.shared is None:
            physical.shared = SharedPhysical(physical.memory, physical.size, physical.prop)
        return physical.shared

    def shares(self) -> bool:
        """Whether physical memory here is shared with other sessions (which a checkpoint
        cannot carry)."""
        return any(p.shared is not None for p in self.physical.values())

    def close(self) -> None:
        """The session ends: let go of the memory it shares (the rest goes with the
        backend)."""
        for physical in self.physical.values():
            if physical.shared is not None:
                give_back(self.session, physical.shared)
        self._empty()

    def _create(self, handle: int, size: int, prop: list, references: int,
                backing: bytearray | None, shared: SharedPhysical | None = None) -> None:
        if size <= 0 or size % VMM_GRANULARITY:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"size {size} is not a positive multiple of the allocation "
                            f"granularity ({VMM_GRANULARITY} bytes)")
        session = self.session
        arena = session.arena
        if size > session.device.total_memory - arena.bytes_in_use:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of device memory ({size} bytes)")
        if handle in self.physical:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"memory handle 0x{handle:x} is not new")
        if references:
            self.handles.check_new(handle)  # before anything is taken
        # Device memory like any allocation's: charged to the session's quotas (quotas.py).
        session.memory.charge(size)
        try:
            memory = shared.memory if shared is not None else \
                session.backend.create_physical(size, backing, device=int(prop[3]))
        except BaseException:
            session.memory.release(size)
            raise
        physical = Physical(handle, size, [int(v) for v in prop], memory, references, 0,
                            shared)
        if references:
            self.handles.add(handle, physical)
        self.physical[handle] = physical
        arena.hold(size)
        session.journal.created("memory", handle, *physical.journal_fields())

    @op("cuMemRelease")
    def release(self, handle: int) -> None:
        physical = self.handles.get(handle)
        physical.references -= 1
        if physical.references == 0:
            self.handles.pop(handle)
        self._journal(physical)

    @op("cuMemRetainAllocationHandle")
    def retain(self, address: int) -> int:
        found = self.find(address)
        if found is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"0x{address:x} is not mapped memory")
        physical = self.mappings[found[0]].physical
        if physical.references == 0:  # released while mapped: the handle lives again
            self.handles.add(physical.handle, physical)
        physical.references += 1
        self._journal(physical)
        return physical.handle

    @op("cuMemGetAllocationPropertiesFromHandle")
    def properties(self, handle: int) -> list:
        return self.handles.get(handle).prop

    def _journal(self, physical: Physical) -> None:
        """Journal what changed of `physical`, or free it once nothing refers to it."""
        if physical.references or physical.mappings:
            self.session.journal.created("memory", physical.handle, *physical.journal_fields())
            return
        del self.physical[physical.handle]
        if physical.shared is not None:
            give_back(self.session, physical.shared)
        else:
            self.session.backend.release_physical(physical.memory)
        self.session.memory.release(physical.size)
        self.session.arena.hold(-physical.size)
        self.session.journal.destroyed("memory", physical.handle)

    def read_region(self, handle: int, offset: int, out: memoryview) -> None:
        self.session.backend.read_physical(self.physical[handle].memory, offset, out)

    def write_region(self, handle: int, offset: int, data: memoryview) -> None:
        self.session.backend.write_physical(self.physical[handle].memory, offset, data)

    # ----------------------------------------------------------------- mappings

    @op("cuMemMap")
    def map(self, address: int, size: int, offset: int, handle: int) -> None:
        _from_the_start(offset)
        self._map(address, size, self.handles.get(handle), 0)

    def restore_mapping(self, address: int, size: int, offset: int, handle: int,
                        access: int) -> None:
        # Journal records keep the offset checkpoint images have always had (always 0).
        _from_the_start(offset)
        if handle not in self.physical:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown memory handle 0x{handle:x}")
        self._map(address, size, self.physical[handle], access)

    def _map(self, address: int, size: int, physical: Physical, access: int) -> None:
        if size <= 0 or (address | size) % VMM_GRANULARITY:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            "the address and size of a mapping must be multiples of the "
                            f"allocation granularity ({VMM_GRANULARITY} bytes), the size "
                            "positive")
        if size > physical.size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"a mapping of {size} bytes runs past the allocation's "
                            f"{physical.size} bytes")
        reservation = self.session.arena.find_reservation(address)
        if reservation is None or address + size > sum(reservation):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} is not inside one reservation")
        if self._mapped_in(address, size):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} overlaps memory mapped already")
        self.session.backend.map_physical(address, size, physical.memory)
        bisect.insort(self._starts, address)
        self.mappings[address] = Mapping(size, physical)
        physical.mappings += 1
        self._set_access(address, access)

    @op("cuMemUnmap")
    def unmap(self, address: int, size: int) -> list[int]:
        """Unmap the whole mappings that make up [address, +size): the addresses they had."""
        starts = self._covering(address, size)
        for start in starts:
            self.session.backend.unmap(start)
            self._starts.remove(start)
            mapping = self.mappings.pop(start)
            self.session.journal.destroyed("mapping", start)
            mapping.physical.mappings -= 1
            self._journal(mapping.physical)
        return starts

    @op("cuMemSetAccess")
    def set_access(self, address: int, size: int, access: int) -> list[int]:
        """Give every mapping that makes up [address, +size) `access`: their addresses."""
        if access not in ACCESS_FLAGS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown access flags {access}")
        starts = self._covering(address, size)
        for start in starts:
            self._set_access(start, access)
        return starts

    def _set_access(self, start: int, access: int) -> None:
        self.session.backend.set_access(start, access)
        mapping = self.mappings[start]
        self.session.journal.created("mapping", start, mapping.size, 0,
                                     mapping.physical.handle, access)

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


def _from_the_start(offset: int) -> None:
    """CUDA maps physical memory from its start only: cuMemMap's offset "currently must be
    zero", and NVIDIA's driver answers any other with CUDA_ERROR_NOT_SUPPORTED (an H200,
    CUDA 13)."""
    if offset:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"a mapping at offset {offset} of physical memory: the offset must "
                        "be zero")
