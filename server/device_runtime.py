"""The device memory a session's device runtime uses on a backend that runs it itself (emu):
the malloc heap, the parameter buffers of device-side launches, and the grid barrier of
cooperative launches.

Each is an ordinary allocation of the session, made when the first launch that needs it
comes (as CUDA sizes the heap when a kernel using malloc first runs), owned by the launching
function's context and journaled like any allocation, so checkpoints, restores and
migrations carry it with its contents: the heap keeps its bookkeeping inside itself
(emu/device_heap.py), so blocks malloc'd before a move can be freed after it. The program
never sees these addresses and cannot free them (cuMemFree of one is CUDA_ERROR_INVALID_VALUE,
as for any address it did not allocate). Their places are part of the session's own state
(`describe`/`restore`).

Limits (cuCtxSetLimit): CU_LIMIT_MALLOC_HEAP_SIZE and CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
fix the sizes, and, as CUDA says, may not change once a kernel using them has been launched
(CUDA_ERROR_INVALID_VALUE).
"""

from __future__ import annotations

from collections.abc import Callable

from vgpu.errors import CudaError

from .emu.device_runtime import PARAMETER_BUFFER_BYTES

__all__ = ["CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT", "CU_LIMIT_MALLOC_HEAP_SIZE",
           "DeviceRuntimeMemory"]

CU_LIMIT_MALLOC_HEAP_SIZE = 2
CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4
CUDA_ERROR_INVALID_VALUE = 1
DEFAULT_HEAP_BYTES = 8 << 20
DEFAULT_PENDING_LAUNCHES = 2048
GRID_WORKSPACE_BYTES = 16   # cooperative groups' grid barrier: a flag word and a counter

_LIMIT_NAMES = {CU_LIMIT_MALLOC_HEAP_SIZE: ("heap", "the malloc heap size"),
                CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
                    ("launch_buffers", "the pending launch count")}


class DeviceRuntimeMemory:
    def __init__(self) -> None:
        self.limits = {CU_LIMIT_MALLOC_HEAP_SIZE: DEFAULT_HEAP_BYTES,
                       CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: DEFAULT_PENDING_LAUNCHES}
        # "heap", "launch_buffers", "grid_workspace" -> [address, size, context]
        self.places: dict[str, list[int]] = {}

    def set_limit(self, limit: int, value: int) -> bool:
        """Apply a limit the device runtime obeys; False for other limits."""
        if limit not in _LIMIT_NAMES:
            return False
        place, what = _LIMIT_NAMES[limit]
        if value < 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"negative {what}")
        if place in self.places:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{what} cannot change after a kernel that uses it has been "
                            "launched")
        self.limits[limit] = int(value)
        return True

    def owns(self, address: int) -> bool:
        return any(place[0] == address for place in self.places.values())

    def provide(self, context: int, allocate: Callable[[int, int], int], heap: bool,
                launches: bool, cooperative: bool) -> dict[str, tuple[int, int]]:
        """The places a launch needs (made by `allocate(context, size)` the first time):
        name -> (address, size)."""
        wanted = []
        if heap:
            wanted.append(("heap", self.limits[CU_LIMIT_MALLOC_HEAP_SIZE]))
        if launches:
            wanted.append(("launch_buffers", PARAMETER_BUFFER_BYTES * self.limits[
                CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT]))
        if cooperative:
            wanted.append(("grid_workspace", GRID_WORKSPACE_BYTES))
        out = {}
        for name, size in wanted:
            if name not in self.places and size > 0:
                self.places[name] = [allocate(context, size), size, context]
            if name in self.places:
                address, size, _ = self.places[name]
                out[name] = (address, size)
        return out

    def forget_context(self, context: int) -> list[int]:
        """The addresses of the places `context` owned, which it no longer has (a context
        destroyed or reset: the limits come back to their defaults too)."""
        gone = [name for name, place in self.places.items() if place[2] == context]
        addresses = [self.places.pop(name)[0] for name in gone]
        if not self.places:
            self.__init__()
        return addresses

    def describe(self) -> dict:
        return {"limits": [[k, v] for k, v in self.limits.items()],
                "places": {name: list(place) for name, place in self.places.items()}}

    def restore(self, state: dict) -> None:
        self.limits = {int(k): int(v) for k, v in state["limits"]}
        self.places = {name: [int(v) for v in place] for name, place in state["places"].items()}
