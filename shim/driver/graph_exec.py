"""Executable graphs: instantiated once, launched with one message.

Instantiating orders the graph's nodes (child graphs inlined) and splits their steps into
segments: runs of wire calls the server keeps (sent once, `vgpuGraphCreate`, answered so
that a graph the server refuses fails to instantiate), separated by
the steps only the client can take (host functions, copies to or from pageable memory).
A launch sends one `vgpuGraphLaunch` per server segment, in order with the client's own
steps: a graph without host steps is one message. A graph whose last steps are the client's
ends with an empty segment, so the server runs its kernels' tail launches after them.
Updating a kernel node of an executable graph replaces that one call on the server
(`vgpuGraphSetCall`); cuGraphExecUpdate sends the whole updated graph again under the same
handle.
"""

from __future__ import annotations

from . import graph_conditional, graph_device, graph_kernel_attributes, graph_user_objects
from ._state import CudaError, E, api, check_out, ffi, state
from .graph_model import (
    CHILD_GRAPH,
    CONDITIONAL,
    EVENT_RECORD,
    GRAPH_EXEC,
    HOST,
    KERNEL,
    MEMCPY,
    MEMSET,
    WAIT_EVENT,
    Exec,
    Graph,
    Node,
    clone,
    graphs,
    topological,
)
from .graph_nodes import event_steps
from .graphs import _of_kind, host_params, kernel_node, memcpy3d, memset_node
from .memory import _check_stream, issued_on, stream_handle

CU_GRAPH_EXEC_UPDATE_SUCCESS = 0
CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2
CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3
CU_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1
CU_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2
CU_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4
_INSTANTIATE_FLAGS = 0x1 | 0x2 | 0x4 | 0x8  # auto free, upload, device launch, priority


def _flatten(graph: Graph, top: Node | None, off: set[int],
             out: list[tuple[Node, tuple]]) -> None:
    """(top-level node, step) of every step, in an order that respects every edge; a child
    graph's steps stand where its node does, a conditional node is one ("cond", node) step;
    nodes in `off` do nothing."""
    for node in topological(graph):
        owner = top or node
        if node.handle in off:
            continue
        if node.child is not None:
            _flatten(node.child, owner, off, out)
        if node.kind == CONDITIONAL:
            out.append((owner, ("cond", node)))
        out.extend((owner, step) for step in node.steps)


def _server_call(step: tuple, bodies: list[list]) -> list:
    """A step for the server as [op, args]; a conditional node's bodies go to `bodies`."""
    if step[0] == "wire":
        return [step[1], list(step[2])]
    return graph_conditional.server_call(step[1], [_body(b, bodies) for b in step[1].bodies])


def _body(graph: Graph, bodies: list[list]) -> int:
    """A conditional node's body graph as a list of server calls in `bodies`; its index
    there (after any body of its own nodes: a body refers only to later ones)."""
    index = len(bodies)
    bodies.append([])
    steps: list[tuple[Node, tuple]] = []
    _flatten(graph, None, set(), steps)
    calls = []
    for _, step in steps:
        if step[0] not in ("wire", "cond"):
            graph_conditional.refuse_host_work()
        calls.append(_server_call(step, bodies))
    bodies[index] = calls
    return index


def _build(graph_exec: Exec) -> None:
    """The executable's launch plan, server segments and node positions, from its copy.
    Conditional nodes' bodies are segments after those the plan launches."""
    steps: list[tuple[Node | None, tuple]] = [
        (None, step) for step in graph_conditional.defaults(graph_exec.copy)]
    off = {graph_exec.twins[h].handle for h in graph_exec.disabled}
    _flatten(graph_exec.copy, None, off, steps)
    launch_plan: list[tuple] = []
    segments: list[list] = []
    bodies: list[list] = []
    found: dict[int, list[tuple[int, int]]] = {}
    for node, step in steps:
        if step[0] not in ("wire", "cond"):
            launch_plan.append(step)
            continue
        if not launch_plan or launch_plan[-1][0] != "server":
            launch_plan.append(("server", len(segments)))
            segments.append([])
        if node is not None:
            found.setdefault(node.handle, []).append((len(segments) - 1, len(segments[-1])))
        segments[-1].append(_server_call(step, bodies))
    if segments and launch_plan[-1][0] != "server":
        # The launch ends on the server, after the client's last steps: the graphs its
        # kernels launched into the tail stream run once the whole graph has.
        launch_plan.append(("server", len(segments)))
        segments.append([])
    for call in (call for segment in segments + bodies for call in segment):
        if call[0] == "vgpuGraphConditional":
            call[1][2] = [len(segments) + i for i in call[1][2]]
    graph_exec.plan, graph_exec.segments = launch_plan, segments + bodies
    graph_exec.user_objects = graph_user_objects.held_by(graph_exec.copy)
    graph_exec.positions = {original: found[twin.handle]
                            for original, twin in graph_exec.twins.items()
                            if twin.handle in found}


