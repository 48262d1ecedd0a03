"""Device memory, page-locked host memory, copies, memsets, pointer queries, memory pools."""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct

from . import graph_capture, graph_memory, ipc, managed
from ._state import (
    CudaError,
    E,
    HostAllocation,
    Kind,
    MemoryPool,
    api,
    check_out,
    ffi,
    handle_of,
    ptr,
    state,
)
from .hostmem import (
    is_mapped,
    map_anonymous,
    map_shared,
    page_range,
    share_in_place,
    shared_file_at,
    unmap,
    unshare_in_place,
)
from .vmm import mapped_access, mapped_device

CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 1, 2, 3, 4
PITCH_ALIGNMENT = 512


# ----------------------------------------------------------------- device memory

def _alloc(size: int) -> int:
    graph_capture.forbid_unsafe("allocating device memory")
    return allocate(size)


def allocate(size: int, context: int | None = None) -> int:
    """Device memory now (in `context`, else the current one), whatever a stream capture
    forbids (graph memory nodes and conditional handles take theirs when they are made)."""
    if context is None:
        context = state.current_context()
    if size == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes")
    address, _ = state.conn().call("cuMemAlloc", context, size)
    state.add_allocation(address, size, context)
    return address


@api
def cuMemAlloc_v2(dptr, bytesize):
    check_out(dptr)
    dptr[0] = _alloc(bytesize)


@api
def cuMemAllocPitch_v2(dptr, pitch, width, height, element_size):
    check_out(dptr)
    check_out(pitch)
    if element_size not in (4, 8, 16) or width == 0 or height == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "invalid pitched allocation request")
    row = (width + PITCH_ALIGNMENT - 1) // PITCH_ALIGNMENT * PITCH_ALIGNMENT
    dptr[0] = _alloc(row * height)
    pitch[0] = row


def _free(address: int) -> None:
    state.current_context()
    if address not in state.allocations or address in state.module_variables \
            or address in state.mappings or address in state.ipc_opened:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not the start of a live allocation")
    state.remove_allocation(address)
    state.conn().post("cuMemFree", address)
    managed.release(address)


@api
def cuMemFree_v2(dptr):
    if dptr == 0:  # nothing to free: NVIDIA's runtime hands on cudaFree(NULL) as this, and
        return  # its programs see success
    _free(dptr)


@api
def cuMemGetInfo_v2(free, total):
    check_out(free)
    check_out(total)
    state.current_context()
    (free[0], total[0]), _ = state.conn().call("cuMemGetInfo")


@api
def cuMemGetAddressRange_v2(pbase, psize, dptr):
    found = state.find_allocation(dptr)
    if found is None:  # device-mapped page-locked host memory is in the device's space too
        host = state.find_host(dptr)
        if host is not None and host[1].device_pointer is not None:
            found = host[0], host[1].size
    if found is None:
        raise CudaError(E.CUDA_ERROR_NOT_FOUND, f"0x{dptr:x} is not in a device allocation")
    if pbase != ffi.NULL:
        pbase[0] = found[0]
    if psize != ffi.NULL:
        psize[0] = found[1]


# ----------------------------------------------------------------- page-locked host memory

def _host_alloc(size: int, flags: int) -> int:
    state.current_context()
    if size == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes")
    conn = state.conn()
    if not conn.shares_host_memory:  # a remote server (or a standby) cannot: plain memory
        address = map_anonymous(size)
        state.host_allocations[address] = HostAllocation(size, flags, None)
        return address
    # Kernels reach the memory at its address. A server whose device sees host memory at
    # host addresses maps it at this one in its own process, which is now and then taken
    # there: another address is tried (the refused ones kept until then, so that none
    # comes back), and after a few, the memory serves copies only.
    refused = []
    try:
        for _ in range(_HOST_ADDRESS_TRIES):
            address, segment, unreached = _shared_host_buffer(size)
            if unreached is None:
                break
            refused.append((address, segment))
        else:
            address, segment = refused.pop()
            if flags & CU_MEMHOSTALLOC_DEVICEMAP:
                _drop_host_buffer(address, segment, size)
                raise CudaError(E.CUDA_ERROR_OUT_OF_MEMORY,
                                f"no host memory the device can map: {unreached}")
    finally:
        for other, other_segment in refused:
            _drop_host_buffer(other, other_segment, size)
    device_pointer = address if unreached is None else None
    state.host_allocations[address] = HostAllocation(size, flags, segment, None, device_pointer)
    return address


_HOST_ADDRESS_TRIES = 4


def _shared_host_buffer(size: int) -> tuple[int, int, str | None]:
    """A new memory file mapped here and by the server, shown to the device at its address:
    (address, segment, why kernels do not reach it or None)."""
    try:
        address, fd = map_shared(size)
    except OSError as exc:
        raise CudaError(E.CUDA_ERROR_OUT_OF_MEMORY, f"cannot allocate host memory: {exc}") from None
    segment = state.new_segment_id()
    try:
        unreached, _ = state.conn().call("vgpuMapHostSegment", segment, fd, size, address)
    except CudaError:
        unmap(address, size)
        raise
    finally:
        os.close(fd)  # both ends have mapped the file (or the server never will)
    return address, segment, unreached


