"""Managed memory: one pointer for the host and the device, with the contract of a device
without concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 0).

The device's copy is an allocation of the session like any other (the server places it on a
page of its own and journals it, so it moves with checkpoints and migrations). The host's
copy, its view, is anonymous memory this process maps at the very same address: the session's
arena lies where no host memory is, so the address is free here. The two copies agree at the
points where that contract lets each side look:
- before any call goes to the server, what the host changed since they last agreed goes to
  the device (the view compared with a shadow of the last agreed contents, chunk by chunk):
  a kernel reads what the host wrote before its launch, a copy from managed memory copies it;
- when the program has waited for the device (a context, stream or event synchronization, a
  query that finds the work done, a synchronous copy or memset) and work was sent since they
  last agreed, the device's copy is read back into the view: the host reads what kernels
  wrote once it has synchronized.
Between those points the host may touch the view while kernels run; on a GPU with this
contract that would fault, here it is only not seen by the device until the next call.
The same mechanism serves local and remote servers (the copies take the usual paths: shared
memory, direct reads of this process, or messages). The cost is a comparison of every managed
byte per call and a read-back of all of them per synchronization after device work: managed
memory suits small and medium buffers here.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field

from ._state import CudaError, E, api, check_out, ffi, state
from .hostmem import PAGE_SIZE, unmap

CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_SINGLE = 1, 2, 4
CU_MEM_LOCATION_TYPE_INVALID, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST = 0, 1, 2
CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 3, 4
CU_DEVICE_CPU, CU_DEVICE_INVALID = -1, -2
(SET_READ_MOSTLY, UNSET_READ_MOSTLY, SET_PREFERRED_LOCATION, UNSET_PREFERRED_LOCATION,
 SET_ACCESSED_BY, UNSET_ACCESSED_BY) = range(1, 7)
RANGE_READ_MOSTLY, RANGE_PREFERRED_LOCATION, RANGE_ACCESSED_BY, RANGE_LAST_PREFETCH = 1, 2, 3, 4
# The host's changes are looked for and sent in pieces of this size.
COMPARE_CHUNK = 64 << 10
# Calls that neither read nor write device memory: the host's changes can wait for the next
# call that does, and after them there is nothing to read back. (A synchronization's own
# read-back sends the host's changes first: see `settled`.)
NO_MEMORY_ACCESS = frozenset({
    "vgpuSynchronize", "vgpuQuery", "cuMemGetInfo", "cuEventElapsedTime",
    "vgpuDiscardReported", "cuMemAlloc",
    "cuMemAllocManaged", "cuMemFree", "cuStreamCreate", "cuStreamDestroy", "cuEventCreate",
    "cuEventRecord", "cuEventDestroy", "cuStreamWaitEvent", "cuModuleGetFunction",
    "cuCtxSetLimit",
})
# Calls that read device memory without changing it: the host's changes go first, and
# after them there is nothing new to read back.
READING = frozenset({"cuMemcpyDtoH", "vgpuDigest", "vgpuDeviceWindow"})
MAP_FIXED_NOREPLACE = 0x100000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


@dataclass
class ManagedRange:
    size: int
    length: int  # of the host view: whole pages
    shadow: ctypes.Array  # the contents both copies last agreed on
    module_variable: bool = False
    attached: int = CU_MEM_ATTACH_GLOBAL
    read_mostly: bool = False
    preferred: int = CU_DEVICE_INVALID
    accessed_by: set[int] = field(default_factory=set)

    @property
    def shadow_address(self) -> int:
        return ctypes.addressof(self.shadow)


class ManagedMemory:
    """The process's managed ranges and the connection hooks that keep both copies agreed
    (vgpu.client.ManagedHooks). The hooks run under the connection's lock."""

    def __init__(self) -> None:
        self.ranges: dict[int, ManagedRange] = {}
        self._device_wrote = False  # work that may write device memory went since agreeing
        self._busy = threading.local()  # inside our own copies: they need no hooks

    # ----------------------------------------------------------------- hooks

    def before(self, op: str) -> None:
        if op in NO_MEMORY_ACCESS or getattr(self._busy, "on", False):
            return
        self._send_host_changes()
        if op not in READING:
            self._device_wrote = True

    def settled(self) -> None:
        if getattr(self._busy, "on", False) or not self._device_wrote:
            return
        self._send_host_changes()  # what the host wrote meanwhile is not to be overwritten
        self._busy.on = True
        try:
            conn = state.conn()
            for address, managed in list(self.ranges.items()):
                conn.read_device("cuMemcpyDtoH", address, address, managed.size)
                ctypes.memmove(managed.shadow_address, address, managed.size)
        finally:
            self._busy.on = False
        self._device_wrote = False

    def _send_host_changes(self) -> None:
        self._busy.on = True
        try:
            for address, managed in list(self.ranges.items()):
                for start, length in _changed_runs(address, managed):
                    state.conn().write_device("cuMemcpyHtoD", address + start, address + start,
                                              length)
                    ctypes.memmove(managed.shadow_address + start, address + start, length)
        finally:
            self._busy.on = False

    # ----------------------------------------------------------------- ranges

    def add(self, address: int, size: int, module_variable: bool) -> None:
        """Map the host view of device memory at its address; its contents are read now."""
        length = -(-size // PAGE_SIZE) * PAGE_SIZE
        placed = _libc.mmap(address, length, 0x3, 0x22 | MAP_FIXED_NOREPLACE, -1, 0)
        if placed != address:
            if placed not in (None, ctypes.c_void_p(-1).value):
                unmap(placed, length)  # a kernel without MAP_FIXED_NOREPLACE put it elsewhere
            raise CudaError(E.CUDA_ERROR_OUT_OF_MEMORY,
                            f"cannot map the host view of managed memory at 0x{address:x}: "
                            f"the address is taken in this process")
        managed = ManagedRange(size, length, (ctypes.c_char * size)(), module_variable)
        conn = state.conn()
        conn.managed = self
        self._busy.on = True
        try:
            conn.read_device("cuMemcpyDtoH", address, address, size)
        finally:
            self._busy.on = False
        ctypes.memmove(managed.shadow_address, address, size)
        self.ranges[address] = managed

    def remove(self, address: int) -> None:
        managed = self.ranges.pop(address, None)
        if managed is not None:
            unmap(address, managed.length)

    def find(self, address: int, count: int) -> tuple[int, ManagedRange]:
        """The managed range holding [address, address + count); CUDA_ERROR_INVALID_VALUE
        for memory that is not managed."""
        for start, managed in self.ranges.items():
            if start <= address and address + max(count, 1) <= start + managed.size:
                return start, managed
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x}+{count} is not managed memory")


