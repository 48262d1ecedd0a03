"""Stream capture: work issued to a capturing stream becomes graph nodes instead of running.

A capture starts on one stream and spreads to others through events (a stream that waits for
an event recorded during the capture joins it); each stream of a capture has its own
frontier, the nodes its next work depends on. Every call that takes a stream checks it
(memory._check_stream): on a capturing stream the call is recorded (graph_recording.py) and,
once it succeeded, its steps become one node after that stream's frontier.

Modes (CUstreamCaptureMode) decide which other calls are refused while a capture is on:
the "potentially unsafe" ones that wait for the device or allocate (cuMemAlloc, a context or
stream synchronization), refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in any thread
under a global capture, in the capturing thread under a thread-local one, never under a
relaxed one, and never in a thread whose own mode (cuThreadExchangeStreamCaptureMode) is
relaxed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from . import graph_edges
from ._state import CudaError, E, api, check_out, ffi, state
from .graph_model import (
    CHILD_GRAPH,
    EMPTY,
    KERNEL,
    MEMCPY,
    MEMSET,
    Graph,
    Node,
    clone,
    dependencies,
    graphs,
    next_id,
)
from .graph_recording import Recorder

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2  # CUstreamCaptureMode
NONE, ACTIVE, INVALIDATED = 0, 1, 2  # CUstreamCaptureStatus
LEGACY_STREAMS = (0, 1)  # the NULL stream and CU_STREAM_LEGACY
CU_STREAM_ADD_CAPTURE_DEPENDENCIES, CU_STREAM_SET_CAPTURE_DEPENDENCIES = 0, 1
_KINDS = {"cuLaunchKernel": KERNEL, "cuLaunchCooperativeKernel": KERNEL, "vgpuMemset": MEMSET,
          "cuMemcpyHtoD": MEMCPY, "cuMemcpyDtoH": MEMCPY, "cuMemcpyDtoD": MEMCPY}


@dataclass(eq=False)
class Capture:
    id: int
    graph: Graph
    mode: int
    origin: int  # the stream it began on, where it must end
    thread: int  # the thread that began it
    frontier: dict[int, list[Node]] = field(default_factory=dict)  # stream -> its frontier
    # stream -> the data of the edges from its frontier to its next node, where not default
    edges: dict[int, dict[Node, bytes]] = field(default_factory=dict)
    status: int = ACTIVE
    handed_out: tuple = ()  # the arrays cuStreamGetCaptureInfo last gave


captures: dict[int, Capture] = {}  # capturing stream -> its capture
# Events recorded during a capture -> (the capture, the frontier they stand for).
captured_events: dict[int, tuple[Capture, list[Node]]] = {}
_thread_modes = threading.local()  # cuThreadExchangeStreamCaptureMode's per-thread mode


class CaptureRecorder(Recorder):
    """A recorder whose refusals also invalidate the capture, as CUDA's do."""

    def __init__(self, capture: Capture) -> None:
        super().__init__("stream capture")
        self.capture = capture
        self.child: Graph | None = None  # a graph launch captured: the graph it runs

    def refuse(self, what: str):
        self.capture.status = INVALIDATED
        super().refuse(what)


def enter_stream(handle: int) -> None:
    """Called by every call that takes a stream, once it is checked: on a capturing stream
    the call is recorded; on the legacy stream while a blocking stream captures, refused."""
    capture = captures.get(handle)
    if capture is None:
        if handle in LEGACY_STREAMS:
            _refuse_implicit()
        return
    if capture.status == INVALIDATED:
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                        "the stream's capture was invalidated by an earlier error")
    recorder = CaptureRecorder(capture)
    state.start_recording(recorder, lambda: _add_recorded(capture, handle, recorder))


def _refuse_implicit() -> None:
    """Work on the legacy stream would wait for a capturing blocking stream: CUDA refuses
    and invalidates that capture (relaxed captures excepted)."""
    for stream, capture in captures.items():
        blocking = stream in (0, 1, 2) or not state.streams.get(stream, {}).get("flags", 0) & 1
        if blocking and capture.mode != RELAXED and capture.status == ACTIVE:
            capture.status = INVALIDATED
            raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                            "the legacy stream cannot be used while a blocking stream "
                            "captures")


def _add_recorded(capture: Capture, stream: int, recorder: CaptureRecorder) -> None:
    if recorder.child is not None:  # a graph launched: a child graph node, as CUDA makes
        node = _add_after_frontier(capture, stream, CHILD_GRAPH, [], {})
        node.child = clone(recorder.child, node)[0]
        return
    steps = recorder.steps
    kinds = {_KINDS.get(step[1], -1) if step[0] == "wire" else MEMCPY for step in steps}
    if -1 in kinds or len(kinds) > 1:
        capture.status = INVALIDATED
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "this operation cannot be captured into a graph by vgpu")
    kind = kinds.pop() if kinds else EMPTY
    _add_after_frontier(capture, stream, kind, steps,
                        _kernel_params(steps[0]) if kind == KERNEL else {})