def _drop_host_buffer(address: int, segment: int, size: int) -> None:
    state.conn().call("vgpuUnmapHostSegment", segment)
    unmap(address, size)


@api
def cuMemAllocHost_v2(pp, bytesize):
    check_out(pp)
    pp[0] = ffi.cast("void *", _host_alloc(bytesize, 0))


@api
def cuMemHostAlloc(pp, bytesize, flags):
    check_out(pp)
    if flags & ~0x7:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown cuMemHostAlloc flags 0x{flags:x}")
    pp[0] = ffi.cast("void *", _host_alloc(bytesize, flags))


@api
def cuMemFreeHost(p):
    address = ptr(p)
    if address == 0:  # as cuMemFree: NVIDIA's runtime hands on cudaFreeHost(NULL) as this
        return
    alloc = state.host_allocations.get(address)
    if alloc is None or alloc.flags & _REGISTERED:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"0x{address:x} was not allocated by "
                                                    "cuMemAllocHost/cuMemHostAlloc")
    del state.host_allocations[address]
    if alloc.segment is not None:
        state.conn().call("vgpuUnmapHostSegment", alloc.segment)
    unmap(address, alloc.size)


@api
def cuMemHostGetDevicePointer_v2(pdptr, p, flags):
    check_out(pdptr)
    if flags != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "flags must be 0")
    pdptr[0] = _host_device_pointer(ptr(p))


def _host_device_pointer(address: int) -> int:
    state.current_context()
    found = state.find_host(address)
    if found is None or found[1].device_pointer is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the pointer is not in device-mapped page-locked host memory")
    return address  # unified addressing: device pointer == host pointer


@api
def cuMemHostGetFlags(pflags, p):
    check_out(pflags)
    found = state.find_host(ptr(p))
    if found is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "not page-locked host memory")
    pflags[0] = found[1].flags & ~_REGISTERED


# Registered (cuMemHostRegister) memory is marked so cuMemFreeHost refuses it.
_REGISTERED = 1 << 30


@api
def cuMemHostRegister_v2(p, bytesize, flags):
    state.current_context()
    address = ptr(p)
    if address == 0 or bytesize == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "NULL pointer or zero size")
    if state.find_host(address) or state.find_host(address + bytesize - 1):
        raise CudaError(E.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "already registered")
    alloc = HostAllocation(bytesize, flags | _REGISTERED, None)
    if not _share_registered(address, alloc) and flags & CU_MEMHOSTREGISTER_DEVICEMAP:
        # The server cannot see these pages; say so rather than pretend.
        if state.conn().failover:
            raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                            "vgpu cannot map host memory into the device for a session with "
                            "standby servers (VGPU_SERVER lists several)")
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        "vgpu can map registered host memory into the device only for a server "
                        "on this host, for heap or anonymous memory whose pages no other "
                        "registration shares; use cuMemHostAlloc")
    state.host_allocations[address] = alloc


def _share_registered(address: int, alloc: HostAllocation) -> bool:
    """With unified addressing, registered memory is device memory too: a kernel may use it
    through its device pointer (the same address). Its pages are shared with a server on
    this host in place (hostmem.share_in_place), or through the memory file they are mapped
    from already (hostmem.shared_file_at); a page backs one segment, so memory sharing a
    page with another mapped registration stays host-only, as it does for a remote server.
    A server that cannot show the pages to kernels keeps them for copies only (registered
    with CU_MEMHOSTREGISTER_DEVICEMAP: refused, saying why)."""
    conn = state.conn()
    if not conn.shares_host_memory:
        return False
    start, length = page_range(address, alloc.size)
    for other_start, other in state.host_allocations.items():
        if other.flags & _REGISTERED and other.segment is not None:
            low, other_length = page_range(other_start, other.size)
            if low < start + length and start < low + other_length:
                return False
    found = shared_file_at(start, start + length)
    if found is not None:  # the file is this process's already: it stays open
        fd, length, start = found
    else:
        try:
            fd = share_in_place(address, alloc.size)
        except OSError:
            return False
        if fd is None:
            return False
        alloc.shared_in_place = True
    segment = state.new_segment_id()
    try:
        unreached, _ = conn.call("vgpuMapHostSegment", segment, fd, length, start)
    except CudaError:
        _unshare(address, alloc)
        raise
    finally:
        if alloc.shared_in_place:
            os.close(fd)  # both ends have mapped the file (or the server never will)
    if unreached is not None and alloc.flags & CU_MEMHOSTREGISTER_DEVICEMAP:
        conn.call("vgpuUnmapHostSegment", segment)
        _unshare(address, alloc)
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        f"the server cannot map this host memory into the device: {unreached}")
    alloc.segment, alloc.segment_offset = segment, address - start
    alloc.device_pointer = address if unreached is None else None
    return True


