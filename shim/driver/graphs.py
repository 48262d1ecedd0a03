"""CUDA graphs built node by node, and what can be asked of them (driver API).

The graph lives in the client (graph_model.py); nodes get their steps from graph_nodes.py.
Instantiating and launching are in graph_exec.py.
"""

from __future__ import annotations

from . import graph_edges, graph_kernel_attributes
from . import graph_nodes as build
from ._state import CudaError, E, api, check_out, ffi, state
from .graph_model import (
    CHILD_GRAPH,
    EMPTY,
    EVENT_RECORD,
    HOST,
    KERNEL,
    MEMCPY,
    MEMSET,
    WAIT_EVENT,
    Graph,
    Node,
    clone,
    dependencies,
    dependents,
    edges,
    graphs,
    write_nodes,
)


def _out_node(out, node: Node) -> None:
    out[0] = ffi.cast("void *", node.handle)


def add(out, graph, deps, count: int, kind: int, make, edge_data=ffi.NULL) -> Node:
    """Add a node of `kind` whose (steps, params) `make()` builds, after `deps` (the edges
    from them carrying `edge_data`, a CUgraphEdgeData array or NULL)."""
    check_out(out)
    target = graphs.graph(graph)
    after = dependencies(target, deps, count)
    datas = graph_edges.read(edge_data, count)
    for dep, data in zip(after, datas, strict=True):
        graph_edges.check(data, dep.kind, kind)
    steps, params = make()
    node = graphs.add_node(target, kind, steps, after, params)
    for dep, data in zip(after, datas, strict=True):
        graph_edges.set_edge(dep, node, data)
    _out_node(out, node)
    return node


@api
def cuGraphCreate(graph_out, flags):
    check_out(graph_out)
    if flags:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "flags must be 0")
    state.current_context()
    graph_out[0] = ffi.cast("void *", graphs.new_graph().handle)


@api
def cuGraphDestroy(graph):
    target = graphs.graph(graph)
    if target.owned_by is not None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a child graph belongs to its node")
    graphs.drop_graph(target)


def kernel_node(p, v2: bool):
    """make() of a kernel node from a CUDA_KERNEL_NODE_PARAMS (v1 or v2)."""
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "nodeParams is NULL")
    func = p.func
    if v2 and func == ffi.NULL and p.kern != ffi.NULL:
        func = ffi.cast("CUfunction", p.kern)
    function, layout = build.function_of(func)
    return lambda: build.kernel_steps(
        function, layout, (p.gridDimX, p.gridDimY, p.gridDimZ),
        (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes, p.kernelParams, p.extra)


@api
def cuGraphAddKernelNode_v2(out, graph, deps, count, p):
    add(out, graph, deps, count, KERNEL, kernel_node(p, True))


@api
def cuGraphAddKernelNode(out, graph, deps, count, p):
    add(out, graph, deps, count, KERNEL, kernel_node(p, False))


def memcpy3d(p):
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "copyParams is NULL")
    steps = build.memcpy_steps(build.memcpy3d_side(p, "dst"), build.memcpy3d_side(p, "src"),
                               p.WidthInBytes, p.Height, p.Depth)
    return steps, {"copy": ffi.new("CUDA_MEMCPY3D *", p[0])}


@api
def cuGraphAddMemcpyNode(out, graph, deps, count, p, ctx):
    add(out, graph, deps, count, MEMCPY, lambda: memcpy3d(p))


def memset_node(p):
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "memsetParams is NULL")
    return build.memset_steps(p.dst, p.pitch, p.value, p.elementSize, p.width, p.height)


@api
def cuGraphAddMemsetNode(out, graph, deps, count, p, ctx):
    add(out, graph, deps, count, MEMSET, lambda: memset_node(p))


def host_params(p):
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "nodeParams is NULL")
    return build.host_steps(p.fn, p.userData)


@api
def cuGraphAddHostNode(out, graph, deps, count, p):
    add(out, graph, deps, count, HOST, lambda: host_params(p))


@api
def cuGraphAddEmptyNode(out, graph, deps, count):
    add(out, graph, deps, count, EMPTY, lambda: ([], {}))


@api
def cuGraphAddEventRecordNode(out, graph, deps, count, event):
    add(out, graph, deps, count, EVENT_RECORD, lambda: build.event_steps(event, "cuEventRecord"))


@api
def cuGraphAddEventWaitNode(out, graph, deps, count, event):
    add(out, graph, deps, count, WAIT_EVENT,
        lambda: build.event_steps(event, "cuStreamWaitEvent"))


def add_child(out, graph, deps, count, child, edge_data=ffi.NULL) -> None:
    embedded = graphs.graph(child)
    node = add(out, graph, deps, count, CHILD_GRAPH, lambda: ([], {}), edge_data)
    node.child = clone(embedded, node)[0]  # the node embeds a copy, as CUDA's does


