"""CUDA graphs and stream capture (runtime API): the driver layer's graphs, with the runtime's
parameter structs translated (a kernel node names its kernel by host stub, copies by
pointers and cudaMemcpyKind, memsets by cudaMemsetParams)."""

from __future__ import annotations

from ..driver import (
    graph_capture,
    graph_conditional,
    graph_dot,
    graph_exec,
    graph_generic,
    graph_kernel_attributes,
    graph_memory,
    graph_nodes,
)
from ..driver import graphs as driver_graphs
from ..driver.graph_model import (
    CHILD_GRAPH,
    EMPTY,
    EVENT_RECORD,
    HOST,
    KERNEL,
    MEMCPY,
    MEMSET,
    WAIT_EVENT,
    graphs,
)
from ..driver.launch import InvalidConfiguration, _check_config
from ..driver.memory import CU_MEMORYTYPE_ARRAY, _is_device, copy_side
from ._state import CudaError, E, api, check_out, current_context, ffi, ptr, set_pointer
from .launch import function_layout
from .memory import DEFAULT as MEMCPY_DEFAULT
from .registration import registry

__all__ = [
    "cudaGraphCreate", "cudaGraphDestroy", "cudaGraphAddKernelNode",
    "cudaGraphKernelNodeGetParams", "cudaGraphKernelNodeSetParams", "cudaGraphAddMemcpyNode",
    "cudaGraphAddMemcpyNode1D", "cudaGraphAddMemsetNode", "cudaGraphMemsetNodeGetParams",
    "cudaGraphAddHostNode", "cudaGraphHostNodeGetParams", "cudaGraphAddEmptyNode",
    "cudaGraphAddChildGraphNode", "cudaGraphChildGraphNodeGetGraph",
    "cudaGraphAddEventRecordNode", "cudaGraphAddEventWaitNode", "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags", "cudaGraphLaunch", "cudaGraphUpload",
    "cudaGraphExecDestroy", "cudaGraphExecKernelNodeSetParams", "cudaGraphExecUpdate",
    "cudaGraphGetNodes", "cudaGraphGetRootNodes", "cudaGraphGetEdges", "cudaGraphNodeGetType",
    "cudaGraphNodeGetDependencies", "cudaGraphNodeGetDependentNodes",
    "cudaGraphAddDependencies", "cudaGraphRemoveDependencies", "cudaGraphDestroyNode",
    "cudaGraphClone", "cudaGraphNodeFindInClone", "cudaStreamBeginCapture",
    "cudaStreamBeginCaptureToGraph", "cudaStreamEndCapture", "cudaStreamIsCapturing",
    "cudaStreamGetCaptureInfo", "cudaStreamUpdateCaptureDependencies",
    "cudaThreadExchangeStreamCaptureMode", "cudaGraphAddMemAllocNode",
    "cudaGraphAddMemFreeNode", "cudaGraphMemAllocNodeGetParams",
    "cudaGraphMemFreeNodeGetParams", "cudaGraphMemcpyNodeSetParams",
    "cudaGraphMemcpyNodeSetParams1D", "cudaGraphMemsetNodeSetParams",
    "cudaGraphExecMemcpyNodeSetParams", "cudaGraphExecMemcpyNodeSetParams1D",
    "cudaGraphExecMemsetNodeSetParams", "cudaGraphHostNodeSetParams",
    "cudaGraphExecHostNodeSetParams", "cudaGraphEventRecordNodeSetEvent",
    "cudaGraphEventWaitNodeSetEvent", "cudaGraphExecEventRecordNodeSetEvent",
    "cudaGraphExecEventWaitNodeSetEvent", "cudaGraphNodeSetEnabled", "cudaGraphNodeGetEnabled",
    "cudaGraphAddNode", "cudaGraphNodeSetParams", "cudaGraphExecNodeSetParams",
    "cudaDeviceGetGraphMemAttribute", "cudaDeviceSetGraphMemAttribute", "cudaDeviceGraphMemTrim",
    "cudaGraphConditionalHandleCreate", "cudaGraphInstantiateWithParams",
    "cudaGraphExecGetFlags", "cudaGraphEventRecordNodeGetEvent", "cudaGraphEventWaitNodeGetEvent",
    "cudaGraphMemcpyNodeGetParams", "cudaGraphExecChildGraphNodeSetParams",
    "cudaGraphKernelNodeSetAttribute", "cudaGraphKernelNodeGetAttribute",
    "cudaGraphKernelNodeCopyAttributes", "cudaGraphDebugDotPrint",
]