def _unshare(address: int, alloc: HostAllocation) -> None:
    """The pages of a registration private again, where it made them shared."""
    if alloc.shared_in_place:
        unshare_in_place(address, alloc.size)


@api
def cuMemHostUnregister(p):
    address = ptr(p)
    alloc = state.host_allocations.get(address)
    if alloc is None or not alloc.flags & _REGISTERED:
        raise CudaError(E.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "not registered")
    del state.host_allocations[address]
    if alloc.segment is not None:  # after the work queued on it, the pages are private again
        state.conn().call("vgpuUnmapHostSegment", alloc.segment)
        _unshare(address, alloc)


# ----------------------------------------------------------------- copies

def _pinned_spec(address: int, size: int):
    """The server-visible location of pinned host memory, or None for pageable memory."""
    found = state.find_host(address)
    if found is None or found[1].segment is None:
        return None
    start, alloc = found
    if address + size > start + alloc.size:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "copy runs past the host allocation")
    return ["seg", alloc.segment, address - start + alloc.segment_offset]


def _check_stream(stream) -> int:
    """The handle of the stream a call puts work on; while any stream captures, the call
    may be recorded into a graph instead (graph_capture.enter_stream)."""
    handle = stream_handle(stream)
    if graph_capture.captures:
        graph_capture.enter_stream(handle)
    return handle


def stream_handle(stream) -> int:
    if not stream:  # the NULL stream, what most launches and copies name
        return 0
    handle = ptr(stream)
    if handle in (1, 2):  # CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
        return handle
    return handle_of(stream, Kind.STREAM, state.streams)


@contextlib.contextmanager
def issued_on(stream):
    """Copies and memsets issued inside, on `stream`: the server runs streams other than
    the legacy one beside each other (server/streams.py), so those name their stream, and
    wait for its work only (vgpuStreamScope). Recorded into a graph, they run in the scope
    of the stream the graph is launched on (server/graphs.py)."""
    handle = _check_stream(stream)
    if handle in (0, 1) or state.recorder() is not None:
        yield handle
        return
    conn = state.conn()
    conn.streams_used = True
    with conn.issued_on(handle):  # the scope is this thread's: see Connection.issued_on
        yield handle


def _check_host_range(address: int, size: int, side: str) -> None:
    """Host memory this process reads or writes itself must be there (see is_mapped)."""
    if address == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{side} pointer is NULL")
    if not is_mapped(address, size):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{side} 0x{address:x}+{size} is neither "
                                                    "device memory nor host memory of this process")


def _htod(dst: int, src: int, size: int, queued: bool) -> None:
    state.current_context()
    if size == 0:
        return
    if src == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "source pointer is NULL")
    for offset, n in state.device_pieces(dst, size):
        _htod_piece(dst + offset, src + offset, n, queued)
    if not queued:
        managed.settle()


def _htod_piece(dst: int, src: int, size: int, queued: bool) -> None:
    spec = _pinned_spec(src, size)
    conn = state.conn()
    if spec is None:
        _check_host_range(src, size, "source")
        conn.write_device("cuMemcpyHtoD", dst, src, size)
    elif queued:
        conn.post("cuMemcpyHtoD", dst, spec, size)
    else:  # synchronous from pinned memory: the buffer is the app's again once we return
        conn.call("cuMemcpyHtoD", dst, spec, size)


def _dtoh(dst: int, src: int, size: int, queued: bool) -> None:
    state.current_context()
    if size == 0:
        return
    if dst == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "destination pointer is NULL")
    for offset, n in state.device_pieces(src, size):
        _dtoh_piece(dst + offset, src + offset, n, queued)
    if not queued:
        managed.settle()


def _dtoh_piece(dst: int, src: int, size: int, queued: bool) -> None:
    spec = _pinned_spec(dst, size)
    conn = state.conn()
    if spec is None:
        _check_host_range(dst, size, "destination")
        conn.read_device("cuMemcpyDtoH", src, dst, size)
    elif queued:
        conn.post("cuMemcpyDtoH", src, size, spec)
    else:
        conn.call("cuMemcpyDtoH", src, size, spec)


def _dtod(dst: int, src: int, size: int) -> None:
    state.current_context()
    if size == 0:
        return
    # Pieces inside one allocation on both sides: where either side's pieces end.
    ends = {offset + n for offset, n in state.device_pieces(dst, size)}
    ends.update(offset + n for offset, n in state.device_pieces(src, size))
    start = 0
    for end in sorted(ends):
        state.conn().post("cuMemcpyDtoD", dst + start, src + start, end - start)
        start = end


@api
def cuMemcpyHtoD_v2(dst, src, size):
    _htod(dst, ptr(src), size, queued=False)


