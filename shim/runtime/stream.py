"""Streams, events and host callbacks.

Streams and events are the driver layer's; the runtime adds nothing to their semantics. The
server runs work in arrival order, so stream order holds, `cudaStreamWaitEvent` is satisfied
by construction, and the legacy and per-thread default streams (handles 0/1 and 2, and the
`_ptsz` entry points) need no separate treatment. A host callback runs in the calling thread
once everything queued before it is done, with the status of that work.
"""

from __future__ import annotations

from ..driver import stream as driver_stream
from ..driver.memory import _check_stream
from ._state import DRIVER_TO_RUNTIME, CudaError, E, api, check_out, ffi, runtime, set_pointer

__all__ = [
    "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
    "cudaStreamDestroy", "cudaStreamSynchronize", "cudaStreamQuery", "cudaStreamWaitEvent",
    "cudaStreamGetPriority", "cudaStreamGetFlags", "cudaStreamGetDevice",
"cudaStreamAddCallback", "cudaLaunchHostFunc", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaEventRecord", "cudaEventRecordWithFlags",
    "cudaEventSynchronize", "cudaEventQuery", "cudaEventElapsedTime", "cudaEventDestroy",
]

# ----------------------------------------------------------------- streams

@api
def cudaStreamCreate(stream_out):
    set_pointer(stream_out, driver_stream._new_stream(0, 0))


@api
def cudaStreamCreateWithFlags(stream_out, flags):
    set_pointer(stream_out, driver_stream._new_stream(flags, 0))


@api
def cudaStreamCreateWithPriority(stream_out, flags, priority):
    set_pointer(stream_out, driver_stream._new_stream(flags, priority))


@api
def cudaStreamDestroy(stream):
    driver_stream.cuStreamDestroy_v2.__wrapped__(stream)


@api
def cudaStreamSynchronize(stream):
    driver_stream.cuStreamSynchronize.__wrapped__(stream)


@api
def cudaStreamQuery(stream):
    driver_stream.cuStreamQuery.__wrapped__(stream)


@api
def cudaStreamWaitEvent(stream, event, flags):
    driver_stream.cuStreamWaitEvent.__wrapped__(stream, event, flags)


@api
def cudaStreamGetPriority(stream, priority):
    driver_stream.cuStreamGetPriority.__wrapped__(stream, priority)


@api
def cudaStreamGetFlags(stream, flags):
    driver_stream.cuStreamGetFlags.__wrapped__(stream, flags)


@api
def cudaStreamGetDevice(stream, device):
    check_out(device)
    context = driver_stream._stream_info(stream)["context"]
    device[0] = driver_stream.state.contexts[context]["device"]


@api
def cudaStreamAddCallback(stream, callback, user_data, flags):
    if flags != 0:
        raise CudaError(E.cudaErrorInvalidValue, "flags must be 0")
    handle = _check_stream(stream)
    try:
        driver_stream._synchronize()
        status = 0
    except CudaError as exc:
        status = DRIVER_TO_RUNTIME.get(exc.code, exc.code)
        runtime.fail(exc, "cudaStreamAddCallback")
    callback(ffi.cast("void *", handle), status, user_data)


@api
def cudaLaunchHostFunc(stream, function, user_data):
    if driver_stream.capture_host_function(stream, function, user_data):
        return
    _check_stream(stream)
    driver_stream._synchronize()  # a stream that failed does not run its host functions
    function(user_data)


# ----------------------------------------------------------------- events

@api
def cudaEventCreate(event_out):
    set_pointer(event_out, driver_stream._new_event(0))


@api
def cudaEventCreateWithFlags(event_out, flags):
    set_pointer(event_out, driver_stream._new_event(flags))


@api
def cudaEventRecord(event, stream):
    driver_stream.cuEventRecord.__wrapped__(event, stream)


@api
def cudaEventRecordWithFlags(event, stream, flags):
    driver_stream.cuEventRecordWithFlags.__wrapped__(event, stream, flags)


@api
def cudaEventSynchronize(event):
    driver_stream.cuEventSynchronize.__wrapped__(event)


@api
def cudaEventQuery(event):
    driver_stream.cuEventQuery.__wrapped__(event)


@api
def cudaEventElapsedTime(ms, start, end):
    driver_stream.cuEventElapsedTime_v2.__wrapped__(ms, start, end)


@api
def cudaEventDestroy(event):
    driver_stream.cuEventDestroy_v2.__wrapped__(event)
