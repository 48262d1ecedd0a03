"""CUDA graphs as the client holds them: graphs, their nodes and edges, and executable graphs.

A graph lives in the client until it is instantiated (building one is many small calls that
need no device). A node is described by the steps that running it takes, recorded while its
parameters were checked (graph_recording.py): wire calls the server runs (launches, copies,
memsets, event records and waits), and steps only the client can take (host functions,
copies to or from pageable host memory). Instantiating orders the steps (graph_exec.py) and
sends the server's share once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ._state import CudaError, E, ffi, handle_of, state

# Handle kinds of graph objects (beside _state.Kind's, which end at 12).
GRAPH, GRAPH_NODE, GRAPH_EXEC = 0x40, 0x41, 0x42

# CUgraphNodeType (cudaGraphNodeType has the same numbers).
KERNEL, MEMCPY, MEMSET, HOST, CHILD_GRAPH, EMPTY, WAIT_EVENT, EVENT_RECORD = range(8)
MEM_ALLOC, MEM_FREE = 10, 11
CONDITIONAL = 13


@dataclass(eq=False)
class GraphAllocation:
    """Device memory a memory-alloc node took when it was made (graph_memory.py): kept while
    graphs or executable graphs holding the node live, freed after the last if a free node
    of a graph names it (else the program frees it, as CUDA's programs do)."""

    address: int
    size: int
    holders: int = 1
    freed_by_graph: bool = False

    def release(self) -> None:
        self.holders -= 1
        if self.holders == 0 and self.freed_by_graph and self.address in state.allocations:
            from .memory import _free  # memory asks graph_capture (and so this) of streams

            _free(self.address)


@dataclass(eq=False)
class Condition(GraphAllocation):
    """A conditional handle (graph_conditional.py): its value is these 4 bytes of device
    memory, which kernels set (cudaGraphSetConditional) and the server reads where a
    conditional node runs; the handle is their address. Held by the graph it was made for
    and by the conditional nodes (and their copies) that use it."""

    graph: Graph | None = None
    default: int = 0
    flags: int = 0

    def release(self) -> None:
        super().release()
        if self.holders == 0:
            graphs.conditions.pop(self.address, None)


@dataclass(eq=False)
class Node:
    handle: int
    graph: Graph
    kind: int
    # ("wire", op, args) for the server; ("host", fn, user_data) (fn a C function, or a
    # Python one for host-to-host copies); ("local", conn method, args)
    steps: list[tuple]
    # What the node's Get*Params calls answer: its parameters as given, plus what keeps
    # pointers handed back alive.
    params: dict = field(default_factory=dict)
    deps: list[Node] = field(default_factory=list)
    child: Graph | None = None  # CHILD_GRAPH: its own copy of the graph it embeds
    allocation: GraphAllocation | None = None  # MEM_ALLOC: the memory it stands for
    # CONDITIONAL: its body graphs (owned by it, as a child graph is), and its condition's
    # device memory (the node holds it, as an alloc node holds its memory)
    bodies: list[Graph] = field(default_factory=list)
    # The data of the edges from its dependencies that are not default ones (graph_edges.py)
    edge_data: dict[Node, bytes] = field(default_factory=dict)


@dataclass(eq=False)
class Graph:
    handle: int
    nodes: list[Node] = field(default_factory=list)  # in creation order
    # A graph another embeds as a child: owned by that node, not destroyable on its own.
    owned_by: Node | None = None
    conditions: list[Condition] = field(default_factory=list)  # handles made for it
    # User objects it holds references to -> how many (graph_user_objects.py)
    user_objects: dict = field(default_factory=dict)


@dataclass(eq=False)
class Exec:
    handle: int
    context: int
    graph: Graph  # the graph it was instantiated from: its nodes name the executable's
    flags: int
    # The executable's own copy of the graph (what updates change), and which node of it
    # each node of `graph` stands for (by handle).
    copy: Graph
    twins: dict[int, Node]
    shape: list[tuple]  # (node kind, dependency indices) of each node: what updates keep
    disabled: set[int] = field(default_factory=set)  # nodes of `graph` switched off
    # What one launch does, in order: ("server", segment index), ("host", fn, data),
    # ("local", method, args).
    plan: list[tuple] = field(default_factory=list)
    # Node handle of `graph` -> [(segment, index of its call)], for the per-node updates.
    positions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    segments: list[list] = field(default_factory=list)  # the server's calls, as sent
    # The user objects its copy holds, whose destructors wait for its launches
    user_objects: set = field(default_factory=set)


class GraphState:
    """Every live graph object of the process, by handle."""

    def __init__(self) -> None:
        self.graphs: dict[int, Graph] = {}
        self.nodes: dict[int, Node] = {}
        self.execs: dict[int, Exec] = {}
        self.conditions: dict[int, Condition] = {}  # by handle (its address)
        self.lock = state.lock

    def new_graph(self, owned_by: Node | None = None) -> Graph:
        graph = Graph(state.new_handle(GRAPH), owned_by=owned_by)
        self.graphs[graph.handle] = graph
        return graph

    def graph(self, value) -> Graph:
        return self.graphs[handle_of(value, GRAPH, self.graphs)]

    def node(self, value) -> Node:
        return self.nodes[handle_of(value, GRAPH_NODE, self.nodes)]

    def exec(self, value) -> Exec:
        return self.execs[handle_of(value, GRAPH_EXEC, self.execs)]

    def add_node(self, graph: Graph, kind: int, steps: list, deps: list[Node],
                 params: dict | None = None, child: Graph | None = None) -> Node:
        node = Node(state.new_handle(GRAPH_NODE), graph, kind, steps, params or {},
                    list(deps), child)
        graph.nodes.append(node)
        self.nodes[node.handle] = node
        return node

    def drop_graph(self, graph: Graph) -> None:
        """Forget a graph, its nodes and the graphs its child nodes own."""
        for node in graph.nodes:
            self.drop_node(node)
        for condition in graph.conditions:
            condition.release()
        held, graph.user_objects = graph.user_objects, {}
        for user_object, count in held.items():
            user_object.given_back(count)
        self.graphs.pop(graph.handle, None)

    def drop_node(self, node: Node) -> None:
        self.nodes.pop(node.handle, None)
        if node.child is not None:
            self.drop_graph(node.child)
        for body in node.bodies:
            self.drop_graph(body)
        if node.allocation is not None:
            node.allocation.release()


graphs = GraphState()


def dependencies(graph: Graph, array, count: int) -> list[Node]:
    """The nodes a C array of `count` CUgraphNode names: live nodes of `graph`, no repeats."""
    if count and array == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "dependencies is NULL")
    nodes = []
    for i in range(count):
        node = graphs.node(array[i])
        if node.graph is not graph:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"node 0x{node.handle:x} belongs to another graph")
        if node in nodes:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a dependency is named twice")
        nodes.append(node)
    return nodes