_driver = {name: getattr(driver_graphs, name).__wrapped__ for name in dir(driver_graphs)
           if name.startswith("cuGraph")}


@api
def cudaGraphCreate(graph_out, flags):
    if flags:
        raise CudaError(E.cudaErrorInvalidValue, "flags must be 0")
    set_pointer(graph_out, graphs.new_graph().handle)


@api
def cudaGraphDestroy(graph):
    _driver["cuGraphDestroy"](graph)


# ----------------------------------------------------------------- kernel nodes

def _kernel(p):
    """make() of a kernel node from cudaKernelNodeParams."""
    if p == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "pNodeParams is NULL")
    function, layout = function_layout(p.func)
    grid = (p.gridDim.x, p.gridDim.y, p.gridDim.z)
    block = (p.blockDim.x, p.blockDim.y, p.blockDim.z)
    func = ptr(p.func)
    try:
        _check_config(layout, grid, block, p.sharedMemBytes)
    except InvalidConfiguration as exc:  # the driver API's invalid value
        raise CudaError(E.cudaErrorInvalidConfiguration, exc.message) from None

    def make():
        steps, params = graph_nodes.kernel_steps(function, layout, grid, block,
                                                 p.sharedMemBytes, p.kernelParams, p.extra)
        params["host_function"] = func
        return steps, params

    return make


@api
def cudaGraphAddKernelNode(out, graph, deps, count, p):
    driver_graphs.add(out, graph, deps, count, KERNEL, _kernel(p))


@api
def cudaGraphKernelNodeGetParams(node, p):
    check_out(p)
    target = driver_graphs._of_kind(node, KERNEL)
    params = target.params
    p.func = ffi.cast("void *", params.get("host_function") or _host_stub(params["function"]))
    p.gridDim.x, p.gridDim.y, p.gridDim.z = params["grid"]
    p.blockDim.x, p.blockDim.y, p.blockDim.z = params["block"]
    p.sharedMemBytes = params["shared"]
    p.kernelParams = ffi.cast("void **", graph_nodes.kernel_param_pointers(params))
    p.extra = ffi.NULL


def _host_stub(function: int) -> int:
    """The host stub of the registered kernel last launched as driver function `function`
    (a captured launch's node knows only the function), else the function itself."""
    for kernel in registry.kernels.values():
        if kernel.last_use[1] == function:
            return kernel.host_function
    return function


@api
def cudaGraphKernelNodeSetAttribute(node, attr, value):
    graph_kernel_attributes.set_attribute(node, attr, value)


@api
def cudaGraphKernelNodeGetAttribute(node, attr, value_out):
    graph_kernel_attributes.get_attribute(node, attr, value_out)


@api
def cudaGraphKernelNodeCopyAttributes(dst, src):
    graph_kernel_attributes.copy_attributes(dst, src)


@api
def cudaGraphDebugDotPrint(graph, path, flags):
    graph_dot.cuGraphDebugDotPrint.__wrapped__(graph, path, flags)


@api
def cudaGraphKernelNodeSetParams(node, p):
    driver_graphs.set_params(node, KERNEL, _kernel(p))


@api
def cudaGraphExecKernelNodeSetParams(executable, node, p):
    graph_exec.set_kernel(executable, node, _kernel(p))


