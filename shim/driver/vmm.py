"""CUDA's virtual memory API: address reservations, physical allocations, mappings, access.

The server keeps the state and checks every call (server/vmm.py); the client checks the
arguments it decodes (properties, locations, flags) and mirrors the mappings, which are
device memory for copies, memsets and pointer queries (`state.add_allocation`, with no
context: mappings belong to the process, not to a context). Every call waits for its
answer: programs make them while they set memory up, where an error must come back at once.
"""

from __future__ import annotations

import fcntl
import os

from vgpu.protocol import IPC_HANDLE_BYTES, IPC_MARKERS, VMM_GRANULARITY

from ._state import CudaError, E, Kind, api, check_out, ffi, ptr, state

__all__ = ["mapped_access"]

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0, 1
# CUDA's other shareable handle types (WIN32, WIN32_KMT, FABRIC): none is vgpu's.
OTHER_HANDLE_TYPES = (0x2, 0x4, 0x8)
EXPORT_BYTES = IPC_HANDLE_BYTES
EXPORT_MARKER = IPC_MARKERS["vmm"]
CU_MEM_ALLOCATION_COMP_NONE = 0
GRANULARITY_OPTIONS = (0, 1)  # CU_MEM_ALLOC_GRANULARITY_MINIMUM, _RECOMMENDED


def mapped_access(address: int) -> int | None:
    """The access flags of the mapping at `address` (its start), or None: not a mapping."""
    return state.mappings.get(address)


def mapped_device(address: int) -> int | None:
    """The device whose memory the mapping at `address` (its start) shows, or None: not a
    mapping (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: where the physical allocation is)."""
    return state.mapping_devices.get(address)


def _check_location(location) -> None:
    """Where memory can be, or be reached from: a device."""
    if location.type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"location type {location.type} is not CU_MEM_LOCATION_TYPE_DEVICE "
                        "(host memory is not supported by vgpu's virtual memory API)")
    state.device_description(location.id)


def _properties(prop) -> list[int]:
    """A CUmemAllocationProp checked, as the values the server keeps for the handle:
    [type, requested handle types, location type, location id, compression, RDMA, usage]."""
    if prop == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "prop is NULL")
    if prop.type != CU_MEM_ALLOCATION_TYPE_PINNED:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"allocation type {prop.type} is not CU_MEM_ALLOCATION_TYPE_PINNED")
    _check_location(prop.location)
    if prop.requestedHandleTypes not in (CU_MEM_HANDLE_TYPE_NONE,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR):
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        f"shareable handle type {prop.requestedHandleTypes} is not supported")
    flags = prop.allocFlags
    # The memory is never compressible: the properties say so, as CUDA tells programs to check.
    return [prop.type, prop.requestedHandleTypes, prop.location.type, prop.location.id,
            CU_MEM_ALLOCATION_COMP_NONE, flags.gpuDirectRDMACapable, flags.usage]


def _check_flags(flags: int) -> None:
    if flags:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "flags must be 0")


@api
def cuMemGetAllocationGranularity(granularity, prop, option):
    check_out(granularity)
    state.require_init()
    _properties(prop)
    if option not in GRANULARITY_OPTIONS:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown granularity option {option}")
    granularity[0] = VMM_GRANULARITY


@api
def cuMemAddressReserve(pptr, size, alignment, addr, flags):
    check_out(pptr)
    _check_flags(flags)
    pptr[0], _ = state.conn().call("cuMemAddressReserve", size, alignment, addr)


@api
def cuMemAddressFree(address, size):
    state.conn().call("cuMemAddressFree", address, size)


@api
def cuMemCreate(handle, size, prop, flags):
    check_out(handle)
    _check_flags(flags)
    properties = _properties(prop)
    new = state.new_handle(Kind.MEMORY)
    state.conn().call("cuMemCreate", new, size, properties)
    state.memory_devices[new] = prop.location.id
    handle[0] = new


@api
def cuMemRelease(handle):
    state.conn().call("cuMemRelease", handle)


