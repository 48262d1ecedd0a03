"""IPC between sessions of one server, checked on the sessions themselves: who may open a
handle, what an opened handle shares, what a forged handle or a stranger gets, and that
sessions sharing memory or events refuse to be checkpointed (the journal cannot carry them)."""

from __future__ import annotations

import os

import pytest

from vgpu.errors import CudaError
from vgpu.server.arena import VaArena
from vgpu.server.backends.emu import EmuBackend
from vgpu.server.ipc import IpcRegistry
from vgpu.server.peers import Peer
from vgpu.server.session import OPS, Session

CONTEXT = 0x7667_0100_0000_0001
ME = Peer("ipc", uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), name="me")
STRANGER = Peer("ipc", uid=os.getuid() + 1, gid=0, pid=1, name="someone else")
INTERPROCESS_EVENT = 0x2 | 0x4  # CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS


def _session(session_id: int, registry: IpcRegistry, peer: Peer = ME) -> Session:
    session = Session(session_id, {"pid": os.getpid(), "token": f"{session_id:032x}"},
                      EmuBackend(), VaArena(1 << 44, 1 << 40), peer=peer)
    session.primary_ctx_retain(CONTEXT, 0)
    session.ipc = registry
    return session


def _call(session: Session, op: str, *args):
    return OPS[op](session, *args)


def test_an_opened_handle_shares_the_memory_and_strangers_get_nothing():
    registry = IpcRegistry()
    owner, peer, stranger = (_session(1, registry), _session(2, registry),
                             _session(3, registry, STRANGER))
    address = owner.mem_alloc(CONTEXT, 4096)
    owner.backend.write(address, memoryview(bytes(range(256)) * 16))
    handle = _call(owner, "cuIpcGetMemHandle", address + 100)  # inside: the allocation's
    assert len(handle) == 64 and handle == _call(owner, "cuIpcGetMemHandle", address)

    opened, size = _call(peer, "cuIpcOpenMemHandle", CONTEXT, handle)
    assert size == 4096
    seen = bytearray(16)
    peer.backend.read_into(opened + 32, memoryview(seen))
    assert bytes(seen) == bytes(range(32, 48))
    peer.backend.write(opened, memoryview(b"\xff" * 8))  # the owner sees the importer's write
    seen = bytearray(8)
    owner.backend.read_into(address, memoryview(seen))
    assert bytes(seen) == b"\xff" * 8

    forged = handle[:40] + bytes([handle[40] ^ 1]) + handle[41:]
    for session, bad, code in ((stranger, handle, 400), (peer, forged, 400),
                               (owner, handle, 201)):
        with pytest.raises(CudaError) as refused:
            _call(session, "cuIpcOpenMemHandle", CONTEXT, bad)
        assert refused.value.code == code
    with pytest.raises(ValueError):  # a handle that is not 64 bytes: the call's bad arguments
        _call(peer, "cuIpcOpenMemHandle", CONTEXT, b"short")

    for session in (owner, peer):
        with pytest.raises(CudaError) as refused:
            session.capture(0)
        assert refused.value.code == 801 and "IPC" in refused.value.message
    _call(peer, "cuIpcCloseMemHandle", opened)
    with pytest.raises(CudaError):
        _call(peer, "cuIpcCloseMemHandle", opened)
    owner.mem_free(address)  # a freed allocation's handle opens nothing more
    with pytest.raises(CudaError) as refused:
        _call(peer, "cuIpcOpenMemHandle", CONTEXT, handle)
    assert refused.value.code == 400
    assert peer.capture(0).state["journal"]  # nothing shared any more: it moves again
    for session in (owner, peer, stranger):
        session.close()


def test_an_opened_event_is_the_exporters_and_only_interprocess_events_export():
    registry = IpcRegistry()
    owner, peer = _session(1, registry), _session(2, registry)
    owner.event_create(11, CONTEXT, 0)
    owner.event_create(12, CONTEXT, INTERPROCESS_EVENT)
    with pytest.raises(CudaError) as refused:
        _call(owner, "cuIpcGetEventHandle", 11)
    assert refused.value.code == 1
    handle = _call(owner, "cuIpcGetEventHandle", 12)
    assert _call(peer, "cuIpcOpenEventHandle", 21, CONTEXT, handle) == INTERPROCESS_EVENT
    assert peer.events.get(21).record is owner.events.get(12).record
    peer.query("event", 21)  # never recorded: complete
    with pytest.raises(CudaError) as refused:
        peer.capture(0)
    assert refused.value.code == 801
    for session in (owner, peer):
        session.close()