def _shape(graph: Graph) -> list[tuple]:
    """What an update must keep: each node's kind, its dependencies' positions and edge data,
    and the shapes of the graphs it holds (a child graph, conditional bodies)."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    return [(node.kind, sorted((index[d], node.edge_data.get(d, b"")) for d in node.deps),
             _shape(node.child) if node.child is not None else None,
             [_shape(body) for body in node.bodies]) for node in graph.nodes]


def _copy(graph_exec: Exec, source: Graph) -> None:
    """The executable's own copy of `source`, whose nodes stand for those of its graph in
    order (the graph itself, or one of the same shape)."""
    copy, mapping = clone(source)
    old, graph_exec.copy = graph_exec.copy, copy
    graph_exec.twins = {mine.handle: mapping[theirs]
                        for mine, theirs in zip(graph_exec.graph.nodes, source.nodes,
                                                strict=True)}
    graphs.drop_graph(old)  # after the new copy holds the memory both may hold


def instantiate(graph, flags: int, upload_stream=ffi.NULL) -> Exec:
    context = state.current_context()
    source = graphs.graph(graph)
    if flags & ~_INSTANTIATE_FLAGS:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown instantiate flags 0x{flags:x}")
    if flags & CU_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH and \
            flags & CU_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "a graph launched from the device does not free on launch")
    try:
        topological(source)  # a cycle fails here
    except CudaError as exc:
        raise graph_device.InstantiateError(
            exc.message, graph_device.CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE) from None
    device_launch = bool(flags & CU_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    if device_launch:
        graph_device.check(source)
    copy, mapping = clone(source)
    executable = Exec(state.new_handle(GRAPH_EXEC), context, source, flags, copy,
                      {n.handle: mapping[n] for n in source.nodes}, _shape(source))
    try:
        _build(executable)
        # Answered (one round trip, as instantiating is rare): a graph past the server's
        # bounds fails here, not at its first launch.
        state.conn().call("vgpuGraphCreate", *_create_args(executable))
    except CudaError as exc:
        graphs.drop_graph(copy)
        if device_launch and not isinstance(exc, graph_device.InstantiateError):
            raise graph_device.server_refusal(exc) from None
        raise
    graphs.execs[executable.handle] = executable
    if flags & CU_GRAPH_INSTANTIATE_FLAG_UPLOAD:
        upload(executable.handle, upload_stream)
    return executable


def _device_launch(graph_exec: Exec) -> bool:
    return bool(graph_exec.flags & CU_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)


def _create_args(graph_exec: Exec) -> tuple:
    return (graph_exec.handle, graph_exec.context, graph_exec.segments,
            _device_launch(graph_exec))


def instantiate_reporting(graph, flags: int, upload_stream, report) -> Exec:
    """instantiate(), telling `report(CUgraphInstantiateResult, node at fault or NULL)` how
    it went (the out-parameters of the *WithParams forms and cuGraphInstantiate's)."""
    report(graph_device.CUDA_GRAPH_INSTANTIATE_SUCCESS, ffi.NULL)
    try:
        return instantiate(graph, flags, upload_stream)
    except CudaError as exc:
        node = getattr(exc, "node", None)
        report(getattr(exc, "result", graph_device.CUDA_GRAPH_INSTANTIATE_ERROR),
               ffi.cast("void *", node.handle) if node is not None else ffi.NULL)
        raise


@api
def cuGraphInstantiateWithFlags(exec_out, graph, flags):
    check_out(exec_out)
    exec_out[0] = ffi.cast("void *", instantiate(graph, flags).handle)


@api
def cuGraphInstantiate_v2(exec_out, graph, error_node, log, log_size):
    check_out(exec_out)
    if log != ffi.NULL and log_size:
        log[0] = b"\0"

    def report(result: int, node) -> None:
        if error_node != ffi.NULL:
            error_node[0] = node

    try:
        exec_out[0] = ffi.cast("void *", instantiate_reporting(graph, 0, ffi.NULL, report).handle)
    except CudaError as exc:  # the log says why, as much of it as fits
        if log != ffi.NULL and log_size:
            text = exc.message.encode()[:log_size - 1]
            ffi.memmove(log, text + b"\0", len(text) + 1)
        raise


cuGraphInstantiate = cuGraphInstantiate_v2  # the same parameters, from CUDA 10.0 on


@api
def cuGraphInstantiateWithParams(exec_out, graph, params):
    check_out(exec_out)
    check_out(params)

    def report(result: int, node) -> None:
        params.result_out, params.hErrNode_out = result, node

    exec_out[0] = ffi.cast("void *", instantiate_reporting(graph, params.flags,
                                                           params.hUploadStream, report).handle)


@api
def cuGraphExecGetFlags(executable, flags_out):
    check_out(flags_out)
    # CUDA leaves out the upload flag, which does not change the executable graph
    flags_out[0] = graphs.exec(executable).flags & ~CU_GRAPH_INSTANTIATE_FLAG_UPLOAD


def launch(executable, stream) -> None:
    graph_exec = graphs.exec(executable)
    stream_handle = _check_stream(stream)
    recorder = state.recorder()
    if recorder is not None:  # captured: the graph becomes a child graph node
        recorder.child = graph_exec.copy
        return
    conn = state.conn()
    for user_object in graph_exec.user_objects:
        user_object.launched_on.add(stream_handle)
    # The client's own steps (copies to and from pageable memory) are issued on the stream
    # too: they wait for the graph's kernels before them on that stream's lane.
    with issued_on(stream):
        for step in graph_exec.plan:
            if step[0] == "server":
                conn.post("vgpuGraphLaunch", graph_exec.handle, step[1], stream_handle)
            elif step[0] == "host":
                conn.synchronize()  # a host node runs after the nodes before it
                step[1](step[2])
            else:
                getattr(conn, step[1])(*step[2])


@api
def cuGraphLaunch(executable, stream):
    launch(executable, stream)


def upload(executable, stream) -> None:
    """The graph is on the server since it was instantiated; an upload lets kernels launch
    it (a graph instantiated for device launch)."""
    graph_exec = graphs.exec(executable)
    state.conn().post("vgpuGraphUpload", graph_exec.handle, stream_handle(stream))


@api
def cuGraphUpload(executable, stream):
    upload(executable, stream)


@api
def cuGraphExecDestroy(executable):
    graph_exec = graphs.exec(executable)
    del graphs.execs[graph_exec.handle]
    state.conn().post("vgpuGraphDestroy", graph_exec.handle)
    graphs.drop_graph(graph_exec.copy)


def twin_of(graph_exec: Exec, node, kind: int) -> Node:
    """The executable's copy of `node`, a node of `kind` of the graph it was made from."""
    target = _of_kind(node, kind)
    twin = graph_exec.twins.get(target.handle)
    if twin is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the node is not a node of the graph this was instantiated from")
    return twin


def resend(graph_exec: Exec) -> None:
    """The server's copy of the executable graph replaced by what its copy is now."""
    _build(graph_exec)
    conn = state.conn()
    conn.post("vgpuGraphDestroy", graph_exec.handle)
    conn.post("vgpuGraphCreate", *_create_args(graph_exec))


def set_node(executable, node, kind: int, make) -> None:
    """A node of an executable graph runs with new parameters from now on (its graph keeps
    its own)."""
    graph_exec = graphs.exec(executable)
    twin = twin_of(graph_exec, node, kind)
    twin.steps, twin.params = make()
    resend(graph_exec)


def set_kernel(executable, node, make) -> None:
    """A kernel node's new parameters: one call replaced on the server."""
    graph_exec = graphs.exec(executable)
    twin = twin_of(graph_exec, node, KERNEL)
    twin.steps, twin.params = graph_kernel_attributes.keep(twin.params, make)()
    where = graph_exec.positions.get(graphs.node(node).handle)
    if not where:  # a disabled node: nothing of it is on the server
        return
    (segment, index), = where
    call = [twin.steps[0][1], list(twin.steps[0][2])]
    graph_exec.segments[segment][index] = call
    state.conn().post("vgpuGraphSetCall", graph_exec.handle, segment, index, call)


@api
def cuGraphExecMemsetNodeSetParams(executable, node, p, ctx):
    set_node(executable, node, MEMSET, lambda: memset_node(p))


@api
def cuGraphExecMemcpyNodeSetParams(executable, node, p, ctx):
    set_node(executable, node, MEMCPY, lambda: memcpy3d(p))


@api
def cuGraphExecHostNodeSetParams(executable, node, p):
    set_node(executable, node, HOST, lambda: host_params(p))


@api
def cuGraphExecEventRecordNodeSetEvent(executable, node, event):
    set_node(executable, node, EVENT_RECORD, lambda: event_steps(event, "cuEventRecord"))


@api
def cuGraphExecEventWaitNodeSetEvent(executable, node, event):
    set_node(executable, node, WAIT_EVENT, lambda: event_steps(event, "cuStreamWaitEvent"))


def set_child(executable, node, child) -> None:
    """A child graph node of an executable graph runs a copy of `child` from now on, which
    must have the shape of the graph it replaces (CUDA's rule for this update)."""
    graph_exec = graphs.exec(executable)
    twin = twin_of(graph_exec, node, CHILD_GRAPH)
    replacement = graphs.graph(child)
    if _shape(replacement) != _shape(twin.child):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the new child graph differs from the node's in its topology or node "
                        "types")
    old, twin.child = twin.child, clone(replacement, twin)[0]
    graphs.drop_graph(old)
    resend(graph_exec)