@api
def cuMemRetainAllocationHandle(handle, addr):
    check_out(handle)
    handle[0], _ = state.conn().call("cuMemRetainAllocationHandle", ptr(addr))


@api
def cuMemGetAllocationPropertiesFromHandle(prop, handle):
    check_out(prop)
    values, _ = state.conn().call("cuMemGetAllocationPropertiesFromHandle", handle)
    kind, handle_types, location_type, location_id, compression, rdma, usage = values
    ffi.memmove(prop, bytes(ffi.sizeof("CUmemAllocationProp")), ffi.sizeof("CUmemAllocationProp"))
    prop.type, prop.requestedHandleTypes = kind, handle_types
    prop.location.type, prop.location.id = location_type, location_id
    prop.allocFlags.compressionType = compression
    prop.allocFlags.gpuDirectRDMACapable = rdma
    prop.allocFlags.usage = usage


@api
def cuMemMap(address, size, offset, handle, flags):
    _check_flags(flags)
    state.conn().call("cuMemMap", address, size, offset, handle)
    state.add_allocation(address, size, 0)
    state.mappings[address] = 0  # no access until cuMemSetAccess
    state.mapping_devices[address] = state.memory_devices.get(handle, 0)


@api
def cuMemUnmap(address, size):
    unmapped, _ = state.conn().call("cuMemUnmap", address, size)
    for start in unmapped:
        state.remove_allocation(start)
        del state.mappings[start]
        state.mapping_devices.pop(start, None)


@api
def cuMemSetAccess(address, size, desc, count):
    if desc == ffi.NULL or count == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "no access descriptors")
    for i in range(count):
        _check_location(desc[i].location)
    # The devices of a server share the session's memory: the last descriptor counts.
    access = desc[count - 1].flags
    changed, _ = state.conn().call("cuMemSetAccess", address, size, access)
    for start in changed:
        state.mappings[start] = access


@api
def cuMemGetAccess(flags, location, address):
    check_out(flags)
    state.require_init()
    if location == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "location is NULL")
    _check_location(location)
    found = state.find_allocation(address)
    if found is None or found[0] not in state.mappings:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"0x{address:x} is not mapped memory")
    flags[0] = state.mappings[found[0]]


# Sharing physical memory with another process (server/vmm_sharing.py says how): the
# shareable handle is a file descriptor of a sealed memory file holding the server's handle
# of the export, which the program passes on as it would CUDA's (SCM_RIGHTS). Its contents
# prove nothing by themselves: the server checks the handle.

@api
def cuMemExportToShareableHandle(shareable_handle, handle, handle_type, flags):
    check_out(shareable_handle)
    _check_flags(flags)
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        # cuMemCreate allows no other type to be requested, and memory exports only as one
        # its allocation requested.
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"handle type {handle_type} was not requested by the allocation "
                        "(vgpu's exports are CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)")
    exported, _ = state.conn().call("cuMemExportToShareableHandle", handle)
    ffi.cast("int *", shareable_handle)[0] = _memory_file(bytes(exported))


def _memory_file(data: bytes) -> int:
    """A descriptor of a new memory file holding `data`, sealed so nobody changes it."""
    fd = os.memfd_create("vgpu-vmm-export", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, data)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK |
                    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


@api
def cuMemImportFromShareableHandle(handle, os_handle, handle_type):
    check_out(handle)
    state.require_init()
    if handle_type in OTHER_HANDLE_TYPES:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        f"handle type {handle_type} is not supported: vgpu's shareable "
                        "handles are POSIX file descriptors")
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown handle type {handle_type}")
    try:
        exported = os.pread(int(ffi.cast("int", ptr(os_handle))), EXPORT_BYTES + 1, 0)
    except OSError:  # no descriptor, or one of something that is no file
        exported = b""
    if len(exported) != EXPORT_BYTES or not exported.startswith(EXPORT_MARKER):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the file descriptor is not of memory exported with "
                        "cuMemExportToShareableHandle")
    new = state.new_handle(Kind.MEMORY)
    prop, _ = state.conn().call("cuMemImportFromShareableHandle", new, exported)
    state.memory_devices[new] = prop[3]
    handle[0] = new
