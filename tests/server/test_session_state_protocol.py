"""Checkpoint, suspend/resume, migration and restore, driven through the wire protocol.

A raw client (no shim) makes a session with a few allocations, streams and events; admin
requests move it around; the tests check what a user would: the memory is bit-identical at
the same addresses, handles still work, errors waiting to be reported are still reported,
and bad requests and damaged images are refused clearly.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zmq
from vgpu_processes import ServerProcess

from vgpu.admin import AdminError, request
from vgpu.protocol import ADMIN, BYE, CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.replay.image import CHUNK_BYTES

CONTEXT = 7
MiB = 1 << 20


_open_clients: list[RawClient] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _open_clients:
        _open_clients.pop().close()


class RawClient:
    """A vgpu client speaking the protocol by hand (closed after each test)."""

    def __init__(self, address: str, token: str | None = None, resume: int | None = None):
        _open_clients.append(self)
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.seq = 0
        self.notices: list = []
        self.token = token or secrets.token_hex(16)
        self.hello = self.request(HELLO, {
            "version": PROTOCOL_VERSION, "pid": os.getpid(), "host": "elsewhere",
            "argv": ["raw-client"], "token": self.token,
            "resume": None if resume is None else {"position": resume}})

    def request(self, kind: str, body, frames=(), timeout: float = 30.0) -> list:
        self.seq += 1
        self.socket.send_multipart([pack([kind, self.seq, body]), *frames])
        return self.wait(self.seq, timeout)

    def wait(self, seq: int, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.poll(100):
                frames = self.socket.recv_multipart()
                reply = unpack(frames[0])
                if reply[0] == seq:
                    return [*reply[1:], frames[1:]]
                self.notices.append(reply[2])
        raise TimeoutError(f"no reply to {seq}")

    def post(self, calls: list, frames=()) -> None:
        self.socket.send_multipart([pack([CALLS, 0, calls]), *frames])

    def call(self, *calls, frames=()) -> list:
        return self.request(CALLS, list(calls), frames)

    def read(self, address: int, size: int) -> bytes:
        code, result, _, _, _, frames = self.call(["cuMemcpyDtoH", [address, size, ["frame"]]])
        assert code == 0, result
        return bytes(frames[0])

    def close(self) -> None:
        self.socket.close(0)


def admin(address: str, op: str, **args) -> tuple[int, object]:
    """(0, result) or (1, the server's refusal), as `vgpu checkpoint` and kin hear them."""
    try:
        return 0, request(address, op, [args] if op != "ps" else [], timeout_s=60)
    except AdminError as exc:
        return 1, str(exc)


def make_session(client: RawClient, sizes=(3 * MiB, 5 * MiB + 123, 4096)) -> dict[int, bytes]:
    """Allocations filled with random bytes, a stream and a recorded event."""
    client.post([["cuDevicePrimaryCtxRetain", [CONTEXT, 0]]])
    contents = {}
    for size in sizes:
        code, address, *_ = client.call(["cuMemAlloc", [CONTEXT, size]])
        assert code == 0, address
        data = os.urandom(size)
        code, result, *_ = client.call(["cuMemcpyHtoD", [address, ["frame", 0], size]],
                                       ["vgpuSynchronize", []], frames=[data])
        assert code == 0, result
        contents[address] = data
    code, result, *_ = client.call(["cuStreamCreate", [9, CONTEXT, 0, 0]],
                                   ["cuEventCreate", [11, CONTEXT, 0]],
                                   ["cuEventCreate", [12, CONTEXT, 0]],
                                   ["cuEventRecord", [11, 9]], ["cuEventRecord", [12, 9]],
                                   ["vgpuSynchronize", []])
    assert code == 0, result
    return contents


def assert_session_intact(client: RawClient, contents: dict[int, bytes]) -> None:
    for address, data in contents.items():
        assert client.read(address, len(data)) == data, f"contents at 0x{address:x} differ"
    code, elapsed, *_ = client.call(["cuEventElapsedTime", [11, 12]])
    assert code == 0 and elapsed >= 0.0
    code, result, *_ = client.call(["cuStreamWaitEvent", [9, 12]], ["vgpuSynchronize", []])
    assert code == 0, result


@pytest.fixture
def two_servers(tmp_path):
    folder = tmp_path / "images"
    # Interpreted, so that spin.ptx's kernel keeps a session busy: compiled, LLVM deletes a
    # loop that has no effect.
    a = ServerProcess(f"ipc://{tmp_path}/a.sock", "--checkpoint-dir", str(folder), "--no-compile")
    b = ServerProcess(f"ipc://{tmp_path}/b.sock", "--checkpoint-dir", str(folder), "--no-compile")
    yield a, b, folder
    for server in (a, b):
        server.stop()


def test_migration_keeps_addresses_contents_and_handles(two_servers):
    a, b, _ = two_servers
    client = RawClient(a.address)
    contents = make_session(client)
    client.post([["cuModuleUnload", [12345]]])  # fails: reported at the next reply

    code, result = admin(a.address, "migrate", pid=os.getpid(), to=b.address)
    assert code == 0, result
    assert result["moved_to"] == b.address and result["downtime_s"] < 5

    deadline = time.monotonic() + 10
    while not any(isinstance(n, dict) and "redirect" in n for n in client.notices):
        assert time.monotonic() < deadline, client.notices
        client.socket.poll(100) and client.notices.append(unpack(client.socket.recv())[2])
    redirect = next(n for n in client.notices if isinstance(n, dict) and "redirect" in n)
    assert redirect == {"redirect": b.address, "position": result["position"]}
    assert admin(a.address, "ps") == (0, [])
    # Until its client comes back (at its next call), the target shows it arriving.
    assert [s["state"] for s in admin(b.address, "ps")[1]] == ["arriving"]

    moved = RawClient(b.address, client.token, resume=redirect["position"])
    assert moved.hello[0] == 0 and moved.hello[1]["position"] == redirect["position"]
    code, message, deferred, *_ = moved.call(["vgpuSynchronize", []])
    assert deferred and deferred[0] == 400 and "module" in deferred[1]
    assert_session_intact(moved, contents)
    ps = admin(b.address, "ps")[1]
    assert [s["state"] for s in ps] == ["running"]
    assert ps[0]["memory"] == sum(len(d) for d in contents.values())


def test_stop_and_copy_migration_and_a_refused_target(two_servers, tmp_path):
    a, b, _ = two_servers
    client = RawClient(a.address)
    contents = make_session(client)
    code, result = admin(a.address, "migrate", pid=os.getpid(), to=f"ipc://{tmp_path}/none",
                         precopy=False)
    assert code != 0 and "did not answer" in result
    # The session stayed, and still works where it was.
    assert_session_intact(client, contents)
    code, result = admin(a.address, "migrate", pid=os.getpid(), to=b.address, precopy=False)
    assert code == 0 and result["rounds"] == 0, result
    moved = RawClient(b.address, client.token, resume=result["position"])
    assert_session_intact(moved, contents)


def test_suspend_frees_memory_and_holds_calls_until_resume(two_servers):
    a, _, _ = two_servers
    client = RawClient(a.address)
    contents = make_session(client)
    code, result = admin(a.address, "suspend", pid=os.getpid())
    assert code == 0, result
    ps = admin(a.address, "ps")[1]
    assert ps[0]["state"] == "suspended" and ps[0]["memory"] == 0

    first = next(iter(contents))
    client.seq += 1
    client.socket.send(pack([CALLS, client.seq, [["cuMemcpyDtoH", [first, 16, ["frame"]]]]]))
    with pytest.raises(TimeoutError):  # the call waits, hearing that the server is alive
        client.wait(client.seq, timeout=1.2)
    assert None in client.notices
    code, result = admin(a.address, "resume", pid=os.getpid())
    assert code == 0, result
    code, _, _, _, _, frames = client.wait(client.seq)
    assert code == 0 and bytes(frames[0]) == contents[first][:16]
    assert_session_intact(client, contents)
    assert admin(a.address, "ps")[1][0]["state"] == "running"


def test_suspend_then_resume_on_another_server(two_servers):
    a, b, _ = two_servers
    client = RawClient(a.address)
    contents = make_session(client)
    assert admin(a.address, "suspend", pid=os.getpid())[0] == 0
    code, result = admin(a.address, "resume", pid=os.getpid(), to=b.address)
    assert code == 0, result
    moved = RawClient(b.address, client.token, resume=result["position"])
    assert moved.hello[1]["position"] == result["position"]
    assert_session_intact(moved, contents)


def test_incremental_checkpoint_writes_only_what_changed(two_servers):
    a, _, folder = two_servers
    client = RawClient(a.address)
    contents = make_session(client, sizes=[2 * MiB] * 8)
    code, first = admin(a.address, "checkpoint", pid=os.getpid())
    assert code == 0, first
    assert first["path"] == str(folder / f"{client.token}.vgpu")
    assert first["written"] >= 16 * MiB * 0.9  # random data does not compress

    changed = sorted(contents)[3]
    code, result, *_ = client.call(["cuMemcpyHtoD", [changed, ["frame", 0], 2 * MiB]],
                                   frames=[os.urandom(2 * MiB)])
    assert code == 0, result
    code, second = admin(a.address, "checkpoint", pid=os.getpid())
    assert code == 0, second
    assert second["chunks"] - second["shared_chunks"] == -(-2 * MiB // CHUNK_BYTES)
    assert 2 * MiB <= second["written"] < 2 * MiB + 64 * 1024
    ps = admin(a.address, "ps")[1]
    assert ps[0]["checkpoint"]["written"] == second["written"]


def test_failover_restores_the_last_checkpoint(tmp_path):
    folder = tmp_path / "images"
    a = ServerProcess(f"ipc://{tmp_path}/a.sock", "--checkpoint-dir", str(folder),
                      "--checkpoint-every", "0.2")
    try:
        client = RawClient(a.address)
        contents = make_session(client)
        deadline = time.monotonic() + 20
        while not any(isinstance(n, dict) and "checkpointed" in n for n in client.notices):
            assert time.monotonic() < deadline, "no periodic checkpoint"
            if client.socket.poll(100):
                client.notices.append(unpack(client.socket.recv())[2])
        covered = next(n for n in client.notices if isinstance(n, dict) and "checkpointed" in n)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)
    finally:
        a.stop()
    b = ServerProcess(f"ipc://{tmp_path}/b.sock", "--checkpoint-dir", str(folder))
    try:
        standby = RawClient(b.address, client.token, resume=0)
        assert standby.hello[0] == 0, standby.hello
        assert standby.hello[1]["position"] == covered["checkpointed"]
        assert_session_intact(standby, contents)
        # (A hello with the token of a session served here would take that session back: a
        # reconnect. The standby's client leaves first, so the image is what is left.)
        standby.socket.send(pack([BYE, 0, None]))
        # A client whose image is damaged hears why, once, and nothing is restored: a
        # damaged chunk (found while restoring) or a damaged manifest (found at once).
        chunk = max((p for p in (folder / ".vgpu-chunks").rglob("*") if len(p.name) == 64),
                    key=lambda p: p.stat().st_size)
        original = chunk.read_bytes()
        chunk.write_bytes(original[:-9] + bytes(9))
        code, message, *_ = RawClient(b.address, client.token, resume=0).hello
        assert code == 46 and "cannot be restored" in message and chunk.name in message
        chunk.write_bytes(original)
        assert admin(b.address, "ps")[1] == []  # the refused one is gone
        image = folder / f"{client.token}.vgpu"
        damaged = bytearray(image.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        image.write_bytes(damaged)
        code, message, *_ = RawClient(b.address, client.token, resume=0).hello
        assert code == 46 and "cannot be restored" in message and "corrupt" in message
    finally:
        b.stop()


def test_bad_admin_requests_are_refused_clearly(two_servers, tmp_path):
    a, _, _ = two_servers
    RawClient(a.address).post([["cuDevicePrimaryCtxRetain", [CONTEXT, 0]]])
    assert admin(a.address, "checkpoint", pid=1) == (1, "no session with pid 1 on this server")
    code, message = admin(a.address, "checkpoint", pid=os.getpid(), path="relative.vgpu")
    assert code == 1 and "absolute" in message
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    code, message = admin(a.address, "checkpoint", pid=os.getpid(), path=str(precious))
    assert code == 1 and "not a vgpu checkpoint image" in message
    assert precious.read_text() == "keep me"
    assert admin(a.address, "resume", pid=os.getpid())[1].endswith("is not suspended (running)")
    assert admin(a.address, "migrate", pid=os.getpid())[0] == 1
    code, message = admin(a.address, "adopt", token="0" * 32, phase="commit", state={},
                          regions=[])
    assert code == 1 and "no session" in message
    code, message = admin(a.address, "adopt", token="0" * 32, phase="memory",
                          chunks=[[1, 2, 3, 4]])
    assert code == 1
    assert admin(a.address, "adopt", token="1" * 32, phase="begin")[0] == 0
    sender = zmq.Context.instance().socket(zmq.DEALER)  # a memory message, with its frame
    sender.setsockopt(zmq.LINGER, 0)
    sender.connect(a.address)
    try:
        sender.send_multipart([pack([ADMIN, 1, ["adopt", [{
            "token": "1" * 32, "phase": "memory", "chunks": [[0, 1 << 40, 0, 1]]}]]]), b"x"])
        assert sender.poll(10_000)
        code, message = unpack(sender.recv())[1:3]
    finally:
        sender.close()
    assert code == 1 and "exceed the device's" in message
    assert a.alive()


def test_the_emulator_says_what_may_have_changed_since_a_mark():
    from vgpu.server.backends.emu import EmuBackend

    backend = EmuBackend()
    backend.map(0x1000, 4096)
    mark = backend.mark()
    assert backend.changed_since(mark) == []
    backend.write(0x1100, memoryview(b"x" * 16))
    backend.fill(0x1200, b"\0", 8)
    backend.host_view(0x1300, 4, writing=False)  # read only: no change
    assert backend.changed_since(mark) == [(0x1100, 16), (0x1200, 8)]
    later = backend.mark()
    assert backend.changed_since(later) == []
    # A kernel may store through any pointer: after a launch, nothing is known.
    ptx = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry nop()\n{\n ret;\n}\n"
    module = backend.load_module(ptx, allocate=lambda size, managed=False: 0x9000)
    backend.prepare_launch(module, "nop", (1, 1, 1), (1, 1, 1), 0)(b"", 1 << 20)
    assert backend.changed_since(later) is None and backend.changed_since(mark) is None
    assert backend.changed_since(backend.mark()) == []


def test_an_operation_on_a_session_that_ends_meanwhile_fails_clearly(two_servers):
    a, _, _ = two_servers
    spin = (Path(__file__).parent / "programs" / "spin.ptx").read_bytes()
    client = RawClient(a.address)
    client.post([["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                 ["cuModuleLoadData", [20, CONTEXT, ["inline", spin], len(spin)]],
                 ["cuModuleGetFunction", [21, 20, "spin"]],
                 ["cuLaunchKernel", [21, 1, 1, 1, 1, 1, 1, 0, 0,
                                     (1 << 31).to_bytes(4, "little")]]])
    asked = ThreadPoolExecutor(1).submit(admin, a.address, "checkpoint", pid=os.getpid())
    time.sleep(0.5)  # the checkpoint waits behind the kernel
    client.socket.send(pack([BYE, 0, None]))
    assert asked.result(timeout=30) == (1, "the session ended")
    assert admin(a.address, "ps") == (0, [])


HEAP_PTX = b"""
.version 7.5
.target sm_75
.address_size 64
.extern .func (.param .b64 ret) malloc (.param .b64 size);
.extern .func free (.param .b64 ptr);

.visible .entry grab(.param .u64 slots)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<5>;
    mov.u32 %r1, %tid.x;
    {
        .param .b64 size;
        .param .b64 block;
        st.param.b64 [size], 64;
        call.uni (block), malloc, (size);
        ld.param.b64 %rd1, [block];
    }
    mad.lo.u32 %r2, %r1, 1000, 7;
    st.global.u32 [%rd1], %r2;
    ld.param.u64 %rd2, [slots];
    mul.wide.u32 %rd3, %r1, 8;
    add.u64 %rd4, %rd2, %rd3;
    st.global.u64 [%rd4], %rd1;
    ret;
}

.visible .entry release(.param .u64 slots, .param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<7>;
    mov.u32 %r1, %tid.x;
    ld.param.u64 %rd2, [slots];
    mul.wide.u32 %rd3, %r1, 8;
    add.u64 %rd4, %rd2, %rd3;
    ld.global.u64 %rd1, [%rd4];
    ld.global.u32 %r2, [%rd1];
    ld.param.u64 %rd5, [out];
    mul.wide.u32 %rd6, %r1, 4;
    add.u64 %rd5, %rd5, %rd6;
    st.global.u32 [%rd5], %r2;
    {
        .param .b64 pointer;
        st.param.b64 [pointer], %rd1;
        call.uni free, (pointer);
    }
    ret;
}
"""


def test_the_device_heap_moves_with_its_blocks_and_its_limit(two_servers):
    """Blocks device malloc handed out before a migration are read and freed after it, the
    heap's size stays fixed, and malloc then hands the freed blocks out again."""
    a, b, _ = two_servers
    client = RawClient(a.address)
    client.post([["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                 ["cuCtxSetLimit", [2, 64 << 10]],  # CU_LIMIT_MALLOC_HEAP_SIZE
                 ["cuModuleLoadData", [20, CONTEXT, ["inline", HEAP_PTX], len(HEAP_PTX)]],
                 ["cuModuleGetFunction", [21, 20, "grab"]],
                 ["cuModuleGetFunction", [22, 20, "release"]]])
    code, slots, *_ = client.call(["cuMemAlloc", [CONTEXT, 8 * 8]])
    assert code == 0, slots
    code, out, *_ = client.call(["cuMemAlloc", [CONTEXT, 8 * 4]])
    assert code == 0, out
    grab = ["cuLaunchKernel", [21, 1, 1, 1, 8, 1, 1, 0, 0, slots.to_bytes(8, "little")]]
    code, result, *_ = client.call(grab, ["vgpuSynchronize", []])
    assert code == 0, result
    blocks = client.read(slots, 64)

    code, result = admin(a.address, "migrate", pid=os.getpid(), to=b.address)
    assert code == 0, result
    moved = RawClient(b.address, client.token, resume=result["position"])
    release = ["cuLaunchKernel", [22, 1, 1, 1, 8, 1, 1, 0, 0,
                                  slots.to_bytes(8, "little") + out.to_bytes(8, "little")]]
    code, result, *_ = moved.call(release, ["vgpuSynchronize", []])
    assert code == 0, result
    values = moved.read(out, 32)
    assert [int.from_bytes(values[4 * t:4 * t + 4], "little") for t in range(8)] == \
        [1000 * t + 7 for t in range(8)]
    code, result, *_ = moved.call(["cuCtxSetLimit", [2, 1 << 20]])
    assert code == 1, "the heap's size is fixed once a kernel used it"
    code, result, *_ = moved.call(grab, ["vgpuSynchronize", []])
    assert code == 0, result
    assert moved.read(slots, 64) == blocks  # the freed blocks, handed out again