@api
def cuMemcpyHtoDAsync_v2(dst, src, size, stream):
    with issued_on(stream):
        _htod(dst, ptr(src), size, queued=True)


@api
def cuMemcpyDtoH_v2(dst, src, size):
    _dtoh(ptr(dst), src, size, queued=False)


@api
def cuMemcpyDtoHAsync_v2(dst, src, size, stream):
    with issued_on(stream):
        _dtoh(ptr(dst), src, size, queued=True)


@api
def cuMemcpyDtoD_v2(dst, src, size):
    _dtod(dst, src, size)
    managed.settle()


@api
def cuMemcpyDtoDAsync_v2(dst, src, size, stream):
    with issued_on(stream):
        _dtod(dst, src, size)


def _is_device(address: int) -> bool:
    return state.find_allocation(address) is not None


def _copy_unified(dst: int, src: int, size: int, queued: bool) -> None:
    """cuMemcpy with unified addressing: the pointers themselves say where they live."""
    dst_dev, src_dev = _is_device(dst), _is_device(src)
    if dst_dev and src_dev:
        _dtod(dst, src, size)
        if not queued:
            managed.settle()
    elif dst_dev:
        _htod(dst, src, size, queued)
    elif src_dev:
        _dtoh(dst, src, size, queued)
    else:
        state.current_context()
        host_to_host(dst, src, size)


def _device_maps(address: int, size: int) -> bool:
    """Whether [address, address + size) is page-locked host memory the device maps."""
    found = state.find_host(address)
    return found is not None and found[1].device_pointer is not None and \
        address + size <= found[0] + found[1].size


def host_to_host(dst: int, src: int, size: int) -> None:
    """A copy between two host buffers, in order with the work queued before it."""
    _host_rows(dst, size, src, size, size, 1)


def _host_rows(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int,
               height: int) -> None:
    """Rows copied between host buffers. Queued copies, memsets and kernels may still read or
    write page-locked memory (pageable memory they never touch later than their call), so the
    copy waits for them first."""
    if width == 0 or height == 0:
        return
    _check_host_range(src, (height - 1) * src_pitch + width, "source")
    _check_host_range(dst, (height - 1) * dst_pitch + width, "destination")

    def copy(_=None) -> None:
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    recorder = state.recorder()
    if recorder is not None:
        if _device_maps(src, (height - 1) * src_pitch + width) and \
                _device_maps(dst, (height - 1) * dst_pitch + width):
            # Both sides are pinned memory the device maps: the device copies it (graphs
            # that kernels launch may hold such copies)
            for row in range(height):
                _dtod(dst + row * dst_pitch, src + row * src_pitch, width)
            return
        recorder.host_step(copy)  # a graph's host-to-host copy: the client's, when it runs
        return
    if state.find_host(src) is not None or state.find_host(dst) is not None:
        state.conn().synchronize()
    copy()


@api
def cuMemcpy(dst, src, size):
    _copy_unified(dst, src, size, queued=False)


@api
def cuMemcpyAsync(dst, src, size, stream):
    with issued_on(stream):
        _copy_unified(dst, src, size, queued=True)


def _copy_2d(p, queued: bool) -> None:
    """CUDA_MEMCPY2D, row by row (one copy when both sides are contiguous)."""
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "CUDA_MEMCPY2D pointer is NULL")
    width, height = p.WidthInBytes, p.Height
    src_dev, src, src_pitch = copy_side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcArray,
                                        p.srcXInBytes, p.srcY, p.srcPitch or width, width,
                                        height)
    dst_dev, dst, dst_pitch = copy_side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstArray,
                                        p.dstXInBytes, p.dstY, p.dstPitch or width, width,
                                        height)
    copy_rows(dst_dev, dst, dst_pitch, src_dev, src, src_pitch, width, height, queued)


def copy_side(memory_type, host, device, array, x, y, pitch, width, height
              ) -> tuple[bool, int, int]:
    """One side of a 2D or 3D copy: (on the device?, address of its first byte, pitch). A
    CUDA array's rows are its own pitch apart, whatever the copy says."""
    if memory_type == CU_MEMORYTYPE_ARRAY:
        found = state.arrays.get(ptr(array))
        if found is None:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the copy names no live CUDA array")
        if x + width > found.pitch or y + height > max(found.height, 1):
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the copy runs past the CUDA array")
        return True, found.address + y * found.pitch + x, found.pitch
    if pitch < width:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "pitch smaller than the row width")
    if memory_type == CU_MEMORYTYPE_HOST:
        # With unified addressing the pointer's own location decides, as NVIDIA's driver
        # does: its runtime turns cudaMemcpy(..., cudaMemcpyHostToHost) into a 2D copy of
        # two host sides, and a device pointer given there is copied from the device.
        start = ptr(host)
        return _is_device(start), start + y * pitch + x, pitch
    if memory_type == CU_MEMORYTYPE_DEVICE:
        return True, device + y * pitch + x, pitch
    if memory_type == CU_MEMORYTYPE_UNIFIED:
        return _is_device(device), device + y * pitch + x, pitch
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown memory type {memory_type}")


