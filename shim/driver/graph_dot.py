"""cuGraphDebugDotPrint: a graph written as Graphviz DOT, for people reading it. Each node is
labelled with its type (and a kernel node with its kernel, a memcpy or memset node with its
size); child graphs and conditional nodes' bodies are clusters inside their node's place;
edges that carry data say which port and type."""

from __future__ import annotations

from ._state import CudaError, E, api, ffi
from .graph_edges import DEFAULT
from .graph_model import Graph, Node, graphs

_TYPES = {0: "KERNEL", 1: "MEMCPY", 2: "MEMSET", 3: "HOST", 4: "GRAPH", 5: "EMPTY",
          6: "WAIT_EVENT", 7: "EVENT_RECORD", 10: "MEM_ALLOC", 11: "MEM_FREE",
          13: "CONDITIONAL"}
_CONDITIONAL_TYPES = {0: "IF", 1: "WHILE", 2: "SWITCH"}


def _label(node: Node) -> str:
    label = _TYPES.get(node.kind, str(node.kind))
    params = node.params
    if "layout" in params:
        label += f"\\n{params['layout'].name}\\n<<<{params['grid']}, {params['block']}>>>"
    if "size" in params:
        label += f"\\n{params['size']} bytes"
    if "type" in params:
        label += f"\\n{_CONDITIONAL_TYPES.get(params['type'], '')}"
    return label


def _lines(graph: Graph, depth: int) -> list[str]:
    pad = "  " * depth
    out = []
    for node in graph.nodes:
        out.append(f'{pad}"n{node.handle:x}" [label="{_label(node)}"];')
        for i, inner in enumerate(([node.child] if node.child else []) + node.bodies):
            out.append(f'{pad}subgraph "cluster_{node.handle:x}_{i}" {{')
            out.append(f'{pad}  label="{"graph" if node.child else f"body {i}"} of '
                       f'n{node.handle:x}";')
            out.extend(_lines(inner, depth + 1))
            out.append(f"{pad}}}")
        for dep in node.deps:
            data = node.edge_data.get(dep, DEFAULT)
            style = "" if data == DEFAULT else \
                f' [label="port {data[0]} type {data[2]}", style=dashed]'
            out.append(f'{pad}"n{dep.handle:x}" -> "n{node.handle:x}"{style};')
    return out


def dot(graph: Graph) -> str:
    return "\n".join([f'digraph "vgpu graph {graph.handle:x}" {{', *_lines(graph, 1), "}", ""])


@api
def cuGraphDebugDotPrint(graph, path, flags):
    target = graphs.graph(graph)
    if path == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "path is NULL")
    try:
        with open(ffi.string(path), "w") as out:
            out.write(dot(target))
    except OSError as exc:
        raise CudaError(E.CUDA_ERROR_OPERATING_SYSTEM, f"cannot write the graph: {exc}") from None