def dependents(node: Node) -> list[Node]:
    return [n for n in node.graph.nodes if node in n.deps]


def edges(graph: Graph) -> list[tuple[Node, Node]]:
    return [(dep, node) for node in graph.nodes for dep in node.deps]


def topological(graph: Graph) -> list[Node]:
    """The nodes in an order that respects every edge (creation order among the ready);
    CUDA_ERROR_INVALID_VALUE for a graph with a cycle."""
    waiting = {node: len(node.deps) for node in graph.nodes}
    ready = [node for node in graph.nodes if not node.deps]
    order: list[Node] = []
    index = {node: i for i, node in enumerate(graph.nodes)}
    while ready:
        ready.sort(key=index.__getitem__)
        node = ready.pop(0)
        order.append(node)
        for later in dependents(node):
            waiting[later] -= 1
            if waiting[later] == 0:
                ready.append(later)
    if len(order) != len(graph.nodes):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the graph has a cycle")
    return order


def clone(graph: Graph, owned_by: Node | None = None) -> tuple[Graph, dict[Node, Node]]:
    """A copy of `graph` with new handles; returns it and the map original -> copy."""
    copy = graphs.new_graph(owned_by)
    for user_object, count in graph.user_objects.items():  # the same references again
        copy.user_objects[user_object] = count
        user_object.held(count)
    mapping: dict[Node, Node] = {}
    for node in graph.nodes:
        twin = graphs.add_node(copy, node.kind, list(node.steps),
                               [mapping[d] for d in node.deps], dict(node.params))
        twin.edge_data = {mapping[d]: data for d, data in node.edge_data.items()}
        if node.child is not None:
            twin.child = clone(node.child, twin)[0]
        twin.bodies = [clone(body, twin)[0] for body in node.bodies]
        if node.allocation is not None:
            twin.allocation = node.allocation
            node.allocation.holders += 1
        twin.params["original"] = node.params.get("original", node.handle)
        mapping[node] = twin
    return copy, mapping


def write_nodes(nodes: list[Node], out, count_ptr) -> None:
    """CUDA's way of handing back a list: with `out` NULL the count; else up to *count of
    them, and *count set to how many there are only if fewer (extra slots zeroed)."""
    if count_ptr == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the count pointer is NULL")
    if out == ffi.NULL:
        count_ptr[0] = len(nodes)
        return
    room = count_ptr[0]
    for i in range(room):
        out[i] = ffi.cast("void *", nodes[i].handle) if i < len(nodes) else ffi.NULL
    if len(nodes) < room:
        count_ptr[0] = len(nodes)


_ids = itertools.count(1)


def next_id() -> int:
    """Capture sequence ids (cuStreamGetCaptureInfo's id_out): unique within the process."""
    return next(_ids)