# ----------------------------------------------------------------- copies and memsets

def _side(array, pos, pitched, extent) -> tuple:
    """One side of cudaMemcpy3DParms as graph_nodes.memcpy_steps wants it."""
    if array != ffi.NULL:
        device, address, pitch = copy_side(CU_MEMORYTYPE_ARRAY, ffi.NULL, 0, array, pos.x,
                                           pos.y, 0, extent.width, extent.height)
        return device, address, pitch, 0
    base = ptr(pitched.ptr)
    pitch = pitched.pitch or extent.width
    slice_bytes = pitch * (pitched.ysize or extent.height)
    address = base + pos.z * slice_bytes + pos.y * pitch + pos.x
    return _is_device(base), address, pitch, slice_bytes


def _memcpy3d(p):
    if p == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "pCopyParams is NULL")
    extent = p.extent
    steps = graph_nodes.memcpy_steps(_side(p.dstArray, p.dstPos, p.dstPtr, extent),
                                     _side(p.srcArray, p.srcPos, p.srcPtr, extent),
                                     extent.width, extent.height, extent.depth)
    return steps, {"copy3d": ffi.new("struct cudaMemcpy3DParms *", p[0])}


@api
def cudaGraphAddMemcpyNode(out, graph, deps, count, p):
    driver_graphs.add(out, graph, deps, count, MEMCPY, lambda: _memcpy3d(p))


@api
def cudaGraphAddMemcpyNode1D(out, graph, deps, count, dst, src, size, kind):
    driver_graphs.add(out, graph, deps, count, MEMCPY, _memcpy_1d(dst, src, size))


def _memset(p):
    if p == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "pMemsetParams is NULL")
    return graph_nodes.memset_steps(ptr(p.dst), p.pitch, p.value, p.elementSize, p.width,
                                    p.height)


@api
def cudaGraphAddMemsetNode(out, graph, deps, count, p):
    driver_graphs.add(out, graph, deps, count, MEMSET, lambda: _memset(p))


def _memcpy_1d(dst, src, size):
    """make() of a 1D memcpy node."""
    return lambda: (graph_nodes.memcpy_1d_steps(ptr(dst), ptr(src), size),
                    {"dst": ptr(dst), "src": ptr(src), "size": size})


@api
def cudaGraphMemcpyNodeSetParams(node, p):
    driver_graphs.set_params(node, MEMCPY, lambda: _memcpy3d(p))


@api
def cudaGraphMemcpyNodeSetParams1D(node, dst, src, size, kind):
    driver_graphs.set_params(node, MEMCPY, _memcpy_1d(dst, src, size))


@api
def cudaGraphMemsetNodeSetParams(node, p):
    driver_graphs.set_params(node, MEMSET, lambda: _memset(p))


@api
def cudaGraphExecMemcpyNodeSetParams(executable, node, p):
    graph_exec.set_node(executable, node, MEMCPY, lambda: _memcpy3d(p))


@api
def cudaGraphExecMemcpyNodeSetParams1D(executable, node, dst, src, size, kind):
    graph_exec.set_node(executable, node, MEMCPY, _memcpy_1d(dst, src, size))


@api
def cudaGraphExecMemsetNodeSetParams(executable, node, p):
    graph_exec.set_node(executable, node, MEMSET, lambda: _memset(p))


@api
def cudaGraphMemcpyNodeGetParams(node, p):
    """The node's parameters as given; a 1D copy's as the 3D copy of one row it is."""
    check_out(p)
    params = driver_graphs._of_kind(node, MEMCPY).params
    if "copy3d" in params:
        p[0] = params["copy3d"][0]
        return
    ffi.memmove(p, bytes(ffi.sizeof(p[0])), ffi.sizeof(p[0]))
    if "size" not in params:  # a driver API node: its parameters are a CUDA_MEMCPY3D
        raise CudaError(E.cudaErrorInvalidValue,
                        "the node was made by the driver API: ask cuGraphMemcpyNodeGetParams")
    size = params["size"]
    for side, address in ((p.srcPtr, params["src"]), (p.dstPtr, params["dst"])):
        side.ptr = ffi.cast("void *", address)
        side.pitch, side.xsize, side.ysize = size, size, 1
    p.extent.width, p.extent.height, p.extent.depth = size, 1, 1
    p.kind = MEMCPY_DEFAULT  # unified addressing tells the sides apart


