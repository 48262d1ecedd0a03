"""The journal keeps a session's live objects; capture and restore remake them elsewhere.

A session loads a module with a `__device__` variable, launches kernels that change it and
memory, and is captured; a fresh session restored from the capture has every handle, every
address and every byte, and its kernels go on from there.
"""

from __future__ import annotations

import secrets
import struct

import pytest

from vgpu.errors import CudaError
from vgpu.replay.journal import Journal
from vgpu.server.arena import VaArena
from vgpu.server.backends.emu import EmuBackend
from vgpu.server.session import Session

PTX = b"""
.version 8.0
.target sm_80
.address_size 64
.global .align 4 .u32 counter = 5;

.visible .entry incr()
{
    .reg .b32 %r<3>;
    ld.global.u32 %r1, [counter];
    add.u32 %r2, %r1, 1;
    st.global.u32 [counter], %r2;
    ret;
}

.visible .entry bump(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    ld.global.u32 %r2, [counter];
    add.u32 %r3, %r2, %r1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
}
"""
ARENA = 0x1000_0000_0000
CTX, MODULE, INCR, BUMP, STREAM, EVENT = 7, 20, 21, 22, 30, 31


def new_session(token: str) -> Session:
    return Session(1, {"token": token}, EmuBackend(), VaArena(ARENA, 1 << 40))


def run(session: Session, *calls, frames=()):
    code, result, out = session.execute(list(calls), list(frames))
    assert code == 0, session.last_error_message
    return result, out


def launch(function: int, threads: int, params: bytes = b""):
    return ["cuLaunchKernel", [function, 1, 1, 1, threads, 1, 1, 0, 0, params]]


@pytest.fixture
def session():
    s = new_session(secrets.token_hex(16))
    run(s, ["cuDevicePrimaryCtxRetain", [CTX, 0]],
        ["cuModuleLoadData", [MODULE, CTX, ["inline", PTX], len(PTX)]],
        ["cuModuleGetFunction", [INCR, MODULE, "incr"]],
        ["cuModuleGetFunction", [BUMP, MODULE, "bump"]],
        ["cuStreamCreate", [STREAM, CTX, 0, 0]], ["cuEventCreate", [EVENT, CTX, 0]],
        ["cuEventRecord", [EVENT, STREAM]])
    yield s
    s.close()


def test_the_journal_holds_only_live_objects_in_creation_order():
    journal = Journal()
    journal.created("context", 1, 0, 0, True)
    journal.created("alloc", 0x100, 64, 1)
    journal.created("alloc", 0x200, 64, 1)
    journal.created("stream", 5, 1, 0, 0)
    journal.destroyed("alloc", 0x100)
    journal.destroyed("alloc", 0x999)  # never created: nothing to forget
    assert journal.entries() == [["context", 1, 0, 0, True], ["alloc", 0x200, 64, 1],
                                 ["stream", 5, 1, 0, 0]]


def test_a_session_journals_what_its_calls_create_and_destroy(session):
    address, _ = run(session, ["cuMemAlloc", [CTX, 1000]])
    kinds = [entry[0] for entry in session.journal.entries()]
    assert kinds == ["context", "module", "function", "function", "stream", "event", "alloc"]
    run(session, ["cuMemFree", [address]], ["cuEventDestroy", [EVENT]],
        ["cuModuleUnload", [MODULE]])
    assert [entry[0] for entry in session.journal.entries()] == ["context", "stream"]


def test_restore_remakes_handles_addresses_variables_and_memory(session):
    address, _ = run(session, ["cuMemAlloc", [CTX, 4096]])
    run(session, launch(INCR, 1), launch(INCR, 1))  # counter: 5 -> 7
    run(session, ["vgpuMemset", [address, b"\xab", 4096]])
    capture = session.capture(position=9)
    assert capture.state["position"] == 9

    restored = new_session(session.token)
    regions = [(a, len(data)) for a, data in capture.regions]
    restored.restore(capture.state, regions,
                     lambda i, out: out.__setitem__(slice(None), capture.regions[i][1]))
    try:
        assert restored.modules.get(MODULE).loaded.variables == \
            session.modules.get(MODULE).loaded.variables
        assert restored.arena.allocations() == session.arena.allocations()
        _, frames = run(restored, ["cuMemcpyDtoH", [address, 4096, ["frame"]]])
        assert bytes(frames[0]) == b"\xab" * 4096
        # The kernels go on from the variable's value: 7, 8, 9, 10 for threads 0..3.
        run(restored, launch(BUMP, 4, struct.pack("<Q", address)))
        _, frames = run(restored, ["cuMemcpyDtoH", [address, 16, ["frame"]]])
        assert struct.unpack("<4I", bytes(frames[0])) == (7, 8, 9, 10)
        run(restored, ["cuStreamWaitEvent", [STREAM, EVENT]])
        assert run(restored, ["cuEventElapsedTime", [EVENT, EVENT]])[0] == 0.0
    finally:
        restored.close()


def test_restore_keeps_errors_the_program_has_not_heard_of(session):
    session.execute([["cuModuleUnload", [999]], ["vgpuQuery", []]], [])
    capture = session.capture(position=1)
    restored = new_session(session.token)
    restored.restore(capture.state, [(a, len(d)) for a, d in capture.regions],
                     lambda i, out: out.__setitem__(slice(None), capture.regions[i][1]))
    try:
        assert restored.take_reports()[0][0] == 400
    finally:
        restored.close()


def test_a_state_that_does_not_fit_is_refused(session):
    capture = session.capture(position=0)
    with pytest.raises(CudaError, match="is not free|is not new"):  # its objects are there already
        session.restore(capture.state, [], lambda i, out: None)
