"""Process state of the runtime layer, and the decorators every runtime API function goes
through.

The runtime runs inside the application on top of vgpu's driver layer and calls its Python
internals directly: one connection, one handle space. What it adds:

- the primary context of device 0, retained by the first call that needs the device and made
  current on every thread that has no context yet, as NVIDIA's cudart does;
- the per-thread last error (`cudaGetLastError`, `cudaPeekAtLastError`) and the process's
  sticky error: once a kernel has faulted (700 illegal address, 710 assert, ...) every call
  that uses the device reports it, until `cudaDeviceReset`.
(The per-thread stack of launch configurations that `<<<...>>>` pushes and pops is C:
shim/c/runtime_launch_config.c.)

Implementations raise CudaError with a driver code (from the driver layer or the server) or a
runtime code of their own (`E.cudaErrorInvalidConfiguration`); the decorators translate
through DRIVER_TO_RUNTIME, the identity wherever both enums define a number, so runtime-only
codes pass through unchanged.
"""

from __future__ import annotations

import functools
import os
import sys
import threading

from vgpu.api.cudadefs import CUresult
from vgpu.api.cudartdefs import cudaError
from vgpu.errors import CudaError
from vgpu.protocol import STICKY_ERRORS  # the same numbers in both enums: 700, 710, ...

from ..driver import context as driver_context
from ..driver import device as driver_device
from ..driver._state import check_out, ffi, finish_recorded_call, ptr, report_failure
from ..driver._state import state as driver_state

__all__ = ["CudaError", "ffi", "ptr", "check_out", "driver_state", "runtime", "api",
           "query_api", "current_context", "initialize", "set_pointer", "warn_once", "E",
           "DRIVER_TO_RUNTIME", "STICKY_ERRORS"]


E = cudaError  # short alias for error codes: E.cudaErrorInvalidValue

# The cudaError_t the runtime reports for each CUresult: the same number wherever
# driver_types.h defines it (CUDA 10.1 aligned the two enums), else cudaErrorUnknown.
_RUNTIME_CODES = frozenset(cudaError)
DRIVER_TO_RUNTIME = {int(code): int(code) if code in _RUNTIME_CODES else int(E.cudaErrorUnknown)
                     for code in CUresult}



class RuntimeState:
    def __init__(self) -> None:
        self.thread = threading.local()
        self.sticky_error = 0
        self.primary_contexts: dict[int, int] = {}  # device -> its retained primary context
        self.cache_config = 0  # cudaFuncCachePreferNone until cudaDeviceSetCacheConfig
        self.lock = threading.Lock()
        self.warned: set = set()

    def last_error(self) -> int:
        return getattr(self.thread, "last_error", 0)

    def set_last_error(self, code: int) -> None:
        self.thread.last_error = code

    def fail(self, exc: CudaError, where: str) -> int:
        """The cudaError_t a failed call returns, recorded as the thread's last error; not
        cudaErrorNotReady, which a query returns for work still running (no error: NVIDIA's
        runtime keeps it out of the last error too)."""
        code = report_failure(exc, where)
        code = DRIVER_TO_RUNTIME.get(code, code)
        if code != cudaError.cudaErrorNotReady:
            self.thread.last_error = code
        if code in STICKY_ERRORS:
            self.sticky_error = code
        return code

    def after_fork_in_child(self) -> None:
        """The child has a session of its own (the driver layer reconnects): no context yet."""
        self.sticky_error = 0
        self.primary_contexts = {}
        self.lock = threading.Lock()


runtime = RuntimeState()
os.register_at_fork(after_in_child=runtime.after_fork_in_child)


def api(fn):
    """A runtime call that uses the device: it makes a context current first (as every such
    CUDA call does implicitly), reports the sticky error once there is one, and its failure
    becomes the calling thread's last error."""

    @functools.wraps(fn)
    def wrapper(*args):
        if runtime.sticky_error:
            runtime.thread.last_error = runtime.sticky_error
            return runtime.sticky_error
        try:
            current_context()
            fn(*args)
            if driver_state.recording_threads:
                finish_recorded_call()
            return 0
        except CudaError as exc:
            return runtime.fail(exc, fn.__name__)
        finally:
            if driver_state.recording_threads:
                driver_state.stop_recording()

    return wrapper


def query_api(fn):
    """A runtime call answered from descriptions (versions, device properties): it works
    after a kernel fault too, as CUDA's do; its failure becomes the thread's last error."""

    @functools.wraps(fn)
    def wrapper(*args):
        try:
            fn(*args)
            return 0
        except CudaError as exc:
            return runtime.fail(exc, fn.__name__)

    return wrapper


def initialize() -> None:
    """Connect the driver layer to the server if nothing has yet (cuInit)."""
    if not driver_state.initialized:
        driver_device.cuInit.__wrapped__(0)


def current_context() -> int:
    """The calling thread's current context; the primary context of the thread's device
    (cudaSetDevice's, else 0) is retained and made current on first use if it has none."""
    stack = getattr(driver_state.thread, "stack", None)
    if stack and stack[-1] in driver_state.contexts:
        return stack[-1]
    context = primary_context(thread_device())
    driver_state.stack().append(context)
    return context


def thread_device() -> int:
    """The device cudaSetDevice chose for the calling thread (0 until it does)."""
    return getattr(runtime.thread, "device", 0)


def primary_context(device: int) -> int:
    """Device `device`'s primary context, retained the first time."""
    with runtime.lock:
        initialize()
        context = runtime.primary_contexts.get(device)
        if context is None or context not in driver_state.contexts:
            out = ffi.new("CUcontext *")
            driver_context.cuDevicePrimaryCtxRetain.__wrapped__(out, device)
            context = runtime.primary_contexts[device] = ptr(out[0])
        return context


def set_pointer(out, value: int) -> None:
    """Write an address or handle through a `T **` out-parameter (`void *` converts to any
    pointer type, whichever cffi instance declared it)."""
    check_out(out)
    out[0] = ffi.cast("void *", value)


def warn_once(key, message: str) -> None:
    """One line on stderr the first time `key` comes up: for what a user must act on."""
    if key not in runtime.warned:
        runtime.warned.add(key)
        print(f"vgpu: {message}", file=sys.stderr, flush=True)
