"""Memory: device and page-locked host allocations, copies (linear, 2D, to and from device
symbols), memsets, stream-ordered allocation, pointer attributes.

A copy's direction (`cudaMemcpyKind`) says where each pointer must live; a device pointer that
is not inside a live allocation is cudaErrorInvalidValue, as CUDA reports it.
`cudaMemcpyDefault` infers the direction from the pointers (unified addressing). Copies from
and to pageable memory complete before the call returns, async ones included; copies between
the device and page-locked memory on a stream are queued, as on a GPU.
"""

from __future__ import annotations

from vgpu.api.cudartdefs import (
    cudaHostAllocMapped,
    cudaHostAllocPortable,
    cudaHostAllocWriteCombined,
    cudaHostRegisterIoMemory,
    cudaHostRegisterMapped,
    cudaHostRegisterPortable,
    cudaHostRegisterReadOnly,
    cudaInvalidDeviceId,
    cudaMemcpyKind,
    cudaMemoryType,
)

from ..driver import managed as driver_managed
from ..driver import memory as driver_memory
from ..driver.memory import PITCH_ALIGNMENT, _check_stream, issued_on
from ._state import (
    CudaError,
    E,
    api,
    check_out,
    driver_state,
    ffi,
    ptr,
    query_api,
    set_pointer,
)
from .registration import registry

__all__ = [
    "cudaMalloc", "cudaFree", "cudaMallocPitch", "cudaMallocHost", "cudaHostAlloc",
    "cudaFreeHost", "cudaHostRegister", "cudaHostUnregister", "cudaHostGetDevicePointer",
    "cudaHostGetFlags", "cudaMemGetInfo", "cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2D",
    "cudaMemcpy2DAsync", "cudaMemcpyToSymbol", "cudaMemcpyToSymbolAsync",
    "cudaMemcpyFromSymbol", "cudaMemcpyFromSymbolAsync", "cudaGetSymbolAddress",
    "cudaGetSymbolSize", "cudaMemset", "cudaMemsetAsync", "cudaMemset2D", "cudaMemset2DAsync",
    "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaFreeAsync", "cudaMemPoolGetAttribute",
    "cudaMemPoolSetAttribute", "cudaPointerGetAttributes", "cudaMemPoolCreate",
    "cudaMemPoolDestroy", "cudaMemPoolTrimTo", "cudaMemPoolSetAccess", "cudaMemPoolGetAccess",
    "cudaMemPoolExportToShareableHandle", "cudaMemPoolImportFromShareableHandle",
    "cudaMemPoolExportPointer", "cudaMemPoolImportPointer",
]

HOST_TO_HOST = cudaMemcpyKind.cudaMemcpyHostToHost
HOST_TO_DEVICE = cudaMemcpyKind.cudaMemcpyHostToDevice
DEVICE_TO_HOST = cudaMemcpyKind.cudaMemcpyDeviceToHost
DEVICE_TO_DEVICE = cudaMemcpyKind.cudaMemcpyDeviceToDevice
DEFAULT = cudaMemcpyKind.cudaMemcpyDefault
HOST_ALLOC_FLAGS = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined
HOST_REGISTER_FLAGS = cudaHostRegisterPortable | cudaHostRegisterMapped | \
    cudaHostRegisterIoMemory | cudaHostRegisterReadOnly


# ----------------------------------------------------------------- allocation

@api
def cudaMalloc(dev_ptr, size):
    set_pointer(dev_ptr, driver_memory._alloc(size) if size else 0)


@api
def cudaFree(dev_ptr):
    address = ptr(dev_ptr)
    if address:
        # The stream-ordered free also keeps the pool's accounting for cudaMallocAsync memory.
        driver_memory._free_async(address, 0)