def _changed_runs(address: int, managed: ManagedRange) -> list[tuple[int, int]]:
    """(offset, length) runs of chunks where the host view differs from the shadow."""
    runs: list[tuple[int, int]] = []
    shadow = managed.shadow_address
    for offset in range(0, managed.size, COMPARE_CHUNK):
        n = min(COMPARE_CHUNK, managed.size - offset)
        if _libc.memcmp(address + offset, shadow + offset, n) == 0:
            continue
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + n)
        else:
            runs.append((offset, n))
    return runs


managed_memory = ManagedMemory()


def _after_fork_in_child() -> None:
    """A forked child opens a session of its own, which holds none of the parent's managed
    memory (its copies of the host views stay mapped, as any memory of the parent's)."""
    managed_memory.ranges.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def is_managed(address: int) -> bool:
    return address in managed_memory.ranges


def settle() -> None:
    """A synchronous copy or memset returns: the host sees managed memory as the device
    left it, as after a synchronization."""
    if state.connection is not None and state.connection.managed is not None:
        state.connection.synchronize()


def allocate(size: int, flags: int) -> int:
    context = state.current_context()
    if size == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes")
    if flags not in (CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"managed memory flags must be CU_MEM_ATTACH_GLOBAL or "
                        f"CU_MEM_ATTACH_HOST, not 0x{flags:x}")
    conn = state.conn()
    address, _ = conn.call("cuMemAllocManaged", context, size)
    try:
        managed_memory.add(address, size, module_variable=False)
    except CudaError:
        conn.post("cuMemFree", address)
        raise
    managed_memory.ranges[address].attached = flags
    state.add_allocation(address, size, context)
    return address


def release(address: int) -> None:
    """The managed allocation at `address` is freed: its host view goes."""
    managed_memory.remove(address)


def add_module_variables(variables: dict[str, tuple[int, int]], names) -> None:
    for name in names:
        address, size = variables[name]
        managed_memory.add(address, size, module_variable=True)



# ----------------------------------------------------------------- the driver API

@api
def cuMemAllocManaged(dptr, bytesize, flags):
    check_out(dptr)
    dptr[0] = allocate(bytesize, flags)


def _device_ordinal_valid(ordinal: int) -> bool:
    return 0 <= ordinal < len(state.devices)


