"""Device management, versions, limits, and the profiler switches.

The devices are those the server offers (one, or `vgpu server --devices N`). Each thread
works on the primary context of its device, 0 until cudaSetDevice says otherwise (see
_state.current_context); `cudaDeviceReset` resets the current device's: allocations,
modules, streams and events go, and so does a sticky error.
"""

from __future__ import annotations

from vgpu.api.cudartdefs import CUDART_VERSION, cudaDeviceMapHost, cudaDeviceMask, cudaFuncCache
from vgpu.errors import DeviceUnavailable

from ..driver import context as driver_context
from ..driver import device as driver_device
from ..driver import memory as driver_memory
from ..driver import stream as driver_stream
from ._state import (
    CudaError,
    E,
    api,
    check_out,
    current_context,
    driver_state,
    ffi,
    initialize,
    primary_context,
    query_api,
    runtime,
    set_pointer,
    thread_device,
)
from .device_properties import fill_device_properties
from .registration import registry

__all__ = [
    "RUNTIME_VERSION",
    "cudaGetDeviceCount",
    "cudaGetDevice",
    "cudaSetDevice",
    "cudaInitDevice",
    "cudaChooseDevice",
    "cudaGetDeviceProperties",
    "cudaDeviceGetAttribute",
    "cudaDeviceGetPCIBusId",
    "cudaDeviceCanAccessPeer",
    "cudaDeviceSynchronize",
    "cudaDeviceReset",
    "cudaSetDeviceFlags",
    "cudaGetDeviceFlags",
    "cudaDriverGetVersion",
    "cudaRuntimeGetVersion",
    "cudaDeviceGetLimit",
    "cudaDeviceSetLimit",
    "cudaDeviceGetStreamPriorityRange",
    "cudaDeviceGetCacheConfig",
    "cudaDeviceSetCacheConfig",
    "cudaDeviceGetDefaultMemPool",
    "cudaDeviceGetMemPool",
    "cudaDeviceSetMemPool",
    "cudaProfilerStart",
    "cudaProfilerStop",
]

RUNTIME_VERSION = CUDART_VERSION  # the headers the tables were generated from: 13.0


def _check_device(device: int) -> dict:
    initialize()
    return driver_state.device_description(device)  # cudaErrorInvalidDevice: the same code


def current_device() -> int:
    """The device of the calling thread's current context (its cudaSetDevice choice when
    it has none yet)."""
    stack = getattr(driver_state.thread, "stack", None)
    if stack and stack[-1] in driver_state.contexts:
        return driver_state.contexts[stack[-1]]["device"]
    return thread_device()


@query_api
def cudaGetDeviceCount(count):
    check_out(count)
    initialize()
    count[0] = driver_device.device_count()


@query_api
def cudaGetDevice(device):
    check_out(device)
    initialize()
    device[0] = current_device()


@query_api
def cudaSetDevice(device):
    """The device's primary context becomes the thread's current one, in place of the
    current one (as cuCtxSetCurrent)."""
    _check_device(device)
    runtime.thread.device = device
    context = primary_context(device)
    stack = driver_state.stack()
    if stack:
        stack[-1] = context
    else:
        stack.append(context)


@query_api
def cudaInitDevice(device, device_flags, flags):
    _check_device(device)
    if device_flags:
        cudaSetDeviceFlags.__wrapped__(device_flags)
    current_context()


@query_api
def cudaChooseDevice(device, prop):
    check_out(device)
    initialize()
    device[0] = 0  # the only one there is


@query_api
def cudaGetDeviceProperties(prop, device):
    check_out(prop)
    fill_device_properties(prop, _check_device(device))


@query_api
def cudaDeviceGetAttribute(value, attribute, device):
    check_out(value)
    attributes = _check_device(device)["attributes"]
    if attribute not in attributes:
        raise CudaError(E.cudaErrorInvalidValue, f"unknown device attribute {attribute}")
    value[0] = attributes[attribute]


@query_api
def cudaDeviceGetPCIBusId(pci_bus_id, length, device):
    _check_device(device)
    driver_device.cuDeviceGetPCIBusId.__wrapped__(pci_bus_id, length, device)


@query_api
def cudaDeviceCanAccessPeer(can_access, device, peer_device):
    driver_device.cuDeviceCanAccessPeer.__wrapped__(can_access, device, peer_device)


@api
def cudaDeviceSynchronize():
    driver_context.cuCtxSynchronize.__wrapped__()


@query_api
def cudaDeviceReset():
    """Works after a kernel fault: it is how a program recovers from one."""
    device = current_device()
    if device not in runtime.primary_contexts:
        return  # nothing was ever created
    driver_context.cuDevicePrimaryCtxReset_v2.__wrapped__(device)
    try:
        # Errors of work queued before the reset belong to the context it destroyed.
        driver_state.conn().synchronize()
    except DeviceUnavailable:
        raise
    except CudaError:
        pass
    registry.forget_loaded()
    runtime.sticky_error = 0
    runtime.set_last_error(0)


@query_api
def cudaSetDeviceFlags(flags):
    if flags & ~cudaDeviceMask:
        raise CudaError(E.cudaErrorInvalidValue, f"unknown device flags 0x{flags:x}")
    initialize()
    driver_context.cuDevicePrimaryCtxSetFlags_v2.__wrapped__(current_device(), flags)


@query_api
def cudaGetDeviceFlags(flags):
    check_out(flags)
    initialize()
    active = ffi.new("int *")
    driver_context.cuDevicePrimaryCtxGetState.__wrapped__(current_device(), flags, active)
    flags[0] |= cudaDeviceMapHost  # always in effect: page-locked memory is mapped (UVA)


@query_api
def cudaDriverGetVersion(version):
    check_out(version)
    version[0] = driver_device.DRIVER_VERSION


@query_api
def cudaRuntimeGetVersion(version):
    check_out(version)
    version[0] = RUNTIME_VERSION


@api
def cudaDeviceGetLimit(value, limit):
    driver_context.cuCtxGetLimit.__wrapped__(value, limit)


@api
def cudaDeviceSetLimit(limit, value):
    driver_context.cuCtxSetLimit.__wrapped__(limit, value)


@api
def cudaDeviceGetStreamPriorityRange(least, greatest):
    driver_stream.cuCtxGetStreamPriorityRange.__wrapped__(least, greatest)


@query_api
def cudaDeviceGetCacheConfig(cache_config):
    check_out(cache_config)
    cache_config[0] = runtime.cache_config


@query_api
def cudaDeviceSetCacheConfig(cache_config):
    # A preference only: it is kept and reported back, and the emulated device ignores it.
    if cache_config not in cudaFuncCache.__members__.values():
        raise CudaError(E.cudaErrorInvalidValue, f"unknown cache configuration {cache_config}")
    runtime.cache_config = cache_config


@query_api
def cudaDeviceGetDefaultMemPool(pool, device):
    _check_device(device)
    set_pointer(pool, driver_state.default_pool().handle)


@query_api
def cudaDeviceGetMemPool(pool, device):
    _check_device(device)
    set_pointer(pool, driver_memory._device_pool(device).handle)


@api
def cudaDeviceSetMemPool(device, pool):
    _check_device(device)
    driver_memory.cuDeviceSetMemPool.__wrapped__(device, pool)


# The profiler switches bracket what a profiler records; with none attached, as under vgpu,
# NVIDIA documents them as having no effect.
@query_api
def cudaProfilerStart():
    initialize()


@query_api
def cudaProfilerStop():
    initialize()
