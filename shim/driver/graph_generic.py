"""The generic node calls of CUDA 12 (cuGraphAddNode, cuGraphNodeSetParams,
cuGraphExecNodeSetParams): one parameter struct whose `type` says which node it makes, handed
to the call of that node type. The runtime's calls (cudaGraphAddNode, ...) take the same
shape of struct and come here with their own translations (`Kinds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import graph_conditional, graph_edges, graph_exec, graph_memory
from . import graph_nodes as build
from . import graphs as node_calls
from ._state import CudaError, E, api, check_out, ffi
from .graph_model import (
    CHILD_GRAPH,
    CONDITIONAL,
    EMPTY,
    EVENT_RECORD,
    HOST,
    KERNEL,
    MEM_ALLOC,
    MEM_FREE,
    MEMCPY,
    MEMSET,
    WAIT_EVENT,
    graphs,
)

CHILD_GRAPH_OWNERSHIP_MOVE = 1


@dataclass
class Kinds:
    """make() of each parameterized node type from the union member of one API's struct."""

    kernel: Callable
    memcpy: Callable
    memset: Callable
    host: Callable


DRIVER = Kinds(
    kernel=lambda p: node_calls.kernel_node(ffi.addressof(p, "kernel"), True),
    memcpy=lambda p: lambda: node_calls.memcpy3d(ffi.addressof(p.memcpy, "copyParams")),
    memset=lambda p: lambda: node_calls.memset_node(ffi.addressof(p, "memset")),
    host=lambda p: lambda: node_calls.host_params(ffi.addressof(p, "host")))


def _make(p, kinds: Kinds) -> tuple[int, Callable]:
    """(node type, make()) of a node whose steps come from its parameters."""
    makers = {KERNEL: kinds.kernel, MEMCPY: kinds.memcpy, MEMSET: kinds.memset,
              HOST: kinds.host,
              EVENT_RECORD: lambda p: lambda: build.event_steps(p.eventRecord.event,
                                                                "cuEventRecord"),
              WAIT_EVENT: lambda p: lambda: build.event_steps(p.eventWait.event,
                                                              "cuStreamWaitEvent")}
    maker = makers.get(p.type)
    if maker is None:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        f"vgpu does not set parameters of graph nodes of type {p.type} this "
                        f"way")
    return p.type, maker(p)


def add_node(out, graph, deps, count: int, p, kinds: Kinds, edge_data=ffi.NULL) -> None:
    check_out(p)
    if p.type == EMPTY:
        node_calls.add(out, graph, deps, count, EMPTY, lambda: ([], {}), edge_data)
    elif p.type == CHILD_GRAPH:
        node_calls.add_child(out, graph, deps, count, p.graph.graph, edge_data)
        if p.graph.ownership == CHILD_GRAPH_OWNERSHIP_MOVE:  # the node's copy is the graph
            graphs.drop_graph(graphs.graph(p.graph.graph))
    elif p.type == CONDITIONAL:
        c = p.conditional
        graph_conditional.add_conditional(out, graph, deps, count, c.handle, c.type, c.size,
                                          c.phGraph_out, edge_data)
    elif p.type in (MEM_ALLOC, MEM_FREE):
        if any(data != graph_edges.DEFAULT for data in graph_edges.read(edge_data, count)):
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            "edges into memory nodes are default edges")
        if p.type == MEM_ALLOC:
            graph_memory.check_pool_props(p.alloc.poolProps)
            address = graph_memory.add_alloc(out, graph, deps, count, p.alloc.bytesize)
            # CUdeviceptr in the driver's struct, void * in the runtime's
            p.alloc.dptr = address if isinstance(p.alloc.dptr, int) else \
                ffi.cast("void *", address)
        else:
            graph_memory.add_free(out, graph, deps, count,
                                  int(ffi.cast("uintptr_t", p.free.dptr)))
    else:
        kind, make = _make(p, kinds)
        node_calls.add(out, graph, deps, count, kind, make, edge_data)


def set_node(node, p, kinds: Kinds) -> None:
    check_out(p)
    kind, make = _make(p, kinds)
    node_calls.set_params(node, kind, make)


def set_exec_node(executable, node, p, kinds: Kinds) -> None:
    check_out(p)
    kind, make = _make(p, kinds)
    if kind == KERNEL:
        graph_exec.set_kernel(executable, node, make)
    else:
        graph_exec.set_node(executable, node, kind, make)


@api
def cuGraphAddNode_v2(out, graph, deps, edge_data, count, p):
    add_node(out, graph, deps, count, p, DRIVER, edge_data)


@api
def cuGraphAddNode(out, graph, deps, count, p):
    add_node(out, graph, deps, count, p, DRIVER)


@api
def cuGraphNodeSetParams(node, p):
    set_node(node, p, DRIVER)


@api
def cuGraphExecNodeSetParams(executable, node, p):
    set_exec_node(executable, node, p, DRIVER)