def copy_rows(dst_dev: bool, dst: int, dst_pitch: int, src_dev: bool, src: int,
               src_pitch: int, width: int, height: int, queued: bool) -> None:
    """A 2D copy between pitched rows, one copy when both sides are contiguous."""
    if not (src_dev or dst_dev):
        _host_rows(dst, dst_pitch, src, src_pitch, width, height)
        return
    rows = [(0, width * height)] if src_pitch == dst_pitch == width else \
        [(r, width) for r in range(height)]
    for row, n in rows:
        s, d = src + row * src_pitch, dst + row * dst_pitch
        if src_dev and dst_dev:
            _dtod(d, s, n)
        elif dst_dev:
            _htod(d, s, n, queued)
        else:
            _dtoh(d, s, n, queued)


@api
def cuMemcpy2D_v2(p):
    _copy_2d(p, queued=False)


cuMemcpy2DUnaligned_v2 = cuMemcpy2D_v2


@api
def cuMemcpy2DAsync_v2(p, stream):
    with issued_on(stream):
        _copy_2d(p, queued=True)


# ----------------------------------------------------------------- memsets

def _memset(dst: int, element: bytes, count: int, queued: bool = True) -> None:
    """A memset, queued; a synchronous one (`queued=False`) on page-locked host memory
    completes before it returns, as CUDA's does, for the host may read it next."""
    state.current_context()
    if count == 0:
        return
    if dst % len(element):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "memset destination is misaligned")
    conn = state.conn()
    for offset, n in state.device_pieces(dst, len(element) * count):
        if queued or state.find_allocation(dst) is not None:
            conn.post("vgpuMemset", dst + offset, element, n // len(element))
        else:
            conn.call("vgpuMemset", dst + offset, element, n // len(element))
    if not queued:  # CUDA's memset of managed memory completes before it returns
        managed.settle()


@api
def cuMemsetD8_v2(dst, value, count):
    _memset(dst, struct.pack("<B", value & 0xFF), count, queued=False)


@api
def cuMemsetD16_v2(dst, value, count):
    _memset(dst, struct.pack("<H", value & 0xFFFF), count, queued=False)


@api
def cuMemsetD32_v2(dst, value, count):
    _memset(dst, struct.pack("<I", value & 0xFFFFFFFF), count, queued=False)


@api
def cuMemsetD8Async(dst, value, count, stream):
    with issued_on(stream):
        _memset(dst, struct.pack("<B", value & 0xFF), count)


@api
def cuMemsetD16Async(dst, value, count, stream):
    with issued_on(stream):
        _memset(dst, struct.pack("<H", value & 0xFFFF), count)


@api
def cuMemsetD32Async(dst, value, count, stream):
    with issued_on(stream):
        _memset(dst, struct.pack("<I", value & 0xFFFFFFFF), count)


def _memset_2d(dst: int, pitch: int, element: bytes, width: int, height: int,
               queued: bool = True) -> None:
    for row in range(height):
        _memset(dst + row * pitch, element, width, queued)


@api
def cuMemsetD2D8_v2(dst, pitch, value, width, height):
    _memset_2d(dst, pitch, struct.pack("<B", value & 0xFF), width, height, queued=False)


@api
def cuMemsetD2D32_v2(dst, pitch, value, width, height):
    _memset_2d(dst, pitch, struct.pack("<I", value & 0xFFFFFFFF), width, height, queued=False)


@api
def cuMemsetD2D8Async(dst, pitch, value, width, height, stream):
    with issued_on(stream):
        _memset_2d(dst, pitch, struct.pack("<B", value & 0xFF), width, height)


# ----------------------------------------------------------------- pointer attributes

# The C type CUDA writes for each CUpointer_attribute (cuda.h's CUpointer_attribute_enum;
# P2P_TOKENS, 5, is not supported). Booleans are written as unsigned int.
_POINTER_ATTRIBUTE_TYPES = {
    1: "CUcontext",  # CONTEXT
    2: "unsigned int",  # MEMORY_TYPE
    3: "CUdeviceptr",  # DEVICE_POINTER
    4: "void *",  # HOST_POINTER
    6: "unsigned int",  # SYNC_MEMOPS
    7: "unsigned long long",  # BUFFER_ID
    8: "unsigned int",  # IS_MANAGED
    9: "int",  # DEVICE_ORDINAL
    10: "unsigned int",  # IS_LEGACY_CUDA_IPC_CAPABLE
    11: "CUdeviceptr",  # RANGE_START_ADDR
    12: "size_t",  # RANGE_SIZE
    13: "unsigned int",  # MAPPED
    14: "unsigned long long",  # ALLOWED_HANDLE_TYPES
    15: "unsigned int",  # IS_GPU_DIRECT_RDMA_CAPABLE
    16: "unsigned int",  # ACCESS_FLAGS
    17: "CUmemoryPool",  # MEMPOOL_HANDLE
    18: "size_t",  # MAPPING_SIZE
    19: "CUdeviceptr",  # MAPPING_BASE_ADDR
    20: "unsigned long long",  # MEMORY_BLOCK_ID
    21: "unsigned int",  # IS_HW_DECOMPRESS_CAPABLE
}
CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE = 0x3


def _pointer_attribute_type(attribute: int) -> str:
    ctype = _POINTER_ATTRIBUTE_TYPES.get(attribute)
    if ctype is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unsupported pointer attribute {attribute}")
    return ctype


def _pointer_attributes(address: int) -> dict[int, int]:
    """The value of every CUpointer_attribute (by number) of `address`; CudaError for an
    unknown pointer."""
    device = state.find_allocation(address)
    host = state.find_host(address)
    if device is None and host is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"0x{address:x} is not known to CUDA")
    context = state.allocation_context[device[0]] if device else state.current_context()
    start, size = device if device else (host[0], host[1].size)
    mapped_device = device is not None or host[1].device_pointer is not None
    is_managed = device is not None and managed.is_managed(start)
    pool = state.pool_of.get(start) if device is not None else None
    from_pool = pool is not None
    return {
        1: context,
        2: CU_MEMORYTYPE_DEVICE if device else CU_MEMORYTYPE_HOST,
        3: address if mapped_device else 0,
        4: address if not device or is_managed else 0,
        6: 1,
        7: start,
        8: int(is_managed),
        9: _device_ordinal(start, context),
        10: 0,  # no IPC
        11: start,
        12: size,
        13: 1,
        14: pool.handle_types if from_pool else 0,  # what the allocation exports as
        15: 0,
        16: _access_flags(start) if mapped_device else 0,
        17: pool.handle if from_pool else 0,
        18: size,
        19: start,
        20: start,
        21: 0,
    }


def _device_ordinal(start: int, context: int) -> int:
    """The device memory at `start` is on: a mapping's physical allocation's, else the
    allocating context's."""
    mapped = mapped_device(start)
    if mapped is not None:
        return mapped
    return state.contexts[context]["device"] if context in state.contexts else 0


def _access_flags(start: int) -> int:
    """What device memory allows: all of cuMemAlloc's; a mapping's, what cuMemSetAccess
    gave it (CUmemAccess_flags and CUpointer_attribute's flags number them alike)."""
    access = mapped_access(start)
    return CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE if access is None else access


def _write(data, ctype: str, value) -> None:
    if ctype in ("CUcontext", "void *", "CUmemoryPool"):
        ffi.cast(f"{ctype} *", data)[0] = ffi.cast(ctype, value)
    else:
        ffi.cast(f"{ctype} *", data)[0] = value


@api
def cuPointerGetAttribute(data, attribute, dptr):
    check_out(data)
    state.require_init()
    ctype = _pointer_attribute_type(attribute)
    _write(data, ctype, _pointer_attributes(dptr)[attribute])


@api
def cuPointerGetAttributes(num_attributes, attributes, data, dptr):
    state.require_init()
    if num_attributes and (attributes == ffi.NULL or data == ffi.NULL):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "attributes or data is NULL")
    types = [_pointer_attribute_type(attributes[i]) for i in range(num_attributes)]
    try:
        values = _pointer_attributes(dptr)
    except CudaError:
        # For unknown pointers this call reports "not CUDA memory" instead of failing:
        # every output gets its type's zero, all of it.
        values = None
    for i, ctype in enumerate(types):
        if data[i] != ffi.NULL:
            _write(data[i], ctype, values[attributes[i]] if values is not None else 0)


