"""Tables of client-chosen object handles, one per kind.

Clients pick handle values themselves so that creating an object needs no round trip; the
server only checks that a handle is live and of the right kind. Handles are never reused by a
client, so a stale handle is simply an unknown one.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from vgpu.errors import CudaError

__all__ = ["HandleTable", "MAX_HANDLES"]

T = TypeVar("T")
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_OUT_OF_MEMORY = 2
# Live objects of one kind a session may hold: each costs the server memory that no device
# quota counts, and no program needs millions of streams or events.
MAX_HANDLES = 1 << 20


class HandleTable(Generic[T]):
    def __init__(self, kind: str, error_code: int = CUDA_ERROR_INVALID_HANDLE):
        self.kind = kind
        self.error_code = error_code
        self._objects: dict[int, T] = {}

    def add(self, handle: int, obj: T) -> None:
        self.check_new(handle)
        self._objects[handle] = obj

    def check_new(self, handle: int) -> None:
        """Raise as `add` would for `handle`: before making what it is to name."""
        if not handle or handle in self._objects:
            raise CudaError(self.error_code, f"{self.kind} handle 0x{handle:x} is not new")
        if len(self._objects) >= MAX_HANDLES:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"the session holds {len(self._objects)} {self.kind}s, the most "
                            f"a session may")

    def get(self, handle: int) -> T:
        try:
            return self._objects[handle]
        except KeyError:
            raise CudaError(self.error_code,
                            f"unknown or destroyed {self.kind} handle 0x{handle:x}") from None

    def find(self, handle: int) -> T | None:
        """The object, or None (for callers that answer a missing one their own way)."""
        return self._objects.get(handle)

    def pop(self, handle: int) -> T:
        obj = self.get(handle)
        del self._objects[handle]
        return obj

    def __contains__(self, handle: int) -> bool:
        return handle in self._objects

    def items(self):
        return list(self._objects.items())

    def __len__(self) -> int:
        return len(self._objects)
