"""Kernel launches and kernel attributes.

What nvcc 13 makes of `kernel<<<grid, block, shared, stream>>>(args...)`:
`__cudaPushCallConfiguration(grid, block, shared, stream)` (a non-zero answer skips the
launch), then in the host stub `__cudaGetKernel(&handle, stub)` once per call site,
`__cudaPopCallConfiguration(...)` (push and pop are C: shim/c/runtime_launch_config.c) and
`__cudaLaunchKernel(handle, grid, block, args, shared, stream)` (`_ptsz` when compiled with a
per-thread default stream), whose result the stub drops: a failed launch is seen through
cudaGetLastError. A launch never waits for the server:
the kernel's parameter layout is known once its image is loaded, the configuration is checked
here and the launch is queued (it needs no answer from the server).

Functions are named by their host stub address (`cudaLaunchKernel(func, ...)`) or by the
cudaKernel_t `__cudaGetKernel` / `cudaGetKernel` gave; both are accepted everywhere.
"""

from __future__ import annotations

from vgpu.api.cudartdefs import cudaLaunchAttributeID

from ..driver import launch as driver_launch
from ..driver.launch import InvalidConfiguration, _check_config, _submit, check_cooperative
from ..driver.memory import _check_stream
from ..driver.module import _interned_name
from ._state import (
    CudaError,
    E,
    api,
    check_out,
    driver_state,
    ffi,
    ptr,
    set_pointer,
)
from .registration import registry

__all__ = [
    "function_layout",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
    "cudaGetKernel",
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cudaFuncGetAttributes",
    "cudaFuncSetAttribute",
    "cudaFuncSetCacheConfig",
    "cudaFuncGetName",
    "cudaGetFuncBySymbol",
]

NULL = ffi.NULL


def _dims(dim3) -> tuple[int, int, int]:
    return dim3.x, dim3.y, dim3.z


def function_layout(func) -> tuple[int, object]:
    """(driver function handle, its KernelLayout) for a host stub or cudaKernel_t (pointer
    cdata), in the calling thread's context; the kernel's image is loaded on first use.
    Called from `api` functions only, which have made a context current."""
    context = driver_state.thread.stack[-1]
    if func not in registry.kernels:  # a library's kernel (cudaLibraryGetKernel) is the
        handle = ptr(func)             # driver's function itself
        if handle in driver_state.functions:
            return handle, driver_state.functions[handle]
    kernel = registry.kernel(func)
    last_context, function, layout = kernel.last_use
    # The shortcut holds while the function is loaded (a reset or unload drops it).
    if last_context != context or driver_state.functions.get(function) is not layout:
        function = registry.function(kernel, context)
        layout = driver_state.functions[function]
        kernel.last_use = (context, function, layout)
    return function, layout


def _launch(func, grid, block, shared_bytes: int, stream, args,
            cooperative: bool = False) -> None:
    function, layout = function_layout(func)
    try:
        _check_config(layout, grid, block, shared_bytes)
    except InvalidConfiguration as exc:  # the driver API's invalid value
        raise CudaError(E.cudaErrorInvalidConfiguration, exc.message) from None
    if cooperative:
        try:
            check_cooperative(layout, grid, block, shared_bytes)
        except CudaError as exc:
            raise CudaError(E.cudaErrorCooperativeLaunchTooLarge, exc.message) from None
    _submit(function, layout, grid, block, shared_bytes, _check_stream(stream), args, NULL,
            cooperative)


# ----------------------------------------------------------------- <<<>>>

@api
def __cudaGetKernel(kernel_out, func):
    set_pointer(kernel_out, registry.kernel(func).handle)


@api
def __cudaLaunchKernel(kernel, grid, block, args, shared_bytes, stream):
    _launch(kernel, (grid.x, grid.y, grid.z), (block.x, block.y, block.z), shared_bytes, stream,
            args)


# ----------------------------------------------------------------- public launch API

@api
def cudaGetKernel(kernel_out, func):
    set_pointer(kernel_out, registry.kernel(func).handle)


@api
def cudaLaunchKernel(func, grid, block, args, shared_bytes, stream):
    _launch(func, _dims(grid), _dims(block), shared_bytes, stream, args)


@api
def cudaLaunchKernelExC(config, func, args):
    check_out(config)
    cooperative = False
    for i in range(config.numAttrs):
        attribute = config.attrs[i]
        if attribute.id == cudaLaunchAttributeID.cudaLaunchAttributeCooperative:
            cooperative = bool(attribute.val.cooperative)
        if attribute.id == cudaLaunchAttributeID.cudaLaunchAttributeClusterDimension and \
                _product(_dims(attribute.val.clusterDim)) > 1:
            raise CudaError(E.cudaErrorNotSupported, "thread block clusters are not supported")
    _launch(func, _dims(config.gridDim), _dims(config.blockDim), config.dynamicSmemBytes,
            config.stream, args, cooperative)


@api
def cudaLaunchCooperativeKernel(func, grid, block, args, shared_bytes, stream):
    _launch(func, _dims(grid), _dims(block), shared_bytes, stream, args, cooperative=True)


def _product(values) -> int:
    x, y, z = values
    return x * y * z


# ----------------------------------------------------------------- attributes

# cudaFuncAttributes field -> CUfunction_attribute (cuda.h numbers them the same way).
_FUNC_ATTRIBUTE_FIELDS = {
    "maxThreadsPerBlock": 0, "sharedSizeBytes": 1, "constSizeBytes": 2, "localSizeBytes": 3,
    "numRegs": 4, "ptxVersion": 5, "binaryVersion": 6, "cacheModeCA": 7,
    "maxDynamicSharedSizeBytes": 8, "preferredShmemCarveout": 9, "clusterDimMustBeSet": 10,
    "requiredClusterWidth": 11, "requiredClusterHeight": 12, "requiredClusterDepth": 13,
    "nonPortableClusterSizeAllowed": 14, "clusterSchedulingPolicyPreference": 15,
}


@api
def cudaFuncGetAttributes(attributes, func):
    check_out(attributes)
    _, layout = function_layout(func)
    ffi.memmove(attributes, bytes(ffi.sizeof(attributes[0])), ffi.sizeof(attributes[0]))
    for name, attribute in _FUNC_ATTRIBUTE_FIELDS.items():
        setattr(attributes, name, driver_launch._attribute(layout, attribute))


@api
def cudaFuncSetAttribute(func, attribute, value):
    _, layout = function_layout(func)
    driver_launch._set_attribute(layout, attribute, value)


@api
def cudaFuncSetCacheConfig(func, cache_config):
    # A preference only; the emulated device has no L1/shared split to tune.
    function_layout(func)


@api
def cudaFuncGetName(name_out, func):
    set_pointer(name_out, ptr(_interned_name(registry.kernel(func).name)))


@api
def cudaGetFuncBySymbol(function_out, func):
    """The driver's CUfunction of a kernel, for programs that mix in the driver API."""
    set_pointer(function_out, function_layout(func)[0])