@api
def cudaMallocPitch(dev_ptr, pitch, width, height):
    check_out(pitch)
    row = -(-width // PITCH_ALIGNMENT) * PITCH_ALIGNMENT
    set_pointer(dev_ptr, driver_memory._alloc(row * height) if row * height else 0)
    pitch[0] = row


@api
def cudaMallocHost(host_ptr, size):
    set_pointer(host_ptr, driver_memory._host_alloc(size, 0) if size else 0)


@api
def cudaHostAlloc(host_ptr, size, flags):
    if flags & ~HOST_ALLOC_FLAGS:
        raise CudaError(E.cudaErrorInvalidValue, f"unknown cudaHostAlloc flags 0x{flags:x}")
    set_pointer(host_ptr, driver_memory._host_alloc(size, flags) if size else 0)


@api
def cudaFreeHost(host_ptr):
    if ptr(host_ptr):
        driver_memory.cuMemFreeHost.__wrapped__(host_ptr)


@api
def cudaHostRegister(host_ptr, size, flags):
    if flags & ~HOST_REGISTER_FLAGS:
        raise CudaError(E.cudaErrorInvalidValue, f"unknown cudaHostRegister flags 0x{flags:x}")
    driver_memory.cuMemHostRegister_v2.__wrapped__(host_ptr, size, flags)


@api
def cudaHostUnregister(host_ptr):
    driver_memory.cuMemHostUnregister.__wrapped__(host_ptr)


@api
def cudaHostGetDevicePointer(dev_ptr, host_ptr, flags):
    if flags != 0:
        raise CudaError(E.cudaErrorInvalidValue, "flags must be 0")
    set_pointer(dev_ptr, driver_memory._host_device_pointer(ptr(host_ptr)))


@api
def cudaHostGetFlags(flags, host_ptr):
    driver_memory.cuMemHostGetFlags.__wrapped__(flags, host_ptr)


@api
def cudaMemGetInfo(free, total):
    driver_memory.cuMemGetInfo_v2.__wrapped__(free, total)


# ----------------------------------------------------------------- copies

def _copy(dst: int, src: int, count: int, kind: int, queued: bool) -> None:
    if kind == HOST_TO_DEVICE:
        driver_memory._htod(dst, src, count, queued)
    elif kind == DEVICE_TO_HOST:
        driver_memory._dtoh(dst, src, count, queued)
    elif kind == DEVICE_TO_DEVICE:
        driver_memory._dtod(dst, src, count)
        if not queued:
            driver_managed.settle()
    elif kind in (DEFAULT, HOST_TO_HOST):
        # With unified addressing CUDA's runtime lets the pointers decide a host-to-host
        # copy too: one that names device memory copies it, as cudaMemcpyDefault would.
        driver_memory._copy_unified(dst, src, count, queued)
    else:
        raise CudaError(E.cudaErrorInvalidMemcpyDirection, f"unknown cudaMemcpyKind {kind}")


@api
def cudaMemcpy(dst, src, count, kind):
    _copy(ptr(dst), ptr(src), count, kind, queued=False)


@api
def cudaMemcpyAsync(dst, src, count, kind, stream):
    with issued_on(stream):
        _copy(ptr(dst), ptr(src), count, kind, queued=True)


def _sides(kind: int, dst: int, src: int) -> tuple[bool, bool]:
    """(destination on the device, source on the device) for a copy of `kind`."""
    if kind in (DEFAULT, HOST_TO_HOST):  # the pointers decide, as for linear copies
        return driver_memory._is_device(dst), driver_memory._is_device(src)
    if kind not in (HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE):
        raise CudaError(E.cudaErrorInvalidMemcpyDirection, f"unknown cudaMemcpyKind {kind}")
    return kind in (HOST_TO_DEVICE, DEVICE_TO_DEVICE), kind in (DEVICE_TO_HOST, DEVICE_TO_DEVICE)


def _copy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
             kind: int, queued: bool) -> None:
    if width > dst_pitch or width > src_pitch:  # cudaErrorInvalidValue on NVIDIA's runtime
        raise CudaError(E.cudaErrorInvalidValue,
                        f"row width {width} exceeds a pitch ({dst_pitch}, {src_pitch})")
    if width == 0 or height == 0:
        return
    dst_dev, src_dev = _sides(kind, dst, src)
    driver_memory.copy_rows(dst_dev, dst, dst_pitch, src_dev, src, src_pitch, width, height,
                             queued)