def _kernel_params(step: tuple) -> dict:
    """A captured launch's parameters, as a kernel node built from them keeps them (what
    cuGraphKernelNodeGetParams answers)."""
    function, gx, gy, gz, bx, by, bz, shared, _, args = step[2]
    return {"function": function, "layout": state.functions[function], "grid": (gx, gy, gz),
            "block": (bx, by, bz), "shared": shared, "args": bytes(args)}


def _add_after_frontier(capture: Capture, stream: int, kind: int, steps: list,
                        params: dict) -> Node:
    """A node after `stream`'s frontier, the edges to it carrying the data set for them."""
    frontier = capture.frontier[stream]
    data = capture.edges.get(stream, {})
    for dep, edge in data.items():
        graph_edges.check(edge, dep.kind, kind)
    node = graphs.add_node(capture.graph, kind, steps, frontier, params)
    node.edge_data = dict(data)
    capture.frontier[stream] = [node]
    capture.edges.pop(stream, None)
    return node


def add_node_to_capture(stream: int, kind: int, steps: list, params: dict) -> bool:
    """A node that a call on `stream` adds when the stream captures (host functions); False
    when it does not."""
    capture = captures.get(stream)
    if capture is None:
        return False
    _add_after_frontier(capture, stream, kind, steps, params)
    return True


def record_event(event: int, stream: int) -> bool:
    """cuEventRecord on a capturing stream: the event stands for that stream's frontier (no
    node). True when it did; an event recorded outside captures forgets any frontier."""
    capture = captures.get(stream)
    if capture is None:
        captured_events.pop(event, None)
        return False
    captured_events[event] = (capture, list(capture.frontier[stream]))
    return True


def wait_event(stream: int, event: int) -> bool:
    """cuStreamWaitEvent on an event recorded during a capture: the stream joins that
    capture (or, already in it, adds the event's frontier to its own). True when the wait
    belongs to a capture."""
    recorded = captured_events.get(event)
    capture = captures.get(stream)
    if recorded is None:
        return capture is not None  # waits outside the capture order nothing in the graph
    owner, frontier = recorded
    if owner.status != ACTIVE or captures.get(owner.origin) is not owner:
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                        "the event was recorded in a capture that has ended")
    if capture is None:
        if stream in LEGACY_STREAMS:
            raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                            "the legacy stream cannot join a capture")
        captures[stream] = owner
        owner.frontier[stream] = list(frontier)
    elif capture is not owner:
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                        "the stream and the event belong to different captures")
    else:
        owner.frontier[stream] += [n for n in frontier if n not in owner.frontier[stream]]
    return True


def forbid_unsafe(what: str) -> None:
    """Refuse a call that waits for the device or allocates while a capture forbids it."""
    if not captures:
        return
    mine = getattr(_thread_modes, "mode", GLOBAL)
    if mine == RELAXED:
        return
    me = threading.get_ident()
    for capture in captures.values():
        if capture.mode == RELAXED:
            continue
        if capture.thread == me or (capture.mode == GLOBAL and mine == GLOBAL):
            raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                            f"{what} is not permitted while a stream captures")


def _capturing_stream(stream) -> int:
    from .memory import stream_handle  # memory asks this module about every stream

    return stream_handle(stream)


def _begin(stream, graph: Graph, frontier: list[Node], mode: int,
           edges: dict[Node, bytes] | None = None) -> None:
    handle = _capturing_stream(stream)
    if mode not in (GLOBAL, THREAD_LOCAL, RELAXED):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown capture mode {mode}")
    if handle in LEGACY_STREAMS:
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "the legacy NULL stream cannot be captured")
    if handle in captures:
        raise CudaError(E.CUDA_ERROR_ILLEGAL_STATE, "the stream is already capturing")
    capture = Capture(next_id(), graph, mode, handle, threading.get_ident())
    capture.frontier[handle] = frontier
    if edges:
        capture.edges[handle] = edges
    captures[handle] = capture


@api
def cuStreamBeginCapture_v2(stream, mode):
    state.current_context()
    _begin(stream, graphs.new_graph(), [], mode)


@api
def cuStreamBeginCapture(stream):
    cuStreamBeginCapture_v2.__wrapped__(stream, GLOBAL)


@api
def cuStreamBeginCaptureToGraph(stream, graph, deps, edge_data, count, mode):
    state.current_context()
    target = graphs.graph(graph)
    nodes = dependencies(target, deps, count)
    _begin(stream, target, nodes, mode, _edge_map(nodes, edge_data, count))


def _edge_map(nodes: list[Node], edge_data, count: int) -> dict[Node, bytes]:
    return {node: data for node, data in zip(nodes, graph_edges.read(edge_data, count),
                                             strict=True) if data != graph_edges.DEFAULT}


