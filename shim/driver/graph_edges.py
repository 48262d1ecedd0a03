"""Edge data of graphs (CUgraphEdgeData, the _v2 dependency calls): what an edge waits for.

A zeroed edge is a full dependency. The others CUDA defines leave kernel nodes from their
programmatic port (the dependent may start once every block of the kernel triggered it,
`CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`) or their launch-order port (once every block of it
has begun). vgpu keeps each edge's data, checks it as CUDA does and hands it back in the
queries, and runs every edge as a full dependency: the dependent starts after the kernel
completed, which is one of the orders those edges allow (the device side's
griddepcontrol.wait then finds the primary done).
"""

from __future__ import annotations

from ._state import CudaError, E, ffi
from .graph_model import KERNEL, Node

EDGE_BYTES = 8  # from_port, to_port, type, 5 reserved bytes
DEFAULT = bytes(EDGE_BYTES)
PORT_DEFAULT, PORT_PROGRAMMATIC, PORT_LAUNCH_ORDER = 0, 1, 2
TYPE_DEFAULT, TYPE_PROGRAMMATIC = 0, 1


def read(array, count: int) -> list[bytes]:
    """The edge data of a C array of `count` CUgraphEdgeData (NULL: all default)."""
    if array == ffi.NULL or not count:
        return [DEFAULT] * count
    raw = ffi.buffer(ffi.cast("unsigned char *", array), EDGE_BYTES * count)[:]
    return [raw[i:i + EDGE_BYTES] for i in range(0, len(raw), EDGE_BYTES)]


def check(data: bytes, upstream: int, downstream: int) -> None:
    """CUDA_ERROR_INVALID_VALUE for edge data CUDA does not allow between nodes of these
    kinds."""
    if data == DEFAULT:
        return
    from_port, to_port, kind = data[0], data[1], data[2]
    if any(data[3:]) or to_port:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "edge data: to_port and the reserved bytes must be zero")
    if kind not in (TYPE_DEFAULT, TYPE_PROGRAMMATIC) or \
            from_port not in (PORT_DEFAULT, PORT_PROGRAMMATIC, PORT_LAUNCH_ORDER):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"edge data: unknown type {kind} or port "
                                                    f"{from_port}")
    if upstream != KERNEL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "edge data: only a kernel node's edges leave from another port")
    if kind == TYPE_PROGRAMMATIC and downstream != KERNEL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "edge data: a programmatic edge joins two kernel nodes")
    if from_port == PORT_PROGRAMMATIC and kind != TYPE_PROGRAMMATIC:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "edge data: the programmatic port needs a programmatic edge")


def of(upstream: Node, downstream: Node) -> bytes:
    return downstream.edge_data.get(upstream, DEFAULT)


def set_edge(upstream: Node, downstream: Node, data: bytes) -> None:
    if data == DEFAULT:
        downstream.edge_data.pop(upstream, None)
    else:
        downstream.edge_data[upstream] = data


def write(out, datas: list[bytes], room: int) -> None:
    """Hand edge data back into `out` (CUgraphEdgeData[room]), or, with `out` NULL, refuse
    a query that would lose some (CUDA_ERROR_LOSSY_QUERY)."""
    if out == ffi.NULL:
        if any(d != DEFAULT for d in datas[:room]):
            raise CudaError(E.CUDA_ERROR_LOSSY_QUERY,
                            "some edges carry data: ask with an edge data array")
        return
    raw = b"".join(datas[:room]).ljust(EDGE_BYTES * room, b"\0")
    ffi.memmove(ffi.cast("unsigned char *", out), raw, len(raw))
