"""Physical memory of the virtual memory API shared between sessions of one server
(cuMemExportToShareableHandle, cuMemImportFromShareableHandle), checked on the sessions
themselves: what an import shares and how long it lives, and what the server refuses: an
allocation not made exportable, a forged or altered handle (what a file of the program's own
making carries), one exported by another server, a stranger's import."""

from __future__ import annotations

import pytest
from test_ipc_sessions import CONTEXT, STRANGER, _call, _session

from vgpu.errors import CudaError
from vgpu.protocol import VMM_GRANULARITY
from vgpu.server.ipc import IpcRegistry

MEMORY = 0x7667_0600_0000_0001  # client handles of physical memory
EXPORTABLE = [1, 1, 1, 0, 0, 0, 0]  # pinned, POSIX file descriptor, on device 0
PRIVATE = [1, 0, 1, 0, 0, 0, 0]
READ_WRITE = 3
SIZE = VMM_GRANULARITY


def _mapped(session, handle: int) -> int:
    """`handle` mapped read-write at a new reservation of `session`: its address."""
    address = _call(session, "cuMemAddressReserve", SIZE, 0, 0)
    _call(session, "cuMemMap", address, SIZE, 0, handle)
    _call(session, "cuMemSetAccess", address, SIZE, READ_WRITE)
    return address


def _read(session, address: int, size: int) -> bytes:
    seen = bytearray(size)
    session.backend.read_into(address, memoryview(seen))
    return bytes(seen)


def _refused(session, op: str, *args) -> int:
    with pytest.raises(CudaError) as refused:
        _call(session, op, *args)
    return refused.value.code


def test_an_import_shares_the_memory_and_outlives_the_exporters_release():
    registry = IpcRegistry()
    owner, peer = _session(1, registry), _session(2, registry)
    _call(owner, "cuMemCreate", MEMORY, SIZE, EXPORTABLE)
    exported = _call(owner, "cuMemExportToShareableHandle", MEMORY)
    assert len(exported) == 64 and exported == _call(owner, "cuMemExportToShareableHandle",
                                                     MEMORY)
    at_owner = _mapped(owner, MEMORY)
    owner.backend.write(at_owner, memoryview(b"from the owner"))

    assert _call(peer, "cuMemImportFromShareableHandle", MEMORY + 5, exported) == EXPORTABLE
    assert _call(peer, "cuMemGetAllocationPropertiesFromHandle", MEMORY + 5) == EXPORTABLE
    at_peer = _mapped(peer, MEMORY + 5)
    assert _read(peer, at_peer, 14) == b"from the owner"
    peer.backend.write(at_peer + 100, memoryview(b"from the peer"))
    assert _read(owner, at_owner + 100, 13) == b"from the peer"
    assert peer.memory_in_use() == SIZE  # the importer's quota pays for what it holds

    for session in (owner, peer):  # neither can be checkpointed while they share it
        with pytest.raises(CudaError) as refused:
            session.capture(0)
        assert refused.value.code == 801 and "cuMemImportFromShareableHandle" in \
            refused.value.message

    # The owner lets go of all it had: the peer's memory lives on, and the export with it.
    _call(owner, "cuMemUnmap", at_owner, SIZE)
    _call(owner, "cuMemRelease", MEMORY)
    assert _read(peer, at_peer, 14) == b"from the owner"
    assert owner.memory_in_use() == 0
    third = _session(4, registry)
    _call(third, "cuMemImportFromShareableHandle", MEMORY, exported)
    _call(third, "cuMemRelease", MEMORY)

    # The last holder gone, the export imports nothing more and both sessions move again.
    _call(peer, "cuMemRelease", MEMORY + 5)
    assert _read(peer, at_peer, 14) == b"from the owner"  # still mapped
    _call(peer, "cuMemUnmap", at_peer, SIZE)
    assert _refused(third, "cuMemImportFromShareableHandle", MEMORY + 1, exported) == 1
    for session in (owner, peer):
        assert session.capture(0).state["journal"]
    for session in (owner, peer, third):
        session.close()


def test_the_server_refuses_what_no_export_of_its_own_proves():
    registry, other_server = IpcRegistry(), IpcRegistry()
    owner, peer = _session(1, registry), _session(2, registry)
    stranger = _session(3, registry, STRANGER)
    elsewhere = _session(1, other_server)
    _call(owner, "cuMemCreate", MEMORY, SIZE, EXPORTABLE)
    _call(owner, "cuMemCreate", MEMORY + 1, SIZE, PRIVATE)
    _call(elsewhere, "cuMemCreate", MEMORY, SIZE, EXPORTABLE)

    # Memory exports only where its allocation asked to be exportable.
    assert _refused(owner, "cuMemExportToShareableHandle", MEMORY + 1) == 1
    assert _refused(owner, "cuMemExportToShareableHandle", MEMORY + 9) == 1
    exported = _call(owner, "cuMemExportToShareableHandle", MEMORY)
    of_another_server = _call(elsewhere, "cuMemExportToShareableHandle", MEMORY)

    altered = exported[:40] + bytes([exported[40] ^ 1]) + exported[41:]
    forged = exported[:16] + bytes(48)
    ipc_handle = _call(owner, "cuIpcGetMemHandle", owner.mem_alloc(CONTEXT, 4096))
    for session, bad in ((peer, altered), (peer, forged), (peer, of_another_server),
                         (peer, ipc_handle), (stranger, exported)):
        assert _refused(session, "cuMemImportFromShareableHandle", MEMORY + 2, bad) == 1
        assert MEMORY + 2 not in session.vmm.physical
    with pytest.raises(ValueError):  # not 64 bytes: the call's bad arguments
        _call(peer, "cuMemImportFromShareableHandle", MEMORY + 2, b"short")
    # A handle already in use is refused without taking a hold on the memory.
    _call(peer, "cuMemCreate", MEMORY + 3, SIZE, PRIVATE)
    assert _refused(peer, "cuMemImportFromShareableHandle", MEMORY + 3, exported) == 1
    assert peer.memory_in_use() == SIZE
    for session in (owner, peer, stranger, elsewhere):
        session.close()


def test_the_last_session_to_end_gives_the_memory_back():
    registry = IpcRegistry()
    owner, peer = _session(1, registry), _session(2, registry)
    released = []
    for session in (owner, peer):
        session.backend.release_physical = released.append
    _call(owner, "cuMemCreate", MEMORY, SIZE, EXPORTABLE)
    memory = owner.vmm.physical[MEMORY].memory
    exported = _call(owner, "cuMemExportToShareableHandle", MEMORY)
    _call(peer, "cuMemImportFromShareableHandle", MEMORY, exported)
    at_peer = _mapped(peer, MEMORY)
    peer.backend.write(at_peer, memoryview(b"kept"))
    owner.close()  # its export goes with it; the peer's hold keeps the memory
    assert released == [] and _read(peer, at_peer, 4) == b"kept"
    assert _refused(_session(3, registry), "cuMemImportFromShareableHandle", MEMORY,
                    exported) == 1
    peer.close()
    assert released == [memory]  # once, by the last holder
