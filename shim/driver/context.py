"""Contexts: primary and created ones, and the per-thread current-context stack.

Contexts live in the client (which one is current is a per-thread matter); the server is
told about each so it can release a context's allocations, modules, streams and events with
it.
"""

from __future__ import annotations

from .._libcuda import lib
from . import managed
from ._state import (
    DEFAULT_LIMITS,
    CudaError,
    E,
    Kind,
    api,
    check_out,
    ffi,
    handle_of,
    ptr,
    state,
)
from .graph_capture import forbid_unsafe
from .module import reload_library

CU_CTX_FLAGS_MASK = 0xFF
CU_LIMIT_PRINTF_FIFO_SIZE = 1
CU_LIMIT_MALLOC_HEAP_SIZE = 2
CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4
CU_CTX_SCHED_MASK, CU_CTX_SCHED_BLOCKING_SYNC = 0x07, 0x04
CU_FUNC_CACHE_PREFER_NONE, CU_FUNC_CACHE_PREFER_EQUAL = 0, 3


def _apply_scheduling(flags: int) -> None:
    """CU_CTX_SCHED_BLOCKING_SYNC: synchronizing calls sleep instead of polling briefly."""
    conn = state.conn()
    if flags & CU_CTX_SCHED_MASK == CU_CTX_SCHED_BLOCKING_SYNC:
        conn.spin_s = 0.0


def _context_arg(ctx) -> int:
    return handle_of(ctx, Kind.CONTEXT, state.contexts, E.CUDA_ERROR_INVALID_CONTEXT)


def _context_or_current(ctx) -> int:
    """ctx's handle, or the current context's when ctx is NULL (the _v2 forms' convention)."""
    return _context_arg(ctx) if ptr(ctx) else state.current_context()


def _create(pctx, flags: int, dev: int) -> None:
    check_out(pctx)
    state.require_init()
    state.device_description(dev)
    handle = state.new_handle(Kind.CONTEXT)
    state.conn().post("cuCtxCreate", handle, flags, dev)
    _apply_scheduling(flags)
    state.contexts[handle] = {"device": dev, "flags": flags, "primary": False}
    state.stack().append(handle)
    pctx[0] = ffi.cast("CUcontext", handle)


@api
def cuCtxCreate(pctx, flags, dev):
    _create(pctx, flags, dev)


cuCtxCreate_v2 = cuCtxCreate


@api
def cuCtxCreate_v3(pctx, params, num_params, flags, dev):
    if num_params:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "execution affinity is not supported")
    _create(pctx, flags, dev)


@api
def cuCtxCreate_v4(pctx, create_params, flags, dev):
    if create_params != ffi.NULL and (create_params.execAffinityParams != ffi.NULL
                                      or create_params.cigParams != ffi.NULL):
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "context create parameters not supported")
    _create(pctx, flags, dev)


@api
def cuCtxDestroy_v2(ctx):
    handle = _context_arg(ctx)
    if state.contexts[handle]["primary"]:
        raise CudaError(E.CUDA_ERROR_INVALID_CONTEXT, "cannot destroy a primary context")
    _release_storage(handle)
    state.conn().post("cuCtxDestroy", handle)
    _forget_context(handle)


def _release_storage(handle: int) -> None:
    """What NVIDIA's runtime keeps in the context (shim/c/driver_context_storage.c) goes
    first: its destructors may still call the driver about the context's objects."""
    lib.vgpu_context_storage_release(ffi.cast("void *", handle))


def _forget_context(handle: int) -> None:
    state.contexts.pop(handle, None)
    for address in [a for a, c in state.allocation_context.items() if c == handle]:
        state.remove_allocation(address)
        managed.release(address)
    state.peer_access = {pair for pair in state.peer_access if handle not in pair}
    for table in (state.streams, state.events):
        for h in [h for h, s in table.items() if s["context"] == handle]:
            del table[h]
    for m in [m for m, info in state.modules.items() if info.context == handle]:
        for f in state.modules.pop(m).functions.values():
            state.functions.pop(f, None)
    stack = state.stack()
    stack[:] = [c for c in stack if c != handle]


@api
def cuCtxPushCurrent_v2(ctx):
    state.stack().append(_context_arg(ctx))


@api
def cuCtxPopCurrent_v2(pctx):
    state.require_init()
    stack = state.stack()
    if not stack:
        raise CudaError(E.CUDA_ERROR_INVALID_CONTEXT, "the context stack is empty")
    handle = stack.pop()
    if pctx != ffi.NULL:
        pctx[0] = ffi.cast("CUcontext", handle)


@api
def cuCtxGetCurrent(pctx):
    check_out(pctx)
    state.require_init()
    stack = state.stack()
    pctx[0] = ffi.cast("CUcontext", stack[-1] if stack else 0)


@api
def cuCtxSetCurrent(ctx):
    state.require_init()
    stack = state.stack()
    handle = ptr(ctx)
    if handle == 0:
        if stack:
            stack.pop()
        return
    handle = _context_arg(ctx)
    if stack:
        stack[-1] = handle
    else:
        stack.append(handle)


@api
def cuCtxGetDevice(device):
    check_out(device)
    device[0] = state.contexts[state.current_context()]["device"]


@api
def cuCtxGetDevice_v2(device, ctx):
    check_out(device)
    device[0] = state.contexts[_context_or_current(ctx)]["device"]