# ----------------------------------------------------------------- stream-ordered allocation

@api
def cuDeviceGetDefaultMemPool(pool, dev):
    check_out(pool)
    state.require_init()
    state.device_description(dev)
    pool[0] = ffi.cast("CUmemoryPool", state.default_pool().handle)


# CUmemPoolProps values vgpu's pools take: pinned device memory, exportable as a POSIX file
# descriptor or not at all.
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_ACCESS_FLAGS = (0, 1, 3)  # none, read, read-write
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
POOL_FD_MARKER = b"vgpu-mempool\0\0\0\0"


@api
def cuDeviceGetMemPool(pool, dev):
    check_out(pool)
    state.require_init()
    state.device_description(dev)
    pool[0] = ffi.cast("CUmemoryPool", _device_pool(dev).handle)


def _device_pool(device: int):
    """The pool cuMemAllocAsync takes from on `device` (cuDeviceSetMemPool's, or the default)."""
    default = state.default_pool()
    return state.pools.get(state.device_pools.get(device, default.handle), default)


@api
def cuDeviceSetMemPool(dev, pool):
    state.require_init()
    state.device_description(dev)
    p = _pool_arg(pool)
    # The default pool stands for every device's default pool (it is one handle here).
    if p.imported or (p.device != dev and p is not state.pool):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"the pool is not a pool of device {dev}")
    state.device_pools[dev] = p.handle