def _location(location) -> int:
    """A CUmemLocation as a device ordinal (CU_DEVICE_CPU for the host)."""
    kind, ordinal = int(location.type), int(location.id)
    if kind == CU_MEM_LOCATION_TYPE_DEVICE:
        if not _device_ordinal_valid(ordinal):
            raise CudaError(E.CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {ordinal}")
        return ordinal
    if kind in (CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
                CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT):
        return CU_DEVICE_CPU
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"invalid memory location type {kind}")


def prefetch(address: int, count: int, device: int, stream) -> None:
    """No prefetch on a device without concurrent managed access, as CUDA says."""
    from .memory import _check_stream  # memory.py imports this module

    _check_stream(stream)
    state.current_context()
    managed_memory.find(address, count)
    raise CudaError(E.CUDA_ERROR_INVALID_DEVICE,
                    "prefetching managed memory needs a device with concurrent managed "
                    "access; this one has none (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS "
                    "is 0)")


@api
def cuMemPrefetchAsync(dev_ptr, count, dst_device, stream):
    prefetch(dev_ptr, count, dst_device, stream)


@api
def cuMemPrefetchAsync_v2(dev_ptr, count, location, flags, stream):
    if flags:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "prefetch flags must be 0")
    prefetch(dev_ptr, count, _location(location), stream)


def advise(address: int, count: int, advice: int, device: int) -> None:
    """Advice is a hint: kept (cuMemRangeGetAttribute reports it), changing nothing."""
    state.current_context()
    _, managed = managed_memory.find(address, count)
    if advice == SET_READ_MOSTLY:
        managed.read_mostly = True
    elif advice == UNSET_READ_MOSTLY:
        managed.read_mostly = False
    elif advice == SET_PREFERRED_LOCATION:
        managed.preferred = device
    elif advice == UNSET_PREFERRED_LOCATION:
        managed.preferred = CU_DEVICE_INVALID
    elif advice == SET_ACCESSED_BY:
        managed.accessed_by.add(device)
    elif advice == UNSET_ACCESSED_BY:
        managed.accessed_by.discard(device)
    else:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown memory advice {advice}")


def _advice_device(advice: int, device: int) -> int:
    if advice in (SET_PREFERRED_LOCATION, SET_ACCESSED_BY) and device != CU_DEVICE_CPU \
            and not _device_ordinal_valid(device):
        raise CudaError(E.CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {device}")
    return device


@api
def cuMemAdvise(dev_ptr, count, advice, device):
    advise(dev_ptr, count, advice, _advice_device(advice, device))


@api
def cuMemAdvise_v2(dev_ptr, count, advice, location):
    needs_location = advice in (SET_PREFERRED_LOCATION, SET_ACCESSED_BY)
    device = _location(location) if needs_location else CU_DEVICE_INVALID
    advise(dev_ptr, count, advice, device)


@api
def cuMemRangeGetAttribute(data, data_size, attribute, dev_ptr, count):
    check_out(data)
    state.current_context()
    _, managed = managed_memory.find(dev_ptr, count)
    if attribute == RANGE_READ_MOSTLY:
        values = [int(managed.read_mostly)]
    elif attribute == RANGE_PREFERRED_LOCATION:
        values = [managed.preferred]
    elif attribute == RANGE_LAST_PREFETCH:
        values = [CU_DEVICE_INVALID]  # nothing was ever prefetched (see prefetch)
    elif attribute == RANGE_ACCESSED_BY:
        if data_size % 4 or data_size == 0:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "dataSize must be a multiple of 4")
        values = sorted(managed.accessed_by)[:data_size // 4]
        values += [CU_DEVICE_INVALID] * (data_size // 4 - len(values))
    else:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unsupported range attribute {attribute}")
    if attribute != RANGE_ACCESSED_BY and data_size != 4:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "dataSize must be 4")
    out = ffi.cast("int *", data)
    for i, value in enumerate(values):
        out[i] = value


def attach(stream, address: int, length: int, flags: int) -> None:
    """Which stream's work may touch the memory: every call here keeps both copies agreed at
    every synchronization, so the association only needs checking and keeping."""
    from .memory import _check_stream

    handle = _check_stream(stream)
    state.current_context()
    if flags not in (CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_SINGLE):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"invalid attach flags 0x{flags:x}")
    managed = managed_memory.ranges.get(address)
    if managed is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not the start of managed memory")
    if length not in (0, managed.size) and not managed.module_variable:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "length must be 0 (the whole allocation) for managed allocations")
    if flags == CU_MEM_ATTACH_SINGLE and handle in (0, 1):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "memory cannot be attached singly to the NULL stream")
    managed.attached = flags


@api
def cuStreamAttachMemAsync(stream, dptr, length, flags):
    attach(stream, dptr, length, flags)

