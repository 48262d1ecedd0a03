"""Executable graphs: instantiated once, launched with one message.

Instantiating orders the graph's nodes (child graphs inlined) and splits their steps into
segments: runs of wire calls the server keeps (sent once, `vgpuGraphCreate`, answered so
that a graph the server refuses fails to instantiate), separated by
the steps only the client can take (host functions, copies to or from pageable memory).
A launch sends one `vgpuGraphLaunch` per server segment, in order with the client's own
steps: a graph without host steps is one message. Updating a kernel node of an executable
graph replaces that one call on the server (`vgpuGraphSetCall`); cuGraphExecUpdate sends
the whole updated graph again under the same handle.
"""

from __future__ import annotations

from . import graph_capture
from ._state import CudaError, E, api, check_out, ffi, state
from .graph_model import (
    GRAPH_EXEC,
    KERNEL,
    Exec,
    Graph,
    GraphAllocation,
    Node,
    graphs,
    topological,
)
from .graphs import _of_kind, kernel_node
from .memory import _check_stream

CU_GRAPH_EXEC_UPDATE_SUCCESS = 0
CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2
CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3
CU_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1
_INSTANTIATE_FLAGS = 0x1 | 0x2 | 0x8 | 0x10  # auto free, upload, device launch, priority


def _flatten(graph: Graph, top: Node | None, out: list[tuple[Node, tuple]]) -> None:
    """(top-level node, step) of every step, in an order that respects every edge; a child
    graph's steps stand where its node does."""
    for node in topological(graph):
        owner = top or node
        if node.child is not None:
            _flatten(node.child, owner, out)
        out.extend((owner, step) for step in node.steps)


def _allocations(graph: Graph) -> list[GraphAllocation]:
    """The memory of every memory-alloc node of `graph` and its child graphs."""
    found = []
    for node in graph.nodes:
        if node.allocation is not None:
            found.append(node.allocation)
        if node.child is not None:
            found += _allocations(node.child)
    return found


def plan(graph: Graph) -> tuple[list, list, dict]:
    """(plan, server segments, positions) of an executable graph of `graph`."""
    steps: list[tuple[Node, tuple]] = []
    _flatten(graph, None, steps)
    launch_plan: list[tuple] = []
    segments: list[list] = []
    positions: dict[int, list[tuple[int, int]]] = {}
    for node, step in steps:
        if step[0] != "wire":
            launch_plan.append(step)
            continue
        if not launch_plan or launch_plan[-1][0] != "server":
            launch_plan.append(("server", len(segments)))
            segments.append([])
        positions.setdefault(node.handle, []).append((len(segments) - 1,
                                                      len(segments[-1])))
        segments[-1].append([step[1], list(step[2])])
    return launch_plan, segments, positions


def _shape(graph: Graph) -> list[tuple]:
    """What an update must keep: each node's kind and its dependencies' positions."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    return [(node.kind, sorted(index[d] for d in node.deps),
             _shape(node.child) if node.child is not None else None) for node in graph.nodes]


def instantiate(graph, flags: int) -> Exec:
    context = state.current_context()
    source = graphs.graph(graph)
    if flags & ~_INSTANTIATE_FLAGS:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown instantiate flags 0x{flags:x}")
    launch_plan, segments, positions = plan(source)
    executable = Exec(state.new_handle(GRAPH_EXEC), context, source, flags, launch_plan,
                      positions, _shape(source), segments, _allocations(source))
    # Answered (one round trip, as instantiating is rare): a graph past the server's
    # bounds fails here, not at its first launch.
    state.conn().call("vgpuGraphCreate", executable.handle, context, segments)
    for allocation in executable.allocations:  # the executable graph uses them too
        allocation.holders += 1
    graphs.execs[executable.handle] = executable
    return executable


@api
def cuGraphInstantiateWithFlags(exec_out, graph, flags):
    check_out(exec_out)
    exec_out[0] = ffi.cast("void *", instantiate(graph, flags).handle)


@api
def cuGraphInstantiate_v2(exec_out, graph, error_node, log, log_size):
    check_out(exec_out)
    if error_node != ffi.NULL:
        error_node[0] = ffi.NULL
    if log != ffi.NULL and log_size:
        log[0] = b"\0"
    exec_out[0] = ffi.cast("void *", instantiate(graph, 0).handle)


@api
def cuGraphInstantiateWithParams(exec_out, graph, params):
    check_out(exec_out)
    check_out(params)
    params.result_out = 0  # CUDA_GRAPH_INSTANTIATE_SUCCESS
    params.errNode_out = ffi.NULL
    exec_out[0] = ffi.cast("void *", instantiate(graph, params.flags).handle)


@api
def cuGraphExecGetFlags(executable, flags_out):
    check_out(flags_out)
    flags_out[0] = graphs.exec(executable).flags


def launch(executable, stream) -> None:
    graph_exec = graphs.exec(executable)
    stream_handle = _check_stream(stream)
    if state.recorder() is not None:
        graph_capture.captures[stream_handle].status = graph_capture.INVALIDATED
        raise CudaError(E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "vgpu does not capture graph launches into another graph")
    conn = state.conn()
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


@api
def cuGraphUpload(executable, stream):
    graphs.exec(executable)  # instantiating sent the graph to the server already
    _check_stream(stream)


@api
def cuGraphExecDestroy(executable):
    graph_exec = graphs.exec(executable)
    del graphs.execs[graph_exec.handle]
    state.conn().post("vgpuGraphDestroy", graph_exec.handle)
    for allocation in graph_exec.allocations:
        allocation.release()


def set_kernel(executable, node, make) -> None:
    """A kernel node of an executable graph runs with new parameters from now on."""
    graph_exec = graphs.exec(executable)
    target = _of_kind(node, KERNEL)
    where = graph_exec.positions.get(target.handle)
    if target.graph is not graph_exec.graph or not where:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the node is not a kernel node of the graph this was instantiated from")
    steps, _ = make()
    (segment, index), = where
    call = [steps[0][1], list(steps[0][2])]
    graph_exec.segments[segment][index] = call
    state.conn().post("vgpuGraphSetCall", graph_exec.handle, segment, index, call)


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
    launch_plan, segments, found = plan(source)
    # Nodes keep being named by the instantiated graph's handles: the same place, same node.
    index = {n.handle: i for i, n in enumerate(source.nodes)}
    positions = {graph_exec.graph.nodes[index[h]].handle: p for h, p in found.items()}
    graph_exec.plan, graph_exec.segments, graph_exec.positions = launch_plan, segments, positions
    conn = state.conn()
    conn.post("vgpuGraphDestroy", graph_exec.handle)
    conn.post("vgpuGraphCreate", graph_exec.handle, graph_exec.context, segments)
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