def _pool_arg(pool):
    state.default_pool()
    p = state.pools.get(ptr(pool))
    if p is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "unknown or destroyed memory pool")
    return p


@api
def cuMemPoolCreate(pool, props):
    check_out(pool)
    pool[0] = ffi.cast("CUmemoryPool", create_pool(props))


def create_pool(props) -> int:
    """A new pool of `props` (CUmemPoolProps *, or the runtime's struct of the same layout)."""
    state.require_init()
    if props == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "poolProps is NULL")
    props = ffi.cast("CUmemPoolProps *", props)
    if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a pool's allocation type must be pinned")
    if props.location.type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a pool's location must be a device")
    state.device_description(props.location.id)
    if props.handleTypes not in (0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR):
        # Win32 and fabric handles have nothing to stand for under vgpu.
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a pool's handle types must be none or a "
                        "POSIX file descriptor")
    p = MemoryPool(state.new_handle(Kind.POOL), device=props.location.id,
                   handle_types=props.handleTypes)
    state.pools[p.handle] = p
    return p.handle


@api
def cuMemPoolDestroy(pool):
    p = _pool_arg(pool)
    if p is state.pool:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a device's default pool cannot be destroyed")
    del state.pools[p.handle]
    # As on CUDA, a device whose current pool it was goes back to its default pool, and
    # allocations still out stay valid until freed (state.pool_of keeps them).
    for device in [d for d, h in state.device_pools.items() if h == p.handle]:
        del state.device_pools[device]


@api
def cuMemPoolTrimTo(pool, min_bytes_to_keep):
    # Freed memory goes back to the device at once (nothing is cached), so there is never
    # anything to trim: only the pool is checked.
    _pool_arg(pool)


def _access_location(location) -> int:
    if location == ffi.NULL or location.type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "an access location must be a device")
    state.device_description(location.id)
    return location.id


@api
def cuMemPoolSetAccess(pool, access_map, count):
    p = _pool_arg(pool)
    if count and access_map == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "map is NULL")
    descs = ffi.cast("CUmemAccessDesc *", access_map)
    changes = {}
    for i in range(count):
        device = _access_location(ffi.addressof(descs[i], "location"))
        if descs[i].flags not in CU_MEM_ACCESS_FLAGS:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown access flags {descs[i].flags}")
        if device == p.device and descs[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            "the pool's own device always has read-write access")
        changes[device] = descs[i].flags
    p.access.update(changes)  # all or nothing: the checks came first


@api
def cuMemPoolGetAccess(flags, pool, location):
    check_out(flags)
    p = _pool_arg(pool)
    device = _access_location(ffi.cast("CUmemLocation *", location))
    value = CU_MEM_ACCESS_FLAGS_PROT_READWRITE if device == p.device else \
        p.access.get(device, 0)
    ffi.cast("CUmemAccess_flags *", flags)[0] = value


# Exporting: a pool's shareable handle is a file descriptor of a memfd holding a marker, the
# pool's random id and its device. It gives nothing by itself: each pointer is imported with
# its export data, which carries the allocation's IPC handle, and the server checks that one
# (server/ipc.py: only a process of the exporter's user or key, holding the random handle,
# can open it). The pool's id in both lets the importer refuse another pool's pointers.

@api
def cuMemPoolExportToShareableHandle(handle_out, pool, handle_type, flags):
    check_out(handle_out)
    ffi.cast("int *", handle_out)[0] = export_pool(pool, handle_type, flags)


def export_pool(pool, handle_type: int, flags: int) -> int:
    p = _pool_arg(pool)
    if flags or handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "pools export as POSIX file descriptors, "
                        "with no flags")
    if p.imported or not p.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the pool was not created exportable as a POSIX file descriptor")
    fd = os.memfd_create("vgpu-mempool", os.MFD_CLOEXEC)
    os.write(fd, POOL_FD_MARKER + p.pool_id + struct.pack("<i", p.device))
    return fd


@api
def cuMemPoolImportFromShareableHandle(pool_out, handle, handle_type, flags):
    check_out(pool_out)
    pool_out[0] = ffi.cast("CUmemoryPool", import_pool(handle, handle_type, flags))


def import_pool(handle, handle_type: int, flags: int) -> int:
    state.require_init()
    if flags or handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "pools import from POSIX file "
                        "descriptors, with no flags")
    size = len(POOL_FD_MARKER) + 16 + 4
    try:
        data = os.pread(ptr(handle), size, 0)
    except OSError:
        data = b""
    if len(data) != size or not data.startswith(POOL_FD_MARKER):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the file descriptor is not an exported memory pool")
    pool_id = data[len(POOL_FD_MARKER):-4]
    (device,) = struct.unpack("<i", data[-4:])
    p = MemoryPool(state.new_handle(Kind.POOL), device=device,
                   handle_types=CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, pool_id=pool_id,
                   imported=True)
    state.pools[p.handle] = p
    return p.handle