@api
def cuGraphExecChildGraphNodeSetParams(executable, node, child):
    set_child(executable, node, child)


def set_enabled(executable, node, enabled: bool) -> None:
    """Switch a kernel, memcpy or memset node of an executable graph off (it does nothing
    at launches) or on again."""
    graph_exec = graphs.exec(executable)
    target = graphs.node(node)
    if target.kind not in (KERNEL, MEMCPY, MEMSET):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "only kernel, memcpy and memset nodes can be switched off")
    twin_of(graph_exec, node, target.kind)
    before = set(graph_exec.disabled)
    if enabled:
        graph_exec.disabled.discard(target.handle)
    else:
        graph_exec.disabled.add(target.handle)
    if graph_exec.disabled != before:
        resend(graph_exec)


def is_enabled(executable, node) -> bool:
    graph_exec = graphs.exec(executable)
    target = graphs.node(node)
    twin_of(graph_exec, node, target.kind)
    return target.handle not in graph_exec.disabled


@api
def cuGraphNodeSetEnabled(executable, node, enabled):
    set_enabled(executable, node, bool(enabled))


@api
def cuGraphNodeGetEnabled(executable, node, enabled_out):
    check_out(enabled_out)
    enabled_out[0] = int(is_enabled(executable, node))


@api
def cuGraphExecKernelNodeSetParams_v2(executable, node, p):
    set_kernel(executable, node, kernel_node(p, True))


