"""The device memory a session's device runtime uses on a backend that runs it itself (emu):
the malloc heap, the parameter buffers of device-side launches, and the grid barrier of
cooperative launches.

Each is an ordinary allocation of the session, made when a kernel first needs it (its first
malloc, its first device-side launch; a cooperative launch's barrier before it starts),
owned by the launching function's context and journaled like any allocation, so
checkpoints, restores and migrations carry it with its contents: the heap keeps its
bookkeeping inside itself (emu/device_heap.py), so blocks malloc'd before a move can be
freed after it. The program never sees these addresses and cannot free them (cuMemFree of
one is CUDA_ERROR_INVALID_VALUE, as for any address it did not allocate). Their places
are part of the session's own state (`describe`/`restore`).

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

_LIMIT_OF = {"heap": CU_LIMIT_MALLOC_HEAP_SIZE,
             "launch_buffers": CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT}
_LIMIT_NAMES = {CU_LIMIT_MALLOC_HEAP_SIZE: ("heap", "the malloc heap size"),
                CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
                    ("launch_buffers", "the pending launch count")}


class DeviceRuntimeMemory:
    def __init__(self) -> None:
        self.limits = {CU_LIMIT_MALLOC_HEAP_SIZE: DEFAULT_HEAP_BYTES,
                       CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: DEFAULT_PENDING_LAUNCHES}
        # "heap", "launch_buffers", "grid_workspace" -> [address, size, context]
        self.places: dict[str, list[int]] = {}
        # the limits a launched kernel has fixed (it uses what they size)
        self.fixed: set[int] = set()
        self._launching: tuple[int, Callable[[int, int], int]] | None = None

    def set_limit(self, limit: int, value: int) -> bool:
        """Apply a limit the device runtime obeys; False for other limits."""
        if limit not in _LIMIT_NAMES:
            return False
        place, what = _LIMIT_NAMES[limit]
        if value < 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"negative {what}")
        if limit in self.fixed or place in self.places:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{what} cannot change after a kernel that uses it has been "
                            "launched")
        self.limits[limit] = int(value)
        return True

    def owns(self, address: int) -> bool:
        return any(place[0] == address for place in self.places.values())

    def launching(self, context: int, allocate: Callable[[int, int], int], heap: bool,
                  launches: bool, cooperative: bool) -> Callable[[str], tuple[int, int]]:
        """A launch that uses the heap, launches kernels or is cooperative is coming, from
        `context`: the limits it uses are fixed from now on, the grid barrier of a
        cooperative launch is made, and the returned `place(name)` makes the others (with
        `allocate(context, size)`) when the kernel, or a child of it, first needs them."""
        if heap:
            self.fixed.add(CU_LIMIT_MALLOC_HEAP_SIZE)
        if launches:
            self.fixed.add(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT)
        self._launching = (context, allocate)
        if cooperative:
            self.place("grid_workspace")
        return self.place

    def place(self, name: str) -> tuple[int, int]:
        """(address, size) of the device runtime's memory `name`, made on first use."""
        if name not in self.places:
            size = {"heap": self.limits[CU_LIMIT_MALLOC_HEAP_SIZE],
                    "launch_buffers": PARAMETER_BUFFER_BYTES * self.limits[
                        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT],
                    "grid_workspace": GRID_WORKSPACE_BYTES}[name]
            if size <= 0:
                return 0, 0
            context, allocate = self._launching
            self.places[name] = [allocate(context, size), size, context]
            self.fixed.add(_LIMIT_OF.get(name, 0))
        address, size, _ = self.places[name]
        return address, size

    def forget_context(self, context: int) -> None:
        """`context` is destroyed or reset: its places go with its allocations."""
        for name in [n for n, place in self.places.items() if place[2] == context]:
            del self.places[name]

    def describe(self) -> dict:
        return {"limits": [[k, v] for k, v in self.limits.items()],
                "places": {name: list(place) for name, place in self.places.items()},
                "fixed": sorted(self.fixed)}

    def restore(self, state: dict) -> None:
        self.limits = {int(k): int(v) for k, v in state["limits"]}
        self.places = {name: [int(v) for v in place] for name, place in state["places"].items()}
        self.fixed = {int(k) for k in state["fixed"]}