@api
def cudaGraphMemsetNodeGetParams(node, p):
    check_out(p)
    params = driver_graphs._of_kind(node, MEMSET).params
    p.dst = ffi.cast("void *", params["dst"])
    p.pitch, p.value = params["pitch"], params["value"]
    p.elementSize, p.width, p.height = params["element_size"], params["width"], params["height"]


# ----------------------------------------------------------------- memory nodes

@api
def cudaGraphAddMemAllocNode(out, graph, deps, count, params):
    check_out(params)
    graph_memory.check_pool_props(params.poolProps)
    address = graph_memory.add_alloc(out, graph, deps, count, params.bytesize)
    params.dptr = ffi.cast("void *", address)


@api
def cudaGraphAddMemFreeNode(out, graph, deps, count, dptr):
    graph_memory.add_free(out, graph, deps, count, ptr(dptr))


@api
def cudaGraphMemAllocNodeGetParams(node, params):
    check_out(params)
    allocation = graph_memory.allocation_of(node)
    ffi.memmove(params, bytes(ffi.sizeof(params[0])), ffi.sizeof(params[0]))
    params.poolProps.allocType = graph_memory.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = graph_memory.CU_MEM_LOCATION_TYPE_DEVICE
    params.bytesize = allocation.size
    params.dptr = ffi.cast("void *", allocation.address)


@api
def cudaGraphMemFreeNodeGetParams(node, dptr_out):
    set_pointer(ffi.cast("void **", dptr_out), graph_memory.free_address_of(node))


@api
def cudaDeviceGetGraphMemAttribute(device, attr, value):
    check_out(value)
    ffi.cast("unsigned long long *", value)[0] = graph_memory.get_attribute(device, attr)


@api
def cudaDeviceSetGraphMemAttribute(device, attr, value):
    check_out(value)
    graph_memory.set_attribute(device, attr, ffi.cast("unsigned long long *", value)[0])


@api
def cudaDeviceGraphMemTrim(device):
    graph_memory.cuDeviceGraphMemTrim.__wrapped__(device)


# ----------------------------------------------------------------- other nodes

@api
def cudaGraphAddHostNode(out, graph, deps, count, p):
    driver_graphs.add(out, graph, deps, count, HOST, _host(p))


def _host(p):
    if p == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "pNodeParams is NULL")
    return lambda: graph_nodes.host_steps(p.fn, p.userData)


@api
def cudaGraphHostNodeSetParams(node, p):
    driver_graphs.set_params(node, HOST, _host(p))


@api
def cudaGraphExecHostNodeSetParams(executable, node, p):
    graph_exec.set_node(executable, node, HOST, _host(p))


@api
def cudaGraphEventRecordNodeGetEvent(node, event_out):
    driver_graphs.cuGraphEventRecordNodeGetEvent.__wrapped__(node, event_out)


@api
def cudaGraphEventWaitNodeGetEvent(node, event_out):
    driver_graphs.cuGraphEventWaitNodeGetEvent.__wrapped__(node, event_out)


@api
def cudaGraphExecChildGraphNodeSetParams(executable, node, child):
    graph_exec.set_child(executable, node, child)


@api
def cudaGraphEventRecordNodeSetEvent(node, event):
    driver_graphs.cuGraphEventRecordNodeSetEvent.__wrapped__(node, event)


@api
def cudaGraphEventWaitNodeSetEvent(node, event):
    driver_graphs.cuGraphEventWaitNodeSetEvent.__wrapped__(node, event)


