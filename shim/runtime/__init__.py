"""The CUDA runtime API (libcudart.so.13), implemented in the client on top of vgpu's driver
layer (NVIDIA's cudart cannot run on a replacement libcuda: it needs undocumented export
tables).

Every public `cuda*` and `__cuda*` name here is an exported C symbol of our libcudart: the
dispatcher of its C stubs looks implementations up by symbol name, decodes the C arguments
(integers as ints, pointers as cffi cdata) and returns what the function returns (the int
cudaError_t for almost all of them). Symbols absent here answer cudaErrorNotSupported.

Implementations are grouped by concern, one module each: registration of the program's
device code, launches, device management, memory, streams and events, errors, occupancy.
Per-thread-default-stream variants (`_ptsz`, `_ptds`) share the implementation of their
base symbol: the server runs all work in arrival order, which satisfies both semantics.

To implement a runtime function: write it in the module of its concern under its exact
symbol name (vgpu.api.table.runtime_functions() lists the exports with their parameters),
decorate it with `api` (it uses the device) or `query_api` (it only describes), and add the
name to that module's `__all__`; tests go through a CUDA program in tests/runtime/programs/.
"""

from __future__ import annotations

from . import (
    channels,
    device,
    errors,
    graph_symbol_copies,
    graphs,
    hints,
    ipc,
    launch,
    libraries,
    managed,
    memory,
    occupancy,
    peers,
    registration,
    stream,
    textures,
    user_objects,
)

_MODULES = (registration, launch, device, errors, memory, managed, peers, stream, occupancy,
            channels, textures, graphs, graph_symbol_copies, user_objects, ipc, hints,
            libraries)


def _implemented() -> dict:
    names = {}
    for module in _MODULES:
        for name in module.__all__:
            if name.startswith(("cuda", "__cuda")):
                names[name] = getattr(module, name)
    return names


globals().update(_implemented())


def __getattr__(name: str):
    # The dispatcher looks symbols up by name; per-thread-stream variants resolve to their base.
    if name.startswith(("cuda", "__cuda")) and name.endswith(("_ptds", "_ptsz")):
        base = globals().get(name[:-5])
        if callable(base):
            return base
    raise AttributeError(name)
