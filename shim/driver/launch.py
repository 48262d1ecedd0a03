"""Kernel launches and function attributes.

A launch never waits for the server (a round trip costs ~100 us): the parameter buffer is packed
here from the kernel's layout (known since the module was loaded), the configuration is
checked against the kernel's limits, and the call is queued.
"""

from __future__ import annotations

from vgpu.api.cudadefs import CUfunctionLoadingState

from ._state import CudaError, E, Kind, api, check_out, ffi, handle_of, state
from .memory import _check_stream
from .nvidia_runtime import under_nvidia_runtime

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_LAUNCH_ATTRIBUTE_COOPERATIVE, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 2, 4
_MULTIPROCESSOR_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
MAX_SHARED_OPTIN = 163 * 1024
MAX_THREADS_PER_BLOCK = 1024
# The runtime's codes for what the driver API calls CUDA_ERROR_INVALID_VALUE / _HANDLE.
_INVALID_CONFIGURATION, _INVALID_DEVICE_FUNCTION = 9, 98


def _function_arg(f):
    handle = handle_of(f, Kind.FUNCTION, state.functions)
    return state.functions[handle], handle


def _launched_function(f):
    """_function_arg for a launch: NVIDIA's runtime hands the driver any pointer its program
    passed to cudaLaunchKernel that is no registered kernel, for cudaErrorInvalidDeviceFunction."""
    try:
        return _function_arg(f)
    except CudaError as exc:
        raise CudaError(under_nvidia_runtime(exc.code, _INVALID_DEVICE_FUNCTION),
                        exc.message) from None


def _pack_params(layout, kernel_params, extra) -> bytes:
    if kernel_params != ffi.NULL:
        buffer = bytearray(layout.buffer_size)
        for i, (offset, size) in enumerate(zip(layout.offsets, layout.sizes, strict=True)):
            if kernel_params[i] == ffi.NULL:
                raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"kernel parameter {i} is NULL")
            buffer[offset:offset + size] = ffi.buffer(kernel_params[i], size)
        return bytes(buffer)
    if extra != ffi.NULL:
        data, size, i = None, None, 0
        while int(ffi.cast("uintptr_t", extra[i])) != CU_LAUNCH_PARAM_END:
            key = int(ffi.cast("uintptr_t", extra[i]))
            if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
                data = extra[i + 1]
            elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
                size = ffi.cast("size_t *", extra[i + 1])[0]
            else:
                raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown launch extra key {key}")
            i += 2
        if data is None or size is None:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "extra lacks the buffer or its size")
        if size != layout.buffer_size:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"kernel {layout.name!r} takes {layout.buffer_size} bytes of "
                            f"parameters, the launch gives {size}")
        return ffi.buffer(data, size)[:]
    if layout.buffer_size:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"kernel {layout.name!r} takes parameters and none were given")
    return b""


def _launch(f, grid, block, shared_bytes: int, stream, kernel_params, extra,
            cooperative: bool = False) -> None:
    state.current_context()
    layout, handle = _launched_function(f)
    stream_handle = _check_stream(stream)
    _check_config(layout, grid, block, shared_bytes)
    if cooperative:
        check_cooperative(layout, grid, block, shared_bytes)
    _submit(handle, layout, grid, block, shared_bytes, stream_handle, kernel_params, extra,
            cooperative)


def _submit(handle: int, layout, grid, block, shared_bytes: int, stream_handle: int,
            kernel_params, extra, cooperative: bool = False) -> None:
    """Queue a launch whose function, stream and configuration are already checked."""
    params = _pack_params(layout, kernel_params, extra)
    conn = state.conn()
    if stream_handle not in (0, 1):  # not the legacy stream: see Connection.streams_used
        conn.streams_used = True
    conn.post("cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel", handle,
              *grid, *block, shared_bytes, stream_handle, params)


def check_cooperative(layout, grid, block, shared_bytes: int) -> None:
    """A cooperative grid must be resident all at once, as CUDA's occupancy calculator
    counts it: at most the kernel's active blocks per multiprocessor times the
    multiprocessors (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE otherwise)."""
    from .occupancy import max_active_blocks  # occupancy is built on this module

    blocks = grid[0] * grid[1] * grid[2]
    per_sm = max_active_blocks(layout, block[0] * block[1] * block[2], shared_bytes)
    most = per_sm * state.device["attributes"][_MULTIPROCESSOR_COUNT]
    if blocks > most:
        raise CudaError(E.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                        f"a cooperative grid of {blocks} blocks is more than the {most} of "
                        f"kernel {layout.name!r} that the device keeps resident")


class InvalidConfiguration(CudaError):
    """A launch the device cannot run as configured: the runtime's
    cudaErrorInvalidConfiguration, CUDA_ERROR_INVALID_VALUE from the driver API."""

    def __init__(self, message: str):
        super().__init__(under_nvidia_runtime(E.CUDA_ERROR_INVALID_VALUE,
                                              _INVALID_CONFIGURATION), message)