@api
def cudaGraphExecEventRecordNodeSetEvent(executable, node, event):
    graph_exec.cuGraphExecEventRecordNodeSetEvent.__wrapped__(executable, node, event)


@api
def cudaGraphExecEventWaitNodeSetEvent(executable, node, event):
    graph_exec.cuGraphExecEventWaitNodeSetEvent.__wrapped__(executable, node, event)


@api
def cudaGraphNodeSetEnabled(executable, node, enabled):
    graph_exec.set_enabled(executable, node, bool(enabled))


@api
def cudaGraphNodeGetEnabled(executable, node, enabled_out):
    check_out(enabled_out)
    enabled_out[0] = int(graph_exec.is_enabled(executable, node))


@api
def cudaGraphHostNodeGetParams(node, p):
    check_out(p)
    params = driver_graphs._of_kind(node, HOST).params
    p.fn, p.userData = ffi.cast("void *", params["fn"]), params["data"]


@api
def cudaGraphAddEmptyNode(out, graph, deps, count):
    driver_graphs.add(out, graph, deps, count, EMPTY, lambda: ([], {}))


@api
def cudaGraphAddChildGraphNode(out, graph, deps, count, child):
    driver_graphs.add_child(out, graph, deps, count, child)


@api
def cudaGraphChildGraphNodeGetGraph(node, graph_out):
    set_pointer(graph_out, driver_graphs._of_kind(node, CHILD_GRAPH).child.handle)


@api
def cudaGraphAddEventRecordNode(out, graph, deps, count, event):
    driver_graphs.add(out, graph, deps, count, EVENT_RECORD,
                      lambda: graph_nodes.event_steps(event, "cuEventRecord"))


@api
def cudaGraphAddEventWaitNode(out, graph, deps, count, event):
    driver_graphs.add(out, graph, deps, count, WAIT_EVENT,
                      lambda: graph_nodes.event_steps(event, "cuStreamWaitEvent"))


@api
def cudaGraphConditionalHandleCreate(handle_out, graph, default, flags):
    check_out(handle_out)
    handle_out[0] = graph_conditional.create_handle(graph, current_context(), default, flags)


# ----------------------------------------------------------------- executable graphs

@api
def cudaGraphInstantiate(exec_out, graph, flags):
    set_pointer(exec_out, graph_exec.instantiate(graph, flags).handle)


@api
def cudaGraphInstantiateWithFlags(exec_out, graph, flags):
    set_pointer(exec_out, graph_exec.instantiate(graph, flags).handle)


@api
def cudaGraphInstantiateWithParams(exec_out, graph, params):
    check_out(params)

    def report(result: int, node) -> None:
        params.result_out, params.errNode_out = result, node

    set_pointer(exec_out, graph_exec.instantiate_reporting(graph, params.flags,
                                                           params.uploadStream, report).handle)


@api
def cudaGraphExecGetFlags(executable, flags_out):
    graph_exec.cuGraphExecGetFlags.__wrapped__(executable, flags_out)


@api
def cudaGraphLaunch(executable, stream):
    graph_exec.launch(executable, stream)


@api
def cudaGraphUpload(executable, stream):
    graph_exec.cuGraphUpload.__wrapped__(executable, stream)


@api
def cudaGraphExecDestroy(executable):
    graph_exec.cuGraphExecDestroy.__wrapped__(executable)


@api
def cudaGraphExecUpdate(executable, graph, info):
    check_out(info)
    result, node = graph_exec.update(executable, graph)
    info.result = result
    info.errorNode = ffi.cast("void *", node.handle) if node else ffi.NULL
    info.errorFromNode = ffi.NULL
    graph_exec.report_update(result, node)


# ----------------------------------------------------------------- structure

@api
def cudaGraphGetNodes(graph, nodes, count):
    _driver["cuGraphGetNodes"](graph, nodes, count)