@api
def cuMemPoolExportPointer(share_data_out, dptr):
    check_out(share_data_out)
    export_pointer(share_data_out, int(dptr))


def export_pointer(share_data_out, address: int) -> None:
    """Fill `share_data_out` (CUmemPoolPtrExportData * or the runtime's equivalent)."""
    state.current_context()
    found = state.find_allocation(address)
    p = state.pool_of.get(found[0]) if found else None
    if p is None or p.imported or \
            not p.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not an allocation of an exportable pool")
    handle, _ = state.conn().call("cuIpcGetMemHandle", found[0])
    # The IPC handle's marker makes way for the pool's id; the import puts it back.
    data = p.pool_id + bytes(handle)[len(p.pool_id):]
    ffi.memmove(ffi.cast("CUmemPoolPtrExportData *", share_data_out).reserved, data, 64)


@api
def cuMemPoolImportPointer(ptr_out, pool, share_data):
    check_out(ptr_out)
    ptr_out[0] = import_pointer(pool, share_data)


def import_pointer(pool, share_data) -> int:
    p = _pool_arg(pool)
    if share_data == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "shareData is NULL")
    data = bytes(ffi.buffer(ffi.cast("CUmemPoolPtrExportData *", share_data).reserved, 64))
    if not p.imported or data[:16] != p.pool_id:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the export data is not of a pointer of this imported pool")
    handle = ffi.new("CUipcMemHandle *")
    ffi.memmove(handle.reserved, ipc.MEM_MARKER + data[16:], ipc.HANDLE_BYTES)
    address = ipc.open_mem_handle(handle, 0)
    state.pool_of[address] = p
    p.allocations.add(address)
    return address


@api
def cuMemPoolGetAttribute(pool, attr, value):
    check_out(value)
    p = _pool_arg(pool)
    if attr in (1, 2, 3):
        ffi.cast("int *", value)[0] = p.attributes[attr]
    elif attr == 4:
        ffi.cast("cuuint64_t *", value)[0] = p.attributes[4]
    elif attr in (5, 7):
        ffi.cast("cuuint64_t *", value)[0] = p.current
    elif attr in (6, 8):
        ffi.cast("cuuint64_t *", value)[0] = p.high
    else:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown pool attribute {attr}")


@api
def cuMemPoolSetAttribute(pool, attr, value):
    p = _pool_arg(pool)
    if attr in (1, 2, 3):
        p.attributes[attr] = ffi.cast("int *", value)[0]
    elif attr == 4:
        p.attributes[4] = ffi.cast("cuuint64_t *", value)[0]
    elif attr in (6, 8):
        p.high = p.current
    else:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"pool attribute {attr} cannot be set")


def _alloc_async(dptr, size: int, stream, pool=None) -> None:
    check_out(dptr)
    dptr[0] = _pool_alloc(size, stream, pool)


def _pool_alloc(size: int, stream, pool=None) -> int:
    """`size` bytes of `pool` (a MemoryPool; None: the current device's pool)."""
    if stream_handle(stream) in graph_capture.captures:  # a memory node of the capture
        return graph_memory.capture_alloc(stream_handle(stream), size)
    _check_stream(stream)
    p = _device_pool(state.contexts[state.current_context()]["device"]) if pool is None \
        else pool
    if p.imported:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "an imported pool only takes pointers cuMemPoolImportPointer opens")
    address = _alloc(size)
    p.allocations.add(address)
    state.pool_of[address] = p
    p.current += size
    p.high = max(p.high, p.current)
    return address


@api
def cuMemAllocAsync(dptr, bytesize, stream):
    _alloc_async(dptr, bytesize, stream)


@api
def cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream):
    _alloc_async(dptr, bytesize, stream, _pool_arg(pool))


@api
def cuMemFreeAsync(dptr, stream):
    _free_async(dptr, stream)


def _free_async(dptr: int, stream) -> None:
    if stream_handle(stream) in graph_capture.captures:
        graph_memory.capture_free(stream_handle(stream), dptr)
        return
    _check_stream(stream)
    p = state.pool_of.get(dptr)
    if p is not None and p.imported:
        # An imported pointer is freed by closing its opening (the exporter's memory stays).
        # A pointer imported twice is the same address, opened twice: it needs two frees.
        ipc.close_mem_handle(dptr)
        if dptr not in state.ipc_opened:
            del state.pool_of[dptr]
            p.allocations.discard(dptr)
        return
    size = state.allocations.get(dptr, 0)
    _free(dptr)
    if p is not None:
        del state.pool_of[dptr]
        p.allocations.discard(dptr)
        p.current -= size