@api
def cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, kind):
    _copy_2d(ptr(dst), dst_pitch, ptr(src), src_pitch, width, height, kind, queued=False)


@api
def cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, kind, stream):
    with issued_on(stream):
        _copy_2d(ptr(dst), dst_pitch, ptr(src), src_pitch, width, height, kind, queued=True)


# ----------------------------------------------------------------- device symbols

def _symbol_range(symbol, count: int, offset: int) -> int:
    """The device address of `count` bytes at `offset` into a registered variable."""
    address, size = registry.variable(ptr(symbol))
    if offset + count > size:
        raise CudaError(E.cudaErrorInvalidValue, f"{offset}+{count} bytes run past the {size}-byte "
                                            f"device variable")
    return address + offset


def _to_symbol(symbol, src, count: int, offset: int, kind: int, queued: bool) -> None:
    if kind not in (HOST_TO_DEVICE, DEVICE_TO_DEVICE, DEFAULT):
        raise CudaError(E.cudaErrorInvalidMemcpyDirection, "a copy to a symbol goes to the device")
    _copy(_symbol_range(symbol, count, offset), ptr(src), count, kind, queued)


def _from_symbol(dst, symbol, count: int, offset: int, kind: int, queued: bool) -> None:
    if kind not in (DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT):
        raise CudaError(E.cudaErrorInvalidMemcpyDirection, "a copy from a symbol leaves the device")
    _copy(ptr(dst), _symbol_range(symbol, count, offset), count, kind, queued)


@api
def cudaMemcpyToSymbol(symbol, src, count, offset, kind):
    _to_symbol(symbol, src, count, offset, kind, queued=False)


@api
def cudaMemcpyToSymbolAsync(symbol, src, count, offset, kind, stream):
    with issued_on(stream):
        _to_symbol(symbol, src, count, offset, kind, queued=True)


@api
def cudaMemcpyFromSymbol(dst, symbol, count, offset, kind):
    _from_symbol(dst, symbol, count, offset, kind, queued=False)


@api
def cudaMemcpyFromSymbolAsync(dst, symbol, count, offset, kind, stream):
    with issued_on(stream):
        _from_symbol(dst, symbol, count, offset, kind, queued=True)


@api
def cudaGetSymbolAddress(dev_ptr, symbol):
    set_pointer(dev_ptr, registry.variable(ptr(symbol))[0])


@api
def cudaGetSymbolSize(size, symbol):
    check_out(size)
    size[0] = registry.variable(ptr(symbol))[1]


# ----------------------------------------------------------------- memsets

def _byte(value: int) -> bytes:
    return bytes([value & 0xFF])  # cudaMemset stores the low byte of `value`


@api
def cudaMemset(dev_ptr, value, count):
    driver_memory._memset(ptr(dev_ptr), _byte(value), count, queued=False)


@api
def cudaMemsetAsync(dev_ptr, value, count, stream):
    with issued_on(stream):
        driver_memory._memset(ptr(dev_ptr), _byte(value), count)


@api
def cudaMemset2D(dev_ptr, pitch, value, width, height):
    driver_memory._memset_2d(ptr(dev_ptr), pitch, _byte(value), width, height, queued=False)


@api
def cudaMemset2DAsync(dev_ptr, pitch, value, width, height, stream):
    with issued_on(stream):
        driver_memory._memset_2d(ptr(dev_ptr), pitch, _byte(value), width, height)


# ----------------------------------------------------------------- stream-ordered allocation

@api
def cudaMallocAsync(dev_ptr, size, stream):
    set_pointer(dev_ptr, driver_memory._pool_alloc(size, stream) if size else 0)


