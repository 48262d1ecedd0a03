"""IPC between the processes of one server: device memory that one session exports
(cuIpcGetMemHandle) and another maps into its own address space (cuIpcOpenMemHandle), and
events one records and another waits for (cuIpcGetEventHandle, cuIpcOpenEventHandle); the
registry also holds the virtual memory API's exported physical memory (server/vmm_sharing.py).

A handle is 64 bytes, as CUDA's: a marker, then 16 random bytes the server chose, which name
the export in the server's registry. Like CUDA's, having the handle is what lets a process
open it, and only a session of the same user (or key) as the exporter's may; the random part
cannot be guessed. The importer maps the exporter's memory itself (the emulator's sessions
each have a memory of their own, so the buffer is shared, not copied; on a GPU the
exporter's physical memory is mapped again), at an address of its own arena: both see each
other's writes at once. An opened event shares the exporter's
record of it (server/session.py EventRecord): a wait for it waits for work of the exporter's
streams.

What is exported and opened is not journaled: a session that has either is refused a
checkpoint or a move, with a message saying why (`Session.check_movable`).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass

from vgpu.errors import CudaError
from vgpu.protocol import IPC_HANDLE_BYTES as HANDLE_BYTES
from vgpu.protocol import IPC_MARKERS as MARKERS

__all__ = ["IpcRegistry", "Export", "HANDLE_BYTES", "IPC_OPS"]



@dataclass
class Export:
    owner: object  # the exporting session (server.session.Session)
    kind: str      # "memory", "event" or "vmm" (physical memory: server/vmm_sharing.py)
    key: int       # the allocation's base address there, the event's handle, or the
    #                physical memory's serial
    size: int      # bytes of memory (0 for an event)
    shared: object  # what the importer gets: the memory (the exporter's backend's
    #                 SharedMemory), the event's record (server.session.EventRecord), or
    #                 the physical memory (server.vmm_sharing.SharedPhysical)
    flags: int = 0  # an event's


class IpcRegistry:
    """The server's exports, by handle (any session's worker thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exports: dict[bytes, Export] = {}
        self._handles: dict[tuple[int, str, int], bytes] = {}  # (session id, kind, key) ->

    def export(self, export: Export) -> bytes:
        """The handle of `export` (the same each time its object is exported)."""
        key = (export.owner.id, export.kind, export.key)
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                marker = MARKERS[export.kind]
                handle = marker + secrets.token_bytes(HANDLE_BYTES - len(marker))
                self._handles[key] = handle
                self._exports[handle] = export
            return handle

    def find(self, handle: bytes, kind: str) -> Export | None:
        with self._lock:
            export = self._exports.get(bytes(handle))
        return export if export is not None and export.kind == kind else None

    def exports_of(self, owner) -> int:
        with self._lock:
            return sum(1 for session_id, _, _ in self._handles if session_id == owner.id)

    def withdraw(self, owner, kind: str | None = None, key: int | None = None) -> None:
        """`owner`'s object (everything, if no kind) is gone: its handle opens nothing from
        now on (who opened it keeps what it got: memory stays mapped, as on CUDA, where using
        it after is undefined)."""
        with self._lock:
            for k in [k for k in self._handles if k[0] == owner.id and kind in (None, k[1])
                      and key in (None, k[2])]:
                self._exports.pop(self._handles.pop(k), None)


def handle_bytes(value) -> bytes:
    """A handle as a client sent it: exactly HANDLE_BYTES bytes."""
    if not isinstance(value, bytes) or len(value) != HANDLE_BYTES:
        raise ValueError(f"an IPC handle is {HANDLE_BYTES} bytes")
    return value


# ----------------------------------------------------------------- the session's calls
# (registered as Session handlers by server/session.py; `session` is the caller's)

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_SUPPORTED = 801
# CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS: what an event must be to be exported.
INTERPROCESS_EVENT = 0x2 | 0x4


def _registry(session) -> IpcRegistry:
    if session.ipc is None:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, "IPC needs sessions of one server")
    return session.ipc


def get_mem_handle(session, address: int) -> bytes:
    """cuIpcGetMemHandle: the handle of the allocation `address` is in."""
    registry = _registry(session)
    found = session.arena.find(address)
    if found is None or found[0] not in session.allocation_owner:
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not inside an allocation of cuMemAlloc")
    base, size = found
    return registry.export(Export(session, "memory", base, size,
                                  session.backend.export_memory(base, size)))


def open_mem_handle(session, context: int, handle) -> tuple[int, int]:
    """cuIpcOpenMemHandle: another session's exported memory, mapped here; the address it
    got (the same again, counted, for a handle already open) and its size."""
    registry = _registry(session)
    session.contexts.get(context)
    export = _opened(session, registry, handle, "memory")
    for address, opened in session.ipc_opened.items():
        if opened[0] == handle:
            opened[1] += 1
            return address, export.size
    shared = export.shared
    # The importer's quota pays for its mapping.
    start = session._reserve(shared.span or shared.size, alignment=shared.alignment)
    try:
        session.backend.import_memory(start, shared)
    except BaseException:
        session._unreserve(start)
        raise
    address = start + shared.lead
    session.ipc_opened[address] = [handle, 1, start]
    return address, export.size


def close_mem_handle(session, address: int) -> None:
    """cuIpcCloseMemHandle: one opening of `address` less; the last unmaps it."""
    opened = session.ipc_opened.get(address)
    if opened is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        f"0x{address:x} is not memory opened with cuIpcOpenMemHandle")
    opened[1] -= 1
    if opened[1] == 0:
        del session.ipc_opened[address]
        session.backend.unmap(opened[2])
        session._unreserve(opened[2])


def _opened(session, registry: IpcRegistry, handle, kind: str) -> Export:
    """What `handle` exports, if `session` may open it."""
    export = registry.find(handle_bytes(handle), kind)
    if export is None or not session.peer.owns(export.owner.peer):
        raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"no {kind} is exported with that IPC handle")
    if export.owner is session:
        raise CudaError(CUDA_ERROR_INVALID_CONTEXT,
                        "an IPC handle cannot be opened by the process that exported it")
    return export


def get_event_handle(session, event: int) -> bytes:
    """cuIpcGetEventHandle: the handle of an interprocess event."""
    registry = _registry(session)
    found = session.events.get(event)
    if found.flags & INTERPROCESS_EVENT != INTERPROCESS_EVENT:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "the event was not created with "
                        "CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING")
    found.record.shared = True
    return registry.export(Export(session, "event", event, 0, found.record, found.flags))


def open_event_handle(session, handle: int, context: int, ipc_handle) -> int:
    """cuIpcOpenEventHandle: another session's event, as event `handle` here (sharing its
    record: a wait here waits for the exporter's work); its flags."""
    export = _opened(session, _registry(session), ipc_handle, "event")
    session.event_create(handle, context, export.flags, export.shared)
    return export.flags


IPC_OPS = {
    "cuIpcGetMemHandle": get_mem_handle,
    "cuIpcOpenMemHandle": open_mem_handle,
    "cuIpcCloseMemHandle": close_mem_handle,
    "cuIpcGetEventHandle": get_event_handle,
    "cuIpcOpenEventHandle": open_event_handle,
}