@api
def cuGraphAddChildGraphNode(out, graph, deps, count, child):
    add_child(out, graph, deps, count, child)


@api
def cuGraphChildGraphNodeGetGraph(node, graph_out):
    check_out(graph_out)
    graph_out[0] = ffi.cast("void *", _of_kind(node, CHILD_GRAPH).child.handle)


# ----------------------------------------------------------------- node parameters

def _of_kind(value, kind: int) -> Node:
    node = graphs.node(value)
    if node.kind != kind:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"the node is of type {node.kind}, not "
                                                    f"{kind}")
    return node


def write_kernel_params(node: Node, p) -> None:
    params = node.params
    p.func = ffi.cast("CUfunction", params["function"])
    p.gridDimX, p.gridDimY, p.gridDimZ = params["grid"]
    p.blockDimX, p.blockDimY, p.blockDimZ = params["block"]
    p.sharedMemBytes = params["shared"]
    p.kernelParams = build.kernel_param_pointers(params)
    p.extra = ffi.NULL


@api
def cuGraphKernelNodeGetParams_v2(node, p):
    check_out(p)
    write_kernel_params(_of_kind(node, KERNEL), p)
    p.kern = ffi.NULL
    p.ctx = ffi.NULL


@api
def cuGraphKernelNodeGetParams(node, p):  # CUDA_KERNEL_NODE_PARAMS_v1: no kern, no ctx
    check_out(p)
    write_kernel_params(_of_kind(node, KERNEL), p)


@api
def cuGraphKernelNodeSetParams_v2(node, p):
    set_params(node, KERNEL, kernel_node(p, True))


@api
def cuGraphKernelNodeSetParams(node, p):
    set_params(node, KERNEL, kernel_node(p, False))


def set_params(node, kind: int, make) -> None:
    """New parameters for a node of a graph (executable graphs made from it keep theirs;
    a kernel node keeps its launch attributes)."""
    target = _of_kind(node, kind)
    if kind == KERNEL:
        make = graph_kernel_attributes.keep(target.params, make)
    target.steps, target.params = make()


@api
def cuGraphMemsetNodeSetParams(node, p):
    set_params(node, MEMSET, lambda: memset_node(p))


@api
def cuGraphMemcpyNodeSetParams(node, p):
    set_params(node, MEMCPY, lambda: memcpy3d(p))


@api
def cuGraphHostNodeSetParams(node, p):
    set_params(node, HOST, lambda: host_params(p))


@api
def cuGraphEventRecordNodeSetEvent(node, event):
    set_params(node, EVENT_RECORD, lambda: build.event_steps(event, "cuEventRecord"))


@api
def cuGraphEventWaitNodeSetEvent(node, event):
    set_params(node, WAIT_EVENT, lambda: build.event_steps(event, "cuStreamWaitEvent"))


@api
def cuGraphMemsetNodeGetParams(node, p):
    check_out(p)
    params = _of_kind(node, MEMSET).params
    p.dst, p.pitch, p.value = params["dst"], params["pitch"], params["value"]
    p.elementSize, p.width, p.height = params["element_size"], params["width"], params["height"]


@api
def cuGraphMemcpyNodeGetParams(node, p):
    check_out(p)
    p[0] = _of_kind(node, MEMCPY).params["copy"][0]


@api
def cuGraphHostNodeGetParams(node, p):
    check_out(p)
    params = _of_kind(node, HOST).params
    p.fn, p.userData = params["fn"], params["data"]


@api
def cuGraphEventRecordNodeGetEvent(node, event_out):
    check_out(event_out)
    event_out[0] = ffi.cast("void *", _of_kind(node, EVENT_RECORD).params["event"])


@api
def cuGraphEventWaitNodeGetEvent(node, event_out):
    check_out(event_out)
    event_out[0] = ffi.cast("void *", _of_kind(node, WAIT_EVENT).params["event"])


# ----------------------------------------------------------------- structure

@api
def cuGraphGetNodes(graph, nodes, count):
    write_nodes(graphs.graph(graph).nodes, nodes, count)


@api
def cuGraphGetRootNodes(graph, nodes, count):
    write_nodes([n for n in graphs.graph(graph).nodes if not n.deps], nodes, count)


def write_edges(graph: Graph, from_out, to_out, edge_data, count) -> None:
    check_out(count)
    pairs = edges(graph)
    if from_out == ffi.NULL and to_out == ffi.NULL and edge_data == ffi.NULL:
        count[0] = len(pairs)
        return
    if from_out == ffi.NULL or to_out == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "from and to must both be given")
    room = count[0]
    for i in range(room):
        a, b = pairs[i] if i < len(pairs) else (None, None)
        from_out[i] = ffi.cast("void *", a.handle) if a else ffi.NULL
        to_out[i] = ffi.cast("void *", b.handle) if b else ffi.NULL
    if len(pairs) < room:
        count[0] = len(pairs)
    graph_edges.write(edge_data, [graph_edges.of(a, b) for a, b in pairs], room)


