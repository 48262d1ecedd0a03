"""Conditional nodes of graphs (IF, WHILE, SWITCH) and their handles.

A conditional handle's value lives in 4 bytes of device memory of its own, allocated when
the handle is made (cuGraphConditionalHandleCreate); the handle is their address. Kernels
set it with the device runtime's cudaGraphSetConditional, which the emulator turns into a
store there, and the server reads it where a conditional node runs
(`vgpuGraphConditional` in server/graphs.py). So a condition needs no server state of its
own: its value is an allocation of the session, journaled and moved like any.

A conditional node owns its body graphs (one for WHILE, one or two for IF: the second is
the else branch, one per case for SWITCH), made with the node and filled by the program.
Bodies run on the server at each evaluation, so they hold only the server's work: kernels,
copies and memsets of device or pinned memory, child graphs, other conditional nodes (and
empty nodes); instantiating refuses a body with host work.
"""

from __future__ import annotations

import struct

from . import graphs as node_calls
from ._state import CudaError, E, api, check_out, ffi, state
from .context import _context_or_current
from .graph_model import CONDITIONAL, Condition, Graph, Node, graphs
from .memory import allocate

CU_GRAPH_COND_ASSIGN_DEFAULT = 1
IF, WHILE, SWITCH = 0, 1, 2  # CUgraphConditionalNodeType
CONDITION_BYTES = 4  # an unsigned int, as cudaGraphSetConditional sets it


def create_handle(graph, context: int, default: int, flags: int) -> int:
    """A new conditional handle of `graph`, holding `default` until a kernel sets it (and
    again at each launch when flags ask for it)."""
    target = graphs.graph(graph)
    if flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown conditional handle flags "
                                                    f"0x{flags:x}")
    address = allocate(CONDITION_BYTES, context)
    state.conn().post("vgpuMemset", address, struct.pack("<I", default & 0xFFFFFFFF), 1)
    condition = Condition(address, CONDITION_BYTES, freed_by_graph=True, graph=target,
                          default=default & 0xFFFFFFFF, flags=flags)
    target.conditions.append(condition)
    graphs.conditions[address] = condition
    return address


@api
def cuGraphConditionalHandleCreate(handle_out, graph, ctx, default, flags):
    check_out(handle_out)
    handle_out[0] = create_handle(graph, _context_or_current(ctx), default, flags)


def _encloses(outer: Graph, graph: Graph) -> bool:
    """Whether `graph` is `outer` or a graph nested in one of its nodes."""
    while graph is not outer:
        if graph.owned_by is None:
            return False
        graph = graph.owned_by.graph
    return True


def add_conditional(out, graph, deps, count: int, handle: int, kind: int, size: int,
                    bodies_out, edge_data=ffi.NULL) -> Node:
    """cuGraphAddNode of a conditional node: made with `size` empty body graphs, written to
    `bodies_out`."""
    check_out(bodies_out)
    condition = graphs.conditions.get(int(handle))
    if condition is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "not a conditional handle")
    if not _encloses(condition.graph, graphs.graph(graph)):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "the conditional handle belongs to another graph")
    sizes = {IF: (1, 2), WHILE: (1,)}
    if kind not in (IF, WHILE, SWITCH):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown conditional node type {kind}")
    if size not in sizes.get(kind, range(1, 1 << 16)):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"a conditional node of type {kind} cannot have {size} bodies")
    node = node_calls.add(out, graph, deps, count, CONDITIONAL,
                          lambda: ([], {"handle": condition.address, "type": kind,
                                        "size": size}), edge_data)
    node.bodies = [graphs.new_graph(owned_by=node) for _ in range(size)]
    node.allocation = condition
    condition.holders += 1
    for i, body in enumerate(node.bodies):
        bodies_out[i] = ffi.cast("void *", body.handle)
    return node


def defaults(graph: Graph) -> list[tuple]:
    """The steps that give each handle its default value at the start of a launch, for the
    handles of `graph`'s conditional nodes (nested ones too) made with
    CU_GRAPH_COND_ASSIGN_DEFAULT."""
    found: dict[int, Condition] = {}
    todo = [graph]
    while todo:
        for node in todo.pop().nodes:
            if node.kind == CONDITIONAL and node.allocation.flags & CU_GRAPH_COND_ASSIGN_DEFAULT:
                found[node.allocation.address] = node.allocation
            todo.extend(node.bodies)
            if node.child is not None:
                todo.append(node.child)
    return [("wire", "vgpuMemset", [c.address, struct.pack("<I", c.default), 1])
            for c in found.values()]


def server_call(node: Node, body_indices: list[int]) -> list:
    """The call that evaluates a conditional node on the server, its bodies being those
    segments of the executable graph."""
    return ["vgpuGraphConditional",
            [node.allocation.address, node.params["type"], list(body_indices)]]


def refuse_host_work() -> None:
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                    "a conditional node's body runs on the device: it cannot hold host "
                    "nodes, host-to-host copies or copies to or from pageable host memory")