@api
def cuGraphExecKernelNodeSetParams(executable, node, p):
    set_kernel(executable, node, kernel_node(p, False))


def update(executable, graph) -> tuple[int, Node | None]:
    """cuGraphExecUpdate: (CUgraphExecUpdateResult, the node at fault)."""
    graph_exec = graphs.exec(executable)
    source = graphs.graph(graph)
    shape = _shape(source)
    if len(shape) != len(graph_exec.shape):
        return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, None
    for node, now, before in zip(source.nodes, shape, graph_exec.shape, strict=True):
        if now[0] != before[0]:
            return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, node
        if now != before:
            return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, node
    _copy(graph_exec, source)
    resend(graph_exec)
    return CU_GRAPH_EXEC_UPDATE_SUCCESS, None


def report_update(result: int, node: Node | None) -> None:
    if result != CU_GRAPH_EXEC_UPDATE_SUCCESS:
        raise CudaError(E.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                        "the graph differs from the executable graph's in its topology or "
                        "node types")


@api
def cuGraphExecUpdate_v2(executable, graph, info):
    check_out(info)
    result, node = update(executable, graph)
    info.result = result
    info.errorNode = ffi.cast("void *", node.handle) if node else ffi.NULL
    info.errorFromNode = ffi.NULL
    report_update(result, node)


@api
def cuGraphExecUpdate(executable, graph, error_node, result_out):
    check_out(result_out)
    result, node = update(executable, graph)
    result_out[0] = result
    if error_node != ffi.NULL:
        error_node[0] = ffi.cast("void *", node.handle) if node else ffi.NULL
    report_update(result, node)
