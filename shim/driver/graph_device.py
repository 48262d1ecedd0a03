"""What a graph instantiated for device launch may hold, and how instantiation says why a
graph failed.

CUDA's device graphs hold kernel nodes (cooperative ones too), memcpy nodes of device
memory or pinned device-mapped host memory, memset nodes and child graphs of them. vgpu's
hold the same (and empty nodes), each node a call the server can run for a kernel that
launches the graph: a kernel launch (cooperative or not), a copy between device addresses
(which mapped host memory has too) or between one and a pinned host segment the device
maps (the server names its side by its device address), a memset. Copies of pageable
memory, and of pinned memory the device cannot reach (a server on another host), are
refused. The server refuses kernels that launch kernels (dynamic parallelism, which device
graphs may not use). Instantiating a graph that breaks these fails with
CUDA_ERROR_INVALID_VALUE; the result CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED
and the node at fault (the top-level node holding it) go where the caller asked for them.
"""

from __future__ import annotations

from ._state import CudaError, E, state
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
    Graph,
    Node,
)

# CUgraphInstantiateResult (cudaGraphInstantiateResult has the same numbers)
CUDA_GRAPH_INSTANTIATE_SUCCESS = 0
CUDA_GRAPH_INSTANTIATE_ERROR = 1
CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2
CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3

# What the server runs from a kernel's cudaGraphLaunch (server/graphs.py DEVICE_GRAPH_CALLS)
DEVICE_GRAPH_CALLS = ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuMemcpyDtoD",
                      "vgpuMemset")
# Copies of pinned host memory -> the index of their host side, ["seg", segment, offset]
PINNED_COPIES = {"cuMemcpyHtoD": 1, "cuMemcpyDtoH": 2}
_ALLOWED_KINDS = (KERNEL, MEMCPY, MEMSET, CHILD_GRAPH, EMPTY)
_KIND_NAMES = {HOST: "a host node", WAIT_EVENT: "an event wait node",
               EVENT_RECORD: "an event record node", MEM_ALLOC: "a memory allocation node",
               MEM_FREE: "a memory free node", CONDITIONAL: "a conditional node"}


class InstantiateError(CudaError):
    """A graph that cannot be instantiated: CUDA_ERROR_INVALID_VALUE, with what
    CUgraphInstantiateResult says of it and the node at fault, if one is."""

    def __init__(self, message: str, result: int, node: Node | None = None):
        super().__init__(E.CUDA_ERROR_INVALID_VALUE, message)
        self.result = result
        self.node = node


def check(graph: Graph) -> None:
    """Refuse `graph` for device launch at its first node that a device graph cannot hold."""
    for node in graph.nodes:
        reason = _refused(node)
        if reason is not None:
            raise InstantiateError(f"a graph instantiated for device launch cannot hold "
                                   f"{reason}", CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED,
                                   node)


def _refused(node: Node) -> str | None:
    if node.kind not in _ALLOWED_KINDS:
        return _KIND_NAMES.get(node.kind, f"a node of type {node.kind}")
    for step in node.steps:
        if step[0] == "wire" and (step[1] in DEVICE_GRAPH_CALLS or _device_mapped(step)):
            continue
        return ("a copy of host memory the device does not map" if node.kind == MEMCPY
                else "what this node does")
    if node.child is not None:
        return next((reason for reason in map(_refused, node.child.nodes) if reason), None)
    return None


def _device_mapped(step: tuple) -> bool:
    """Whether a wire step copies pinned host memory the device maps (the server's segment
    of a page-locked allocation with a device pointer)."""
    side = PINNED_COPIES.get(step[1])
    if side is None:
        return False
    _, segment, offset = step[2][side]
    return any(alloc.segment == segment and alloc.device_pointer is not None
               and alloc.segment_offset <= offset < alloc.segment_offset + alloc.size
               for alloc in state.host_allocations.values())


def server_refusal(error: CudaError) -> CudaError:
    """The server's refusal of a device graph (a kernel that launches kernels) as an
    instantiation that failed on an unsupported operation."""
    if error.code != E.CUDA_ERROR_INVALID_VALUE:
        return error
    return InstantiateError(error.message, CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED)