@api
def cuCtxGetFlags(flags):
    check_out(flags)
    flags[0] = state.contexts[state.current_context()]["flags"]


@api
def cuCtxGetApiVersion(ctx, version):
    check_out(version)
    _context_or_current(ctx)
    version[0] = 13000


@api
def cuCtxSynchronize():
    state.current_context()
    forbid_unsafe("cuCtxSynchronize")
    state.conn().synchronize()


@api
def cuCtxSynchronize_v2(ctx):
    # The server runs a session's work in order: waiting for all of it waits for ctx's.
    _context_or_current(ctx)
    forbid_unsafe("cuCtxSynchronize")
    state.conn().synchronize()




@api
def cuCtxGetLimit(value, limit):
    check_out(value)
    state.current_context()
    _known_limit(limit)
    value[0] = state.limits[limit]


def _known_limit(limit):
    # A value outside CUlimit is an invalid argument to NVIDIA's driver (cuCtxSetLimit with
    # 0x1234 answers CUDA_ERROR_INVALID_VALUE on an H200), not CUDA_ERROR_UNSUPPORTED_LIMIT,
    # which names a limit the device does not implement.
    if limit not in state.limits:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown limit {limit}")


# Limits the server applies to launches: the printf FIFO, the malloc heap and the device
# runtime's pending launches (each fixed once a kernel using it has run); the others are kept
# for cuCtxGetLimit only. On the emu backend CU_LIMIT_STACK_SIZE has no effect (a thread's
# local memory is what its kernel declares; recursion saves frames aside), nor have the
# L2 limits.
SERVER_LIMITS = frozenset({CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE,
                           CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT})


@api
def cuCtxGetCacheConfig(config):
    check_out(config)
    config[0] = state.contexts[state.current_context()].get("cache", CU_FUNC_CACHE_PREFER_NONE)


@api
def cuCtxSetCacheConfig(config):
    # A preference only: kept and reported back; the emulated device has no cache to split.
    if not CU_FUNC_CACHE_PREFER_NONE <= config <= CU_FUNC_CACHE_PREFER_EQUAL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown cache configuration {config}")
    state.contexts[state.current_context()]["cache"] = config


@api
def cuCtxSetLimit(limit, value):
    state.current_context()
    _known_limit(limit)
    if limit in SERVER_LIMITS:  # the server may refuse (printf FIFO after a printf kernel)
        state.conn().call("cuCtxSetLimit", limit, value)
    state.limits[limit] = value


# ----------------------------------------------------------------- primary contexts

def _primary(dev: int) -> int:
    state.require_init()
    state.device_description(dev)
    entry = state.primary.get(dev)
    if entry is None:
        handle = state.new_handle(Kind.CONTEXT)
        state.contexts[handle] = {"device": dev, "flags": 0, "primary": True}
        state.conn().post("cuDevicePrimaryCtxRetain", handle, dev)
        entry = state.primary[dev] = [handle, 0]
    return entry


@api
def cuDevicePrimaryCtxRetain(pctx, dev):
    check_out(pctx)
    entry = _primary(dev)
    entry[1] += 1
    pctx[0] = ffi.cast("CUcontext", entry[0])


@api
def cuDevicePrimaryCtxRelease_v2(dev):
    entry = _primary(dev)
    if entry[1] <= 0:
        raise CudaError(E.CUDA_ERROR_INVALID_CONTEXT, "primary context is not retained")
    entry[1] -= 1
    if entry[1] == 0:  # the last user is gone: so is the context, as on CUDA
        _reset_primary(dev, entry[0])


@api
def cuDevicePrimaryCtxReset_v2(dev):
    _reset_primary(dev, _primary(dev)[0])


# The names before CUDA 11 (NVIDIA's runtime still asks for them), with the same meaning;
# cuDevicePrimaryCtxSetFlags below.
cuDevicePrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2
cuDevicePrimaryCtxReset = cuDevicePrimaryCtxReset_v2


def _reset_primary(dev: int, handle: int) -> None:
    """The primary context starts afresh: its allocations, modules, streams and events (and a
    sticky error) go, its limits are the defaults again; its flags stay."""
    _release_storage(handle)
    conn = state.conn()
    conn.post("cuDevicePrimaryCtxReset", handle)
    conn.sticky_error = 0  # the reset clears it on the server too
    state.limits = dict(DEFAULT_LIMITS)  # and the limits (the server resets its own)
    flags = state.contexts[handle]["flags"]
    libraries = {m: info for m, info in state.modules.items()
                 if info.context == handle and info.library_image is not None}
    _forget_context(handle)
    state.contexts[handle] = {"device": dev, "flags": flags, "primary": True}
    for library, info in libraries.items():
        reload_library(library, info, handle)


@api
def cuDevicePrimaryCtxGetState(dev, flags, active):
    check_out(flags)
    check_out(active)
    entry = _primary(dev)
    flags[0] = state.contexts[entry[0]]["flags"]
    active[0] = 1 if entry[1] > 0 else 0


@api
def cuDevicePrimaryCtxSetFlags_v2(dev, flags):
    entry = _primary(dev)
    state.contexts[entry[0]]["flags"] = flags & CU_CTX_FLAGS_MASK
    _apply_scheduling(flags)


cuDevicePrimaryCtxSetFlags = cuDevicePrimaryCtxSetFlags_v2