def _check_config(layout, grid, block, shared_bytes: int) -> None:
    """The launch configuration against the kernel's limits. A block of more threads than
    the kernel takes is an invalid value for the runtime too (CUDA 13 on an H200 said so for
    <<<1, 4096>>>); the other refusals are InvalidConfiguration."""
    gx, gy, gz = grid
    bx, by, bz = block
    if gx <= 0 or gy <= 0 or gz <= 0 or bx <= 0 or by <= 0 or bz <= 0:
        raise InvalidConfiguration("grid and block dimensions must be >= 1")
    threads = bx * by * bz
    limit = layout.attributes.get("max_threads_per_block", MAX_THREADS_PER_BLOCK)
    if threads > limit:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{threads} threads per block exceed "
                                                    f"kernel {layout.name!r}'s limit of {limit}")
    if bz > 64:
        raise InvalidConfiguration(f"a block {bz} threads deep exceeds the device's 64")
    if gy > 65535 or gz > 65535 or gx > 2**31 - 1:
        raise InvalidConfiguration("grid dimension too large")
    if shared_bytes > layout.max_dynamic_shared:
        raise InvalidConfiguration(f"{shared_bytes} bytes of dynamic shared memory exceed the "
                                   f"kernel's limit of {layout.max_dynamic_shared}")


@api
def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_bytes, stream, kernel_params, extra):
    _launch(f, (gx, gy, gz), (bx, by, bz), shared_bytes, stream, kernel_params, extra)


@api
def cuLaunchKernelEx(config, f, kernel_params, extra):
    check_out(config)
    cooperative = False
    for i in range(config.numAttrs):
        attr = config.attrs[i]
        if attr.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
            cooperative = bool(attr.value.cooperative)
        if attr.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            dims = attr.value.clusterDim
            if dims.x * dims.y * dims.z > 1:
                raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "thread block clusters are not "
                                                            "supported")
    _launch(f, (config.gridDimX, config.gridDimY, config.gridDimZ),
            (config.blockDimX, config.blockDimY, config.blockDimZ), config.sharedMemBytes,
            config.hStream, kernel_params, extra, cooperative)


@api
def cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared_bytes, stream, kernel_params):
    _launch(f, (gx, gy, gz), (bx, by, bz), shared_bytes, stream, kernel_params, ffi.NULL,
            cooperative=True)


# ----------------------------------------------------------------- attributes

_FUNC_ATTRIBUTES = {
    0: "max_threads_per_block", 1: "shared_size_bytes", 2: "const_size_bytes",
    3: "local_size_bytes", 4: "num_regs", 5: "ptx_version", 6: "binary_version",
}


def _attribute(layout, attrib: int) -> int:
    if attrib in _FUNC_ATTRIBUTES:
        return int(layout.attributes.get(_FUNC_ATTRIBUTES[attrib], 0))
    if attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        return layout.max_dynamic_shared
    if attrib == 7:  # CACHE_MODE_CA
        return 0
    if attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        return -1
    if attrib in (10, 11, 12, 13, 14, 15):  # cluster attributes
        return 0
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}")


@api
def cuFuncGetAttribute(pi, attrib, f):
    check_out(pi)
    pi[0] = _attribute(_function_arg(f)[0], attrib)


@api
def cuKernelGetAttribute(pi, attrib, kernel, dev):
    check_out(pi)
    state.device_description(dev)
    pi[0] = _attribute(_function_arg(kernel)[0], attrib)


def _set_attribute(layout, attrib: int, value: int) -> None:
    if attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if not 0 <= value <= MAX_SHARED_OPTIN - layout.attributes.get("shared_size_bytes", 0):
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"dynamic shared size {value} too large")
        layout.max_dynamic_shared = value
    elif attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if not -1 <= value <= 100:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "carveout must be -1..100")
    elif attrib not in (10, 11, 12, 13, 14, 15):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"function attribute {attrib} is read-only")


@api
def cuFuncSetAttribute(f, attrib, value):
    _set_attribute(_function_arg(f)[0], attrib, value)


@api
def cuKernelSetAttribute(attrib, value, kernel, dev):
    state.device_description(dev)  # CUDA_ERROR_INVALID_DEVICE for one the server lacks
    _set_attribute(_function_arg(kernel)[0], attrib, value)


@api
def cuFuncSetCacheConfig(f, config):
    _function_arg(f)  # a preference, and the emulator has no cache to split


@api
def cuKernelSetCacheConfig(kernel, config, dev):
    state.device_description(dev)
    _function_arg(kernel)


@api
def cuFuncGetParamInfo(func, index, offset, size):
    layout = _function_arg(func)[0]
    check_out(offset)
    if not 0 <= index < len(layout.offsets):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"kernel {layout.name!r} has {len(layout.offsets)} parameters, not "
                        f"one of index {index}")
    offset[0] = layout.offsets[index]
    if size != ffi.NULL:
        size[0] = layout.sizes[index]


@api
def cuFuncIsLoaded(loading_state, function):
    """vgpu loads a module's kernels with the module (eager loading), so every function
    handle names a loaded function."""
    _function_arg(function)
    check_out(loading_state)
    loading_state[0] = CUfunctionLoadingState.CU_FUNCTION_LOADING_STATE_LOADED


@api
def cuFuncLoad(function):
    _function_arg(function)  # loaded with its module already (see cuFuncIsLoaded)


@api
def cuFuncGetName(name, f):
    from .module import _interned_name

    check_out(name)
    name[0] = _interned_name(_function_arg(f)[0].name)
