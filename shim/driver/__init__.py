"""The CUDA driver API, implemented in the client on top of the vgpu protocol.

Every public `cu*` name here is an exported C symbol of our libcuda (`cuMemAlloc_v2`, not the
`cuMemAlloc` macro): the dispatcher of the generated C stubs looks implementations up by
symbol name, decodes the C arguments (integers as ints, pointers as cffi cdata) and returns
the int CUresult the function gives. Symbols absent here answer CUDA_ERROR_NOT_SUPPORTED.

Implementations are grouped by object kind, one module each. Per-thread-default-stream
variants (`_ptds`, `_ptsz`) share the implementation of their base symbol (their NULL stream is
the legacy one, which synchronizes with the other blocking streams: correct, if stricter).
"""

from __future__ import annotations

from . import (
    arrays,
    context,
    device,
    graph_capture,
    graph_conditional,
    graph_dot,
    graph_exec,
    graph_generic,
    graph_kernel_attributes,
    graph_memory,
    graph_user_objects,
    graphs,
    hints,
    ipc,
    launch,
    managed,
    memory,
    module,
    occupancy,
    peers,
    stream,
    textures,
    vmm,
)

_MODULES = (device, context, memory, managed, peers, arrays, textures, module, launch, stream,
            vmm, occupancy, graphs, graph_exec, graph_capture, graph_memory, graph_generic,
            graph_conditional, graph_kernel_attributes, graph_dot, graph_user_objects, ipc,
            hints)


def _implemented() -> dict:
    names = {}
    for mod in _MODULES:
        for name, value in vars(mod).items():
            if name.startswith("cu") and callable(value):
                names[name] = value
    return names


globals().update(_implemented())


def __getattr__(name: str):
    # The dispatcher looks symbols up by name; per-thread-stream variants resolve to their base.
    if name.startswith("cu") and name.endswith(("_ptds", "_ptsz")):
        base = globals().get(name[:-5])
        if callable(base):
            return base
    raise AttributeError(name)
