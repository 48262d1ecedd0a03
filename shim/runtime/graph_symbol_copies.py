"""Memcpy nodes to and from a module's device variables (runtime API): the variable's device
address and the offset into it make a 1D copy node, checked as cudaMemcpyToSymbol and
cudaMemcpyFromSymbol check their copies."""

from __future__ import annotations

from ..driver import graph_exec, graph_nodes
from ..driver import graphs as driver_graphs
from ..driver.graph_model import MEMCPY
from ._state import CudaError, E, api, ptr
from .memory import DEFAULT, DEVICE_TO_DEVICE, DEVICE_TO_HOST, HOST_TO_DEVICE, _symbol_range

__all__ = ["cudaGraphAddMemcpyNodeToSymbol", "cudaGraphAddMemcpyNodeFromSymbol",
           "cudaGraphMemcpyNodeSetParamsToSymbol", "cudaGraphMemcpyNodeSetParamsFromSymbol",
           "cudaGraphExecMemcpyNodeSetParamsToSymbol",
           "cudaGraphExecMemcpyNodeSetParamsFromSymbol"]


def _copy(dst: int, src: int, size: int):
    """make() of a 1D memcpy node between two addresses."""
    return lambda: (graph_nodes.memcpy_1d_steps(dst, src, size),
                    {"dst": dst, "src": src, "size": size})


def _to_symbol(symbol, src, count: int, offset: int, kind: int):
    if kind not in (HOST_TO_DEVICE, DEVICE_TO_DEVICE, DEFAULT):
        raise CudaError(E.cudaErrorInvalidMemcpyDirection, "a copy to a symbol goes to the device")
    return _copy(_symbol_range(symbol, count, offset), ptr(src), count)


def _from_symbol(dst, symbol, count: int, offset: int, kind: int):
    if kind not in (DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT):
        raise CudaError(E.cudaErrorInvalidMemcpyDirection,
                        "a copy from a symbol comes from the device")
    return _copy(ptr(dst), _symbol_range(symbol, count, offset), count)


@api
def cudaGraphAddMemcpyNodeToSymbol(out, graph, deps, num_deps, symbol, src, count, offset,
                                   kind):
    driver_graphs.add(out, graph, deps, num_deps, MEMCPY,
                      _to_symbol(symbol, src, count, offset, kind))


@api
def cudaGraphAddMemcpyNodeFromSymbol(out, graph, deps, num_deps, dst, symbol, count, offset,
                                     kind):
    driver_graphs.add(out, graph, deps, num_deps, MEMCPY,
                      _from_symbol(dst, symbol, count, offset, kind))


@api
def cudaGraphMemcpyNodeSetParamsToSymbol(node, symbol, src, count, offset, kind):
    driver_graphs.set_params(node, MEMCPY, _to_symbol(symbol, src, count, offset, kind))


@api
def cudaGraphMemcpyNodeSetParamsFromSymbol(node, dst, symbol, count, offset, kind):
    driver_graphs.set_params(node, MEMCPY, _from_symbol(dst, symbol, count, offset, kind))


@api
def cudaGraphExecMemcpyNodeSetParamsToSymbol(executable, node, symbol, src, count, offset,
                                             kind):
    graph_exec.set_node(executable, node, MEMCPY, _to_symbol(symbol, src, count, offset, kind))


@api
def cudaGraphExecMemcpyNodeSetParamsFromSymbol(executable, node, dst, symbol, count, offset,
                                               kind):
    graph_exec.set_node(executable, node, MEMCPY,
                        _from_symbol(dst, symbol, count, offset, kind))
