"""Streams and events.

The server runs each stream's work in its order, streams beside each other (on emu, each
stream other than the legacy one has a thread there: server/streams.py), and events order
work across streams; synchronizing with a stream, an event or the context is one round trip
that also collects the errors of queued work. Event timestamps are taken by the server
when it reaches the record. Host functions run on a thread of vgpu's in stream order
(vgpu/host_functions.py).
"""

from __future__ import annotations

from . import graph_capture
from ._state import CudaError, E, Kind, api, check_out, ffi, handle_of, state
from .graph_model import EVENT_RECORD, HOST, WAIT_EVENT
from .memory import _check_stream, stream_handle

CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_RECORD_EXTERNAL = CU_EVENT_WAIT_EXTERNAL = 0x1
# The legacy default stream: the NULL stream and CU_STREAM_LEGACY.
LEGACY_STREAMS = (0, 1)
CU_EVENT_FLAGS_MASK = 0xF
CU_EVENT_DISABLE_TIMING = 0x2
CU_EVENT_INTERPROCESS = 0x4
LEAST_PRIORITY, GREATEST_PRIORITY = 0, -5


def _create_stream(ph_stream, flags: int, priority: int) -> None:
    check_out(ph_stream)
    ph_stream[0] = ffi.cast("CUstream", _new_stream(flags, priority))


def _new_stream(flags: int, priority: int) -> int:
    context = state.current_context()
    if flags & ~CU_STREAM_NON_BLOCKING:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown stream flags 0x{flags:x}")
    priority = min(max(priority, GREATEST_PRIORITY), LEAST_PRIORITY)
    handle = state.new_handle(Kind.STREAM)
    state.conn().post("cuStreamCreate", handle, context, flags, priority)
    state.streams[handle] = {"context": context, "flags": flags, "priority": priority}
    return handle


@api
def cuStreamCreate(ph_stream, flags):
    _create_stream(ph_stream, flags, 0)


@api
def cuStreamCreateWithPriority(ph_stream, flags, priority):
    _create_stream(ph_stream, flags, priority)


@api
def cuCtxGetStreamPriorityRange(least, greatest):
    state.current_context()
    if least != ffi.NULL:
        least[0] = LEAST_PRIORITY
    if greatest != ffi.NULL:
        greatest[0] = GREATEST_PRIORITY


def _stream_info(stream) -> dict:
    handle = _check_stream(stream)
    if handle in (0, 1, 2):
        return {"context": state.current_context(), "flags": 0, "priority": 0}
    return state.streams[handle]


@api
def cuStreamGetPriority(stream, priority):
    check_out(priority)
    priority[0] = _stream_info(stream)["priority"]


@api
def cuStreamGetFlags(stream, flags):
    check_out(flags)
    flags[0] = _stream_info(stream)["flags"]


@api
def cuStreamGetDevice(stream, device):
    check_out(device)
    device[0] = state.contexts[_stream_info(stream)["context"]]["device"]


@api
def cuStreamGetCtx(stream, pctx):
    check_out(pctx)
    pctx[0] = ffi.cast("CUcontext", _stream_info(stream)["context"])


@api
def cuStreamGetCtx_v2(stream, pctx, pgreen_ctx):
    check_out(pctx)
    pctx[0] = ffi.cast("CUcontext", _stream_info(stream)["context"])
    if pgreen_ctx != ffi.NULL:
        pgreen_ctx[0] = ffi.NULL  # vgpu has no green contexts


@api
def cuStreamDestroy_v2(stream):
    handle = handle_of(stream, Kind.STREAM, state.streams)
    del state.streams[handle]
    state.conn().post("cuStreamDestroy", handle)


def _synchronize(kind: str = "context", handle: int = 0) -> None:
    state.current_context()
    if state.recorder() is None:  # (a capturing stream's refusal comes from there)
        graph_capture.forbid_unsafe("synchronizing")
    state.conn().synchronize(kind, handle, _imported(kind, handle))


def _query(kind: str, handle: int) -> None:
    state.current_context()
    if state.recorder() is None:
        graph_capture.forbid_unsafe("querying")
    if not state.conn().query(kind, handle, _imported(kind, handle)):
        raise CudaError(E.CUDA_ERROR_NOT_READY, "work is still running")


def _imported(kind: str, handle: int) -> bool:
    """Is `handle` an event another process records (opened through IPC)?"""
    return kind == "event" and state.events[handle].get("imported", False)


def on_stream(handle: int) -> int:
    """`handle`, a stream that work is queued on: one other than the legacy stream runs
    beside the server's answers (see Connection.streams_used)."""
    if handle not in LEGACY_STREAMS:
        state.conn().streams_used = True
    return handle


@api
def cuStreamSynchronize(stream):
    _synchronize("stream", _check_stream(stream))


@api
def cuStreamQuery(stream):
    _query("stream", _check_stream(stream))


