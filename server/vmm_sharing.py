"""Physical memory of CUDA's virtual memory API shared between the processes of one server:
cuMemExportToShareableHandle and cuMemImportFromShareableHandle.

An allocation made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested handle
types exports as a 64-byte handle of the server's IPC registry (server/ipc.py): a marker,
then random bytes the server chose, which name the export. The client puts it in a memory
file, whose descriptor is CUDA's shareable handle (shim/driver/vmm.py), so a program passes it
to another process as it would CUDA's (SCM_RIGHTS). The server trusts nothing about the file:
only the random bytes count, so a forged file, another file, or one exported by another
server imports nothing; and, as with cuIpcOpenMemHandle, only a session of the exporter's user
(or key) may import it.

The importer gets a handle of its own to the same physical memory (the backend's object,
which any session's backend of the server may map: `Backend.create_physical`), charged to its
quota like memory it made. The memory lives while any session holds it, by a handle or a
mapping: the last one to let go gives it back to the backend, and the export is withdrawn
then (or when the exporting session ends). As on CUDA, the importer's memory outlives the
exporter's cuMemRelease.

Sessions holding shared physical memory are refused checkpoints and moves, as with IPC.
"""

from __future__ import annotations

import itertools
import threading

from vgpu.errors import CudaError

from .ipc import Export, _registry, handle_bytes

__all__ = ["SharedPhysical", "VMM_SHARING_OPS"]

CUDA_ERROR_INVALID_VALUE = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_serials = itertools.count(1)


class SharedPhysical:
    """One piece of physical memory and the sessions' holds on it (each session's handle,
    while it or a mapping of it lives, is one)."""

    def __init__(self, memory: object, size: int, prop: list) -> None:
        self.memory = memory  # the backend's
        self.size = size
        self.prop = prop
        self.serial = next(_serials)  # names its exports in the registry
        self.exporters: list = []  # sessions that exported it
        self._holders = 1
        self._lock = threading.Lock()

    def hold(self) -> bool:
        """One more hold; False if the memory was given back already."""
        with self._lock:
            if not self._holders:
                return False
            self._holders += 1
            return True

    def let_go(self) -> bool:
        """One hold less: whether it was the last (the caller gives the memory back)."""
        with self._lock:
            self._holders -= 1
            return self._holders == 0


def export(session, handle: int) -> bytes:
    """cuMemExportToShareableHandle: the registry handle of physical allocation `handle`."""
    registry = _registry(session)
    physical = session.vmm.handles.get(handle)
    if not physical.prop[1] & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        "the allocation was not created with CU_MEM_HANDLE_TYPE_POSIX_FILE_"
                        "DESCRIPTOR among its requested handle types")
    shared = session.vmm.share(physical)
    if session not in shared.exporters:
        shared.exporters.append(session)
    return registry.export(Export(session, "vmm", shared.serial, shared.size, shared))


def import_(session, handle: int, exported) -> list:
    """cuMemImportFromShareableHandle: `exported` (a registry handle, from the file) as
    physical allocation `handle` of this session; its properties."""
    registry = _registry(session)
    found = registry.find(handle_bytes(exported), "vmm")
    if found is None or not session.peer.owns(found.owner.peer) or not found.shared.hold():
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        "the file descriptor is no allocation exported to this process")
    shared = found.shared
    try:
        session.vmm.adopt(handle, shared)
    except BaseException:
        give_back(session, shared)
        raise
    return shared.prop


def give_back(session, shared: SharedPhysical) -> None:
    """`session` lets go of `shared`: the last hold gives the memory back to the backend
    (`session`'s: any session's may) and withdraws its exports."""
    if shared.let_go():
        for exporter in shared.exporters:
            session.ipc.withdraw(exporter, "vmm", shared.serial)
        session.backend.release_physical(shared.memory)


VMM_SHARING_OPS = {
    "cuMemExportToShareableHandle": export,
    "cuMemImportFromShareableHandle": import_,
}