@api
def cudaMallocFromPoolAsync(dev_ptr, size, pool, stream):
    p = driver_memory._pool_arg(pool)
    set_pointer(dev_ptr, driver_memory._pool_alloc(size, stream, p) if size else 0)


@api
def cudaFreeAsync(dev_ptr, stream):
    address = ptr(dev_ptr)
    if address:
        driver_memory._free_async(address, stream)
    else:
        _check_stream(stream)


@api
def cudaMemPoolGetAttribute(pool, attribute, value):
    driver_memory.cuMemPoolGetAttribute.__wrapped__(pool, attribute, value)


@api
def cudaMemPoolSetAttribute(pool, attribute, value):
    driver_memory.cuMemPoolSetAttribute.__wrapped__(pool, attribute, value)


# ----------------------------------------------------------------- pointer attributes

@query_api
def cudaPointerGetAttributes(attributes, pointer):
    """Memory CUDA does not know is reported as unregistered, not as an error (CUDA 11+)."""
    check_out(attributes)
    address = ptr(pointer)
    device = driver_state.find_allocation(address)
    host = driver_state.find_host(address)
    size = ffi.sizeof(attributes[0])
    ffi.memmove(attributes, bytes(size), size)
    if device is not None:
        context = driver_state.allocation_context[device[0]]
        attributes.device = driver_state.contexts[context]["device"]
        attributes.devicePointer = ffi.cast("void *", address)
        if driver_managed.is_managed(device[0]):  # the same address on the host
            attributes.type = cudaMemoryType.cudaMemoryTypeManaged
            attributes.hostPointer = ffi.cast("void *", address)
        else:
            attributes.type = cudaMemoryType.cudaMemoryTypeDevice
    elif host is not None:
        attributes.type, attributes.device = cudaMemoryType.cudaMemoryTypeHost, 0
        attributes.hostPointer = ffi.cast("void *", address)
        if host[1].device_pointer is not None:
            attributes.devicePointer = ffi.cast("void *", address)
    else:
        attributes.type = cudaMemoryType.cudaMemoryTypeUnregistered
        attributes.device = cudaInvalidDeviceId


# The runtime's pool structs (cudaMemPoolProps, cudaMemAccessDesc, cudaMemLocation,
# cudaMemPoolPtrExportData) have the driver's layouts: the driver's code reads them as its own.

@api
def cudaMemPoolCreate(pool, props):
    set_pointer(pool, driver_memory.create_pool(props))


@api
def cudaMemPoolDestroy(pool):
    driver_memory.cuMemPoolDestroy.__wrapped__(pool)


@api
def cudaMemPoolTrimTo(pool, min_bytes_to_keep):
    driver_memory.cuMemPoolTrimTo.__wrapped__(pool, min_bytes_to_keep)


@api
def cudaMemPoolSetAccess(pool, desc_list, count):
    driver_memory.cuMemPoolSetAccess.__wrapped__(pool, desc_list, count)


@api
def cudaMemPoolGetAccess(flags, pool, location):
    driver_memory.cuMemPoolGetAccess.__wrapped__(flags, pool, location)


@api
def cudaMemPoolExportToShareableHandle(handle, pool, handle_type, flags):
    check_out(handle)
    ffi.cast("int *", handle)[0] = driver_memory.export_pool(pool, handle_type, flags)


@api
def cudaMemPoolImportFromShareableHandle(pool, handle, handle_type, flags):
    set_pointer(pool, driver_memory.import_pool(handle, handle_type, flags))


@api
def cudaMemPoolExportPointer(export_data, dev_ptr):
    check_out(export_data)
    driver_memory.export_pointer(export_data, ptr(dev_ptr))


@api
def cudaMemPoolImportPointer(dev_ptr, pool, export_data):
    set_pointer(dev_ptr, driver_memory.import_pointer(pool, export_data))