@api
def cuStreamWaitEvent(stream, event, flags):
    waiter = stream_handle(stream)
    event_handle = handle_of(event, Kind.EVENT, state.events)
    if flags & ~CU_EVENT_WAIT_EXTERNAL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown event wait flags 0x{flags:x}")
    if flags & CU_EVENT_WAIT_EXTERNAL and graph_capture.add_node_to_capture(
            waiter, WAIT_EVENT, [("wire", "cuStreamWaitEvent", [0, event_handle])],
            {"event": event_handle}):
        return
    if graph_capture.wait_event(waiter, event_handle):
        return
    state.conn().post("cuStreamWaitEvent", on_stream(_check_stream(stream)), event_handle)


def queue_host_function(stream_handle: int, function) -> None:
    """Run `function()` on vgpu's host-function thread once the work queued on the stream
    before it is done; the stream's later work waits for it to return."""
    state.current_context()
    state.conn().host_functions.queue(on_stream(stream_handle), function)


@api
def cuStreamAddCallback(stream, callback, user_data, flags):
    """The callback gets the stream's status: the context's sticky error, if it has one."""
    if flags != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "flags must be 0")
    if callback == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "callback is NULL")
    handle = _check_stream(stream)
    conn = state.conn()
    queue_host_function(handle, lambda: callback(
        ffi.cast("CUstream", handle), conn.sticky_error, user_data))


@api
def cuLaunchHostFunc(stream, fn, user_data):
    if fn == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "host function is NULL")
    if capture_host_function(stream, fn, user_data):
        return
    queue_host_function(_check_stream(stream), lambda: fn(user_data))


def capture_host_function(stream, fn, user_data) -> bool:
    """A host function on a capturing stream becomes a host node; False if not capturing."""
    return graph_capture.add_node_to_capture(stream_handle(stream), HOST,
                                             [("host", fn, user_data)],
                                             {"fn": fn, "data": user_data})


# ----------------------------------------------------------------- events

@api
def cuEventCreate(ph_event, flags):
    check_out(ph_event)
    ph_event[0] = ffi.cast("CUevent", _new_event(flags))


def _new_event(flags: int) -> int:
    context = state.current_context()
    if flags & ~CU_EVENT_FLAGS_MASK:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown event flags 0x{flags:x}")
    if flags & CU_EVENT_INTERPROCESS and not flags & CU_EVENT_DISABLE_TIMING:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "an interprocess event must disable timing")
    handle = state.new_handle(Kind.EVENT)
    state.conn().post("cuEventCreate", handle, context, flags)
    state.events[handle] = {"context": context, "flags": flags}
    return handle


@api
def cuEventRecord(event, stream):
    _record(event, stream, 0)


def _record(event, stream, flags: int) -> None:
    """An event record; in a capture, the event stands for the stream's place in it, or with
    CU_EVENT_RECORD_EXTERNAL becomes an event record node. An interprocess event's record
    reaches the server before the call returns: another process told of it then waits for
    it, not for an earlier one."""
    handle = handle_of(event, Kind.EVENT, state.events)
    recorder = stream_handle(stream)
    if flags & ~CU_EVENT_RECORD_EXTERNAL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown event record flags 0x{flags:x}")
    if flags & CU_EVENT_RECORD_EXTERNAL and graph_capture.add_node_to_capture(
            recorder, EVENT_RECORD, [("wire", "cuEventRecord", [handle, 0])],
            {"event": handle}):
        return
    if graph_capture.record_event(handle, recorder):
        return
    recorder = on_stream(_check_stream(stream))
    if state.events[handle]["flags"] & CU_EVENT_INTERPROCESS:
        state.conn().call("cuEventRecord", handle, recorder)
    else:
        state.conn().post("cuEventRecord", handle, recorder)


@api
def cuEventRecordWithFlags(event, stream, flags):
    _record(event, stream, flags)


def _uncaptured_event(event) -> None:
    """An event recorded in a capture stands for a place in a graph, not for work."""
    if handle_of(event, Kind.EVENT, state.events) in graph_capture.captured_events:
        raise CudaError(E.CUDA_ERROR_CAPTURED_EVENT, "the event was recorded in a capture")


@api
def cuEventSynchronize(event):
    _uncaptured_event(event)
    _synchronize("event", handle_of(event, Kind.EVENT, state.events))


@api
def cuEventQuery(event):
    _uncaptured_event(event)
    _query("event", handle_of(event, Kind.EVENT, state.events))


@api
def cuEventElapsedTime_v2(ms, start, end):
    check_out(ms)
    a = handle_of(start, Kind.EVENT, state.events)
    b = handle_of(end, Kind.EVENT, state.events)
    result, _ = state.conn().call("cuEventElapsedTime", a, b)
    ms[0] = result


cuEventElapsedTime = cuEventElapsedTime_v2


@api
def cuEventDestroy_v2(event):
    handle = handle_of(event, Kind.EVENT, state.events)
    del state.events[handle]
    state.conn().post("cuEventDestroy", handle)
