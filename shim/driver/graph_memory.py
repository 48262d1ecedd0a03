"""Memory nodes of graphs: cuGraphAddMemAllocNode/cuGraphAddMemFreeNode, and cuMemAllocAsync
/cuMemFreeAsync on a capturing stream.

CUDA gives an alloc node's memory a fixed address when the node is made and backs it while
the graph runs between the alloc node and its free node. vgpu allocates it when the node is
made and keeps it until it is freed: by the program (cuMemFree, cuMemFreeAsync, as CUDA's
programs free what a graph allocated and did not free), or, when a free node of a graph
names it, once no graph or executable graph holding the alloc node is left. A program that
follows CUDA's rules sees the same results; it only holds the memory longer.
"""

from __future__ import annotations

from . import graph_capture
from ._state import CudaError, E, api, check_out, ffi, state
from .graph_model import MEM_ALLOC, MEM_FREE, GraphAllocation, dependencies, graphs

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
# CUgraphMem_attribute: what graphs use now and at most (vgpu reserves nothing beyond it)
USED_CURRENT, USED_HIGH, RESERVED_CURRENT, RESERVED_HIGH = range(4)


class GraphMemoryUse:
    """The device memory of graphs' alloc nodes that is still allocated, and its peak."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}  # address -> size
        self.high = 0

    def add(self, address: int, size: int) -> None:
        self.live[address] = size
        self.high = max(self.high, self.current())

    def current(self) -> int:
        # What the program or the last graph holding it freed is no longer graph memory.
        for address in [a for a in self.live if a not in state.allocations]:
            del self.live[address]
        return sum(self.live.values())


use = GraphMemoryUse()


def _allocation_node(graph, deps: list, size: int):
    from .memory import allocate  # memory asks graph_capture (and so this) of streams

    if size <= 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "an alloc node needs a size")
    allocation = GraphAllocation(allocate(size), size)
    use.add(allocation.address, size)
    node = graphs.add_node(graph, MEM_ALLOC, [], deps, {"bytesize": size})
    node.allocation = allocation
    return node


def _free_node(graph, deps: list, address: int):
    allocation = next((n.allocation for n in graphs.nodes.values()
                       if n.allocation is not None and n.allocation.address == address), None)
    if allocation is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not memory a graph's alloc node allocated")
    allocation.freed_by_graph = True
    return graphs.add_node(graph, MEM_FREE, [], deps, {"dptr": address})


def check_pool_props(props) -> None:
    if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED or \
            props.location.type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "graph memory is pinned device memory")
    if props.location.id != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_DEVICE, f"no device {props.location.id}")


def add_alloc(out, graph, deps, count: int, size: int):
    check_out(out)
    target = graphs.graph(graph)
    node = _allocation_node(target, dependencies(target, deps, count), size)
    out[0] = ffi.cast("void *", node.handle)
    return node.allocation.address


def add_free(out, graph, deps, count: int, address: int) -> None:
    check_out(out)
    target = graphs.graph(graph)
    node = _free_node(target, dependencies(target, deps, count), address)
    out[0] = ffi.cast("void *", node.handle)


@api
def cuGraphAddMemAllocNode(out, graph, deps, count, params):
    check_out(params)
    check_pool_props(params.poolProps)
    params.dptr = add_alloc(out, graph, deps, count, params.bytesize)


@api
def cuGraphAddMemFreeNode(out, graph, deps, count, dptr):
    add_free(out, graph, deps, count, dptr)


def allocation_of(node) -> GraphAllocation:
    target = graphs.node(node)
    if target.kind != MEM_ALLOC:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "not a memory alloc node")
    return target.allocation


@api
def cuGraphMemAllocNodeGetParams(node, params):
    check_out(params)
    allocation = allocation_of(node)
    ffi.memmove(params, bytes(ffi.sizeof(params[0])), ffi.sizeof(params[0]))
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    params.bytesize, params.dptr = allocation.size, allocation.address


def free_address_of(node) -> int:
    target = graphs.node(node)
    if target.kind != MEM_FREE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "not a memory free node")
    return target.params["dptr"]


@api
def cuGraphMemFreeNodeGetParams(node, dptr_out):
    check_out(dptr_out)
    dptr_out[0] = free_address_of(node)


def capture_alloc(stream: int, size: int) -> int:
    """cuMemAllocAsync on a capturing stream: an alloc node after the stream's frontier."""
    capture = graph_capture.captures[stream]
    node = _allocation_node(capture.graph, capture.frontier[stream], size)
    capture.frontier[stream] = [node]
    return node.allocation.address


def capture_free(stream: int, address: int) -> None:
    capture = graph_capture.captures[stream]
    node = _free_node(capture.graph, capture.frontier[stream], address)
    capture.frontier[stream] = [node]


def get_attribute(device: int, attr: int) -> int:
    state.device_description(device)
    if attr in (USED_CURRENT, RESERVED_CURRENT):
        return use.current()
    if attr in (USED_HIGH, RESERVED_HIGH):
        return use.high
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown graph memory attribute {attr}")


def set_attribute(device: int, attr: int, value: int) -> None:
    """Only the peaks can be set, and only to 0: they restart from what is in use now."""
    state.device_description(device)
    if attr not in (USED_HIGH, RESERVED_HIGH) or value != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "only a high watermark can be reset to 0")
    use.high = use.current()


@api
def cuDeviceGetGraphMemAttribute(device, attr, value):
    check_out(value)
    ffi.cast("cuuint64_t *", value)[0] = get_attribute(device, attr)


@api
def cuDeviceSetGraphMemAttribute(device, attr, value):
    check_out(value)
    set_attribute(device, attr, ffi.cast("cuuint64_t *", value)[0])


@api
def cuDeviceGraphMemTrim(device):
    # Graph memory is freed when the program frees it: nothing is kept to give back.
    state.device_description(device)