@api
def cuGraphGetEdges(graph, from_out, to_out, count):
    write_edges(graphs.graph(graph), from_out, to_out, ffi.NULL, count)


@api
def cuGraphGetEdges_v2(graph, from_out, to_out, edge_data, count):
    write_edges(graphs.graph(graph), from_out, to_out, edge_data, count)


def write_neighbours(nodes: list[Node], datas: list[bytes], out, edge_data, count) -> None:
    """A node's dependencies or dependents, and the data of the edges to them."""
    if edge_data != ffi.NULL and out == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "edge data asked for without the nodes")
    write_nodes(nodes, out, count)
    if out != ffi.NULL:
        graph_edges.write(edge_data, datas, count[0])


def dependencies_of(node, out, edge_data, count) -> None:
    target = graphs.node(node)
    write_neighbours(target.deps, [graph_edges.of(d, target) for d in target.deps], out,
                     edge_data, count)


def dependents_of(node, out, edge_data, count) -> None:
    target = graphs.node(node)
    later = dependents(target)
    write_neighbours(later, [graph_edges.of(target, n) for n in later], out, edge_data, count)


@api
def cuGraphNodeGetType(node, type_out):
    check_out(type_out)
    type_out[0] = graphs.node(node).kind


@api
def cuGraphNodeGetDependencies(node, out, count):
    dependencies_of(node, out, ffi.NULL, count)


@api
def cuGraphNodeGetDependencies_v2(node, out, edge_data, count):
    dependencies_of(node, out, edge_data, count)


@api
def cuGraphNodeGetDependentNodes(node, out, count):
    dependents_of(node, out, ffi.NULL, count)


@api
def cuGraphNodeGetDependentNodes_v2(node, out, edge_data, count):
    dependents_of(node, out, edge_data, count)


def _pairs(graph, from_nodes, to_nodes, count: int) -> list[tuple[Node, Node]]:
    target = graphs.graph(graph)
    if count and (from_nodes == ffi.NULL or to_nodes == ffi.NULL):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "from and to must be given")
    pairs = []
    for i in range(count):
        a, b = graphs.node(from_nodes[i]), graphs.node(to_nodes[i])
        if a.graph is not target or b.graph is not target or a is b:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "an edge must join two nodes of the "
                                                        "graph")
        pairs.append((a, b))
    return pairs


def add_dependencies(graph, from_nodes, to_nodes, count: int, edge_data=ffi.NULL) -> None:
    pairs = _pairs(graph, from_nodes, to_nodes, count)
    datas = graph_edges.read(edge_data, count)
    for (a, b), data in zip(pairs, datas, strict=True):
        if a in b.deps:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the edge exists already")
        graph_edges.check(data, a.kind, b.kind)
    for (a, b), data in zip(pairs, datas, strict=True):
        b.deps.append(a)
        graph_edges.set_edge(a, b, data)


def remove_dependencies(graph, from_nodes, to_nodes, count: int, edge_data=ffi.NULL) -> None:
    """Edges removed, each only with the data given (NULL: default edges)."""
    pairs = _pairs(graph, from_nodes, to_nodes, count)
    datas = graph_edges.read(edge_data, count)
    for (a, b), data in zip(pairs, datas, strict=True):
        if a not in b.deps or graph_edges.of(a, b) != data:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "no such edge")
    for a, b in pairs:
        b.deps.remove(a)
        b.edge_data.pop(a, None)


@api
def cuGraphAddDependencies(graph, from_nodes, to_nodes, count):
    add_dependencies(graph, from_nodes, to_nodes, count)


@api
def cuGraphAddDependencies_v2(graph, from_nodes, to_nodes, edge_data, count):
    add_dependencies(graph, from_nodes, to_nodes, count, edge_data)


@api
def cuGraphRemoveDependencies(graph, from_nodes, to_nodes, count):
    remove_dependencies(graph, from_nodes, to_nodes, count)


@api
def cuGraphRemoveDependencies_v2(graph, from_nodes, to_nodes, edge_data, count):
    remove_dependencies(graph, from_nodes, to_nodes, count, edge_data)


@api
def cuGraphDestroyNode(node):
    target = graphs.node(node)
    for later in dependents(target):
        later.deps.remove(target)
        later.edge_data.pop(target, None)
    target.graph.nodes.remove(target)
    graphs.drop_node(target)


@api
def cuGraphClone(graph_out, graph):
    check_out(graph_out)
    graph_out[0] = ffi.cast("void *", clone(graphs.graph(graph))[0].handle)


@api
def cuGraphNodeFindInClone(node_out, original, cloned):
    check_out(node_out)
    wanted = graphs.node(original).handle
    for node in graphs.graph(cloned).nodes:
        if node.params.get("original") == wanted:
            _out_node(node_out, node)
            return
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the node has no counterpart in that graph")