def end_capture(stream) -> Graph:
    handle = _capturing_stream(stream)
    capture = captures.get(handle)
    if capture is None:
        raise CudaError(E.CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing")
    if capture.origin != handle:
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                        "the capture must end on the stream it began on")
    if capture.mode != RELAXED and capture.thread != threading.get_ident():
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                        "the capture began in another thread")
    for stream_handle in capture.frontier:
        captures.pop(stream_handle, None)
    for event in [e for e, (c, _) in captured_events.items() if c is capture]:
        del captured_events[event]
    joined = _ancestors(capture.frontier[handle])
    if capture.status == INVALIDATED:
        _discard(capture.graph)
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                        "the capture was invalidated by an operation it could not capture")
    for other, frontier in capture.frontier.items():
        if other != handle and not all(node in joined for node in frontier):
            _discard(capture.graph)
            raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                            "a stream that joined the capture was not joined back into the "
                            "stream it began on")
    return capture.graph


def _discard(graph: Graph) -> None:
    graphs.drop_graph(graph)


def _ancestors(frontier: list[Node]) -> set[Node]:
    seen: set[Node] = set()
    todo = list(frontier)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.deps)
    return seen


@api
def cuStreamEndCapture(stream, graph_out):
    check_out(graph_out)
    graph_out[0] = ffi.NULL
    graph_out[0] = ffi.cast("void *", end_capture(stream).handle)


def capture_status(stream) -> tuple[int, Capture | None]:
    """(CUstreamCaptureStatus, the capture) of a stream."""
    handle = _capturing_stream(stream)
    capture = captures.get(handle)
    if capture is None:
        if handle in LEGACY_STREAMS and any(c.mode != RELAXED for c in captures.values()):
            raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                            "the legacy stream is asked about while a stream captures")
        return NONE, None
    return capture.status, capture


@api
def cuStreamIsCapturing(stream, status):
    check_out(status)
    status[0] = capture_status(stream)[0]


def capture_info(stream, status_out, id_out, graph_out, deps_out, count_out,
                 edges_out=ffi.NULL) -> None:
    check_out(status_out)
    status, capture = capture_status(stream)
    status_out[0] = status
    if capture is None:
        return
    if id_out != ffi.NULL:
        id_out[0] = capture.id
    if graph_out != ffi.NULL:
        graph_out[0] = ffi.cast("void *", capture.graph.handle)
    handle = _capturing_stream(stream)
    frontier = capture.frontier[handle]
    datas = [capture.edges.get(handle, {}).get(n, graph_edges.DEFAULT) for n in frontier]
    if edges_out != ffi.NULL and deps_out == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "edge data asked for without the nodes")
    if deps_out != ffi.NULL:
        nodes = ffi.new("void *[]", [ffi.cast("void *", n.handle) for n in frontier] or 1)
        edges = ffi.new("CUgraphEdgeData[]", len(frontier) or 1)
        if edges_out == ffi.NULL:
            graph_edges.write(ffi.NULL, datas, len(datas))  # refuses a lossy query
        else:
            graph_edges.write(edges, datas, len(datas))
            edges_out[0] = ffi.cast("void *", edges)
        capture.handed_out = (nodes, edges)
        deps_out[0] = ffi.cast("void *", nodes)
    if count_out != ffi.NULL:
        count_out[0] = len(frontier)


@api
def cuStreamGetCaptureInfo(stream, status_out, id_out):
    capture_info(stream, status_out, id_out, ffi.NULL, ffi.NULL, ffi.NULL)


@api
def cuStreamGetCaptureInfo_v2(stream, status_out, id_out, graph_out, deps_out, count_out):
    capture_info(stream, status_out, id_out, graph_out, deps_out, count_out)


@api
def cuStreamGetCaptureInfo_v3(stream, status_out, id_out, graph_out, deps_out, edges_out,
                              count_out):
    capture_info(stream, status_out, id_out, graph_out, deps_out, count_out, edges_out)


def update_dependencies(stream, deps, count: int, flags: int, edge_data=ffi.NULL) -> None:
    status, capture = capture_status(stream)
    if status != ACTIVE:
        raise CudaError(E.CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing")
    nodes = dependencies(capture.graph, deps, count)
    edges = _edge_map(nodes, edge_data, count)
    handle = _capturing_stream(stream)
    if flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES:
        capture.frontier[handle] = nodes
        capture.edges[handle] = edges
    elif flags == CU_STREAM_ADD_CAPTURE_DEPENDENCIES:
        capture.frontier[handle] += [n for n in nodes if n not in capture.frontier[handle]]
        capture.edges.setdefault(handle, {}).update(edges)
    else:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown flags {flags}")


@api
def cuStreamUpdateCaptureDependencies(stream, deps, count, flags):
    update_dependencies(stream, deps, count, flags)


@api
def cuStreamUpdateCaptureDependencies_v2(stream, deps, edge_data, count, flags):
    update_dependencies(stream, deps, count, flags, edge_data)


@api
def cuThreadExchangeStreamCaptureMode(mode):
    check_out(mode)
    if mode[0] not in (GLOBAL, THREAD_LOCAL, RELAXED):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown capture mode {mode[0]}")
    old = getattr(_thread_modes, "mode", GLOBAL)
    _thread_modes.mode = mode[0]
    mode[0] = old