@api
def cudaGraphGetRootNodes(graph, nodes, count):
    _driver["cuGraphGetRootNodes"](graph, nodes, count)


@api
def cudaGraphGetEdges(graph, from_out, to_out, edge_data, count):
    _driver["cuGraphGetEdges_v2"](graph, from_out, to_out, edge_data, count)


@api
def cudaGraphNodeGetType(node, type_out):
    _driver["cuGraphNodeGetType"](node, type_out)


@api
def cudaGraphNodeGetDependencies(node, out, edge_data, count):
    _driver["cuGraphNodeGetDependencies_v2"](node, out, edge_data, count)


@api
def cudaGraphNodeGetDependentNodes(node, out, edge_data, count):
    _driver["cuGraphNodeGetDependentNodes_v2"](node, out, edge_data, count)


@api
def cudaGraphAddDependencies(graph, from_nodes, to_nodes, edge_data, count):
    driver_graphs.add_dependencies(graph, from_nodes, to_nodes, count, edge_data)


@api
def cudaGraphRemoveDependencies(graph, from_nodes, to_nodes, edge_data, count):
    driver_graphs.remove_dependencies(graph, from_nodes, to_nodes, count, edge_data)


@api
def cudaGraphDestroyNode(node):
    _driver["cuGraphDestroyNode"](node)


@api
def cudaGraphClone(graph_out, graph):
    _driver["cuGraphClone"](graph_out, graph)


@api
def cudaGraphNodeFindInClone(node_out, original, cloned):
    _driver["cuGraphNodeFindInClone"](node_out, original, cloned)


# ----------------------------------------------------------------- stream capture

@api
def cudaStreamBeginCapture(stream, mode):
    graph_capture.cuStreamBeginCapture_v2.__wrapped__(stream, mode)


@api
def cudaStreamBeginCaptureToGraph(stream, graph, deps, edge_data, count, mode):
    graph_capture.cuStreamBeginCaptureToGraph.__wrapped__(stream, graph, deps, edge_data,
                                                          count, mode)


@api
def cudaStreamEndCapture(stream, graph_out):
    check_out(graph_out)
    graph_out[0] = ffi.NULL
    set_pointer(graph_out, graph_capture.end_capture(stream).handle)


@api
def cudaStreamIsCapturing(stream, status):
    graph_capture.cuStreamIsCapturing.__wrapped__(stream, status)


@api
def cudaStreamGetCaptureInfo(stream, status_out, id_out, graph_out, deps_out, edges_out,
                             count_out):
    graph_capture.cuStreamGetCaptureInfo_v3.__wrapped__(stream, status_out, id_out, graph_out,
                                                        deps_out, edges_out, count_out)


@api
def cudaStreamUpdateCaptureDependencies(stream, deps, edge_data, count, flags):
    graph_capture.update_dependencies(stream, deps, count, flags, edge_data)


@api
def cudaThreadExchangeStreamCaptureMode(mode):
    graph_capture.cuThreadExchangeStreamCaptureMode.__wrapped__(mode)


# ----------------------------------------------------------------- generic node calls

RUNTIME = graph_generic.Kinds(
    kernel=lambda p: _kernel(ffi.addressof(p, "kernel")),
    memcpy=lambda p: lambda: _memcpy3d(ffi.addressof(p.memcpy, "copyParams")),
    memset=lambda p: lambda: _memset(ffi.addressof(p, "memset")),
    host=lambda p: _host(ffi.addressof(p, "host")))


@api
def cudaGraphAddNode(out, graph, deps, edge_data, count, p):
    graph_generic.add_node(out, graph, deps, count, p, RUNTIME, edge_data)


@api
def cudaGraphNodeSetParams(node, p):
    graph_generic.set_node(node, p, RUNTIME)


@api
def cudaGraphExecNodeSetParams(executable, node, p):
    graph_generic.set_exec_node(executable, node, p, RUNTIME)
