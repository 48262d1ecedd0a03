"""A session that moves: the client follows a redirect, fails over to a standby, and resends
what the new server lacks. A real Connection talks to fake servers (zmq ROUTERs in threads)
that answer the way a vgpu server does and record what they received."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import socket
import subprocess
import threading
import time

import pytest
import zmq

from vgpu.client import CHUNK_BYTES, PEER_COPY_BYTES, Connection
from vgpu.errors import CudaError, DeviceUnavailable
from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, RELEASE, pack, unpack

DEVICE = {"name": "fake", "uuid": "0" * 32, "total_memory": 1 << 30,
          "compute_capability": [8, 0], "attributes": {}}
FREE_TOTAL = [123, 456]
BASE = 0x7000_0000_0000
SHUTTING_DOWN = "the server is shutting down"


class FakeServer:
    """A vgpu server's wire behaviour, enough for one client: answers hello (mapping the
    client's staging ring), replies to calls, grants device windows over a memory file, and
    records every message. `on_calls(server, seq, calls, frames)` may replace the answer."""

    def __init__(self, address: str, *, position: int = 0, shm: bool = True,
                 windows: bool = False, pid: int | None = None):
        self.address = address
        self.pid = pid or os.getpid()  # the server process its hello names
        self.position = position  # what its hello says the session's state covers
        self.shm, self.windows = shm, windows
        self.hellos: list[dict] = []
        self.calls: list[tuple[int, list, list]] = []  # (seq, calls, frames) per message
        self.kinds: list[str] = []  # every message's kind, in order
        self.ring: mmap.mmap | None = None
        self.identity: bytes | None = None
        self.on_calls = None
        self.window_fd = os.memfd_create("fake-device-memory")
        os.ftruncate(self.window_fd, 2 * PEER_COPY_BYTES)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.bind(address)
        self._outbox: list[list] = []  # messages the test hands to the server's thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    # What a test (or on_calls) sends to the client.
    def reply(self, seq: int, result=None, code: int = 0, frames=(), deferred=0) -> None:
        self._queue([pack([seq, code, result, deferred, "", ""]), *frames])

    def notice(self, result=None, code: int = 0) -> None:
        self._queue([pack([0, code, result, 0, "", ""])])

    def _queue(self, message: list) -> None:
        with self._lock:
            self._outbox.append(message)

    def window(self, inode: int | None = None) -> list:
        """A grant of its device memory: the vgpuDeviceWindow answer."""
        info = os.fstat(self.window_fd)
        return [os.getpid(), self.window_fd, 1, inode or info.st_ino, BASE, info.st_size]

    def window_bytes(self, size: int) -> bytes:
        return os.pread(self.window_fd, size, 0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self.window_fd)
        if self.ring is not None:
            self.ring.close()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            with self._lock:
                pending, self._outbox = self._outbox, []
            for message in pending:
                self._socket.send_multipart([self.identity, *message])
            if poller.poll(5):
                identity, header, *frames = self._socket.recv_multipart()
                self.identity = identity
                kind, seq, body = unpack(header)
                self.kinds.append(kind)
                if kind == HELLO:
                    self._hello(seq, body)
                elif kind == CALLS:
                    self.calls.append((seq, body, frames))
                    (self.on_calls or FakeServer.answer)(self, seq, body, frames)
        self._socket.close(linger=0)
        self._context.term()

    def _hello(self, seq: int, body: dict) -> None:
        self.hellos.append(body)
        shm = self.shm and body["shm"] is not None
        if shm:
            # The client runs in this process: its descriptor is ours, open until we answer.
            fd = os.open(f"/proc/self/fd/{body['shm']['fd']}", os.O_RDWR)
            self.ring = mmap.mmap(fd, body["shm"]["size"])
            os.close(fd)
        self._socket.send_multipart([self.identity, pack([seq, 0, {
            "session": 1, "server_pid": self.pid, "host": socket.gethostname(),
            "backend": "fake", "shm": shm, "peer_memory": self.windows,
            "device_windows": self.windows, "device": DEVICE, "position": self.position,
        }, 0, "", ""])])

    def answer(self, seq: int, calls: list, frames: list) -> None:
        """What a server does: run the calls (here: answer the last) and reply if asked."""
        if not seq:
            return
        op, args = calls[-1]
        if op == "cuMemGetInfo":
            self.reply(seq, FREE_TOTAL)
        elif op == "vgpuDeviceWindow":
            self.reply(seq, self.window())
        else:
            self.reply(seq)


@pytest.fixture
def servers(tmp_path):
    made = []

    def make(name: str, **options) -> FakeServer:
        server = FakeServer(f"ipc://{tmp_path}/{name}.sock", **options)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture
def connections():
    made = []

    def connect(address: str, timeout: float = 3.0) -> Connection:
        made.append(Connection(address, timeout=timeout))
        return made[-1]

    yield connect
    for conn in made:
        conn.close()


def _buffer(size: int, seed: int) -> ctypes.Array:
    pattern = bytes((seed + i) % 251 for i in range(251))
    return ctypes.create_string_buffer((pattern * (size // 251 + 1))[:size], size)


def _until(condition, timeout: float = 2.0) -> bool:
    """Whether `condition()` holds within `timeout` (the fake servers record in a thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _redirect_on(op: str, address: str, position: int):
    """An on_calls that answers as usual, except that the message ending in `op` gets no
    answer: the session moves to `address`, where it covers `position` messages."""

    def on_calls(server: FakeServer, seq: int, calls: list, frames: list) -> None:
        if calls and calls[-1][0] == op:
            server.notice({"redirect": address, "position": position})
        else:
            server.answer(seq, calls, frames)

    return on_calls


def _ring_data(server: FakeServer, spec: list, size: int) -> bytes:
    assert spec[0] == "shm"
    return server.ring[spec[1]:spec[1] + size]


def test_a_redirect_resends_what_the_new_server_lacks_with_its_data_and_seqs(
        servers, connections):
    old, new = servers("old"), servers("new", position=1)
    old.on_calls = _redirect_on("cuMemGetInfo", new.address, 1)
    conn = connections(old.address)
    first, second = _buffer(64 << 10, 1), _buffer(64 << 10, 2)
    conn.post("cuMemAlloc", BASE, 1 << 20)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(first), len(first))
    conn.write_device("cuMemcpyHtoD", BASE + len(first), ctypes.addressof(second), len(second))

    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL  # answered by the new server

    assert new.hellos[0]["token"] == old.hellos[0]["token"]
    assert len(old.hellos[0]["token"]) == 32 and old.hellos[0]["resume"] is None
    assert new.hellos[0]["resume"] == {"position": 1}
    assert new.hellos[0]["version"] == PROTOCOL_VERSION
    # Messages 2 and 3, as first sent: the second copy (staged in the ring, now at the same
    # offset of the new ring) and the call waited for, under its seq.
    (seq2, calls2, _), (seq3, calls3, _) = new.calls
    assert [seq2, seq3] == [0, old.calls[2][0]] and seq3 != 0
    assert [c[0] for c in calls2] == ["cuMemcpyHtoD"] and calls2 == old.calls[1][1]
    assert _ring_data(new, calls2[0][1][1], len(second)) == second.raw
    assert calls3 == [["cuMemGetInfo", []]]
    move = conn.moves[-1]
    assert (move["why"], move["to"], move["resent"]) == ("redirect", new.address, 2)
    assert conn.address == new.address


def test_the_session_keeps_working_after_a_redirect(servers, connections):
    old, new = servers("old"), servers("new", position=1)
    old.on_calls = _redirect_on("vgpuSynchronize", new.address, 1)
    conn = connections(old.address)
    conn.post("cuMemAlloc", BASE, 1 << 20)
    conn.flush()
    conn.synchronize()
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL
    assert len(new.calls) == 2 and new.calls[0][0] == old.calls[1][0]


def test_a_redirect_to_a_server_without_shared_memory_sends_staged_data_in_frames(
        servers, connections):
    old, new = servers("old"), servers("remote", position=0, shm=False)
    old.on_calls = _redirect_on("cuMemGetInfo", new.address, 0)
    conn = connections(old.address)
    data = _buffer(CHUNK_BYTES + 100, 3)  # two chunks, both staged in the ring
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL
    sent = [(call, frames) for _, calls, frames in new.calls for call in calls]
    copies = [(args, frames) for (op, args), frames in sent if op == "cuMemcpyHtoD"]
    assert [args[1][0] for args, _ in copies] == ["frame", "frame"]
    assert b"".join(frames[args[1][1]] for args, frames in copies) == data.raw
    # Later copies go in frames too, queued with the next call: there is no ring any more.
    more = _buffer(64 << 10, 4)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(more), len(more))
    conn.synchronize()
    _, calls, frames = new.calls[-1]
    assert [op for op, _ in calls] == ["cuMemcpyHtoD", "vgpuSynchronize"]
    assert calls[0][1][1] == ["frame", 0] and frames[0] == more.raw


def test_a_copy_the_session_moves_in_the_middle_of_arrives_whole(servers, connections):
    # The ring fills up after eight chunks; the copy waits for the server to drain it, and
    # the session moves to a server on another host meanwhile: the rest goes in a frame.
    old, new = servers("old"), servers("remote", position=8, shm=False)
    old.on_calls = _redirect_on("vgpuSynchronize", new.address, 8)
    conn = connections(old.address)
    data = _buffer(9 * CHUNK_BYTES, 11)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    conn.synchronize()
    assert [c[0][0] for _, c, _ in old.calls] == ["cuMemcpyHtoD"] * 8 + ["vgpuSynchronize"]
    staged = b"".join(_ring_data(old, c[0][1][1], CHUNK_BYTES) for _, c, _ in old.calls[:8])
    assert [c[-1][0] for _, c, _ in new.calls] == [
        "vgpuSynchronize", "cuMemcpyHtoD", "vgpuSynchronize"]
    (op, args), = new.calls[1][1]
    assert op == "cuMemcpyHtoD" and args[0] == BASE + 8 * CHUNK_BYTES
    assert staged + new.calls[1][2][args[1][1]] == data.raw


def test_window_copies_are_released_uncounted_and_forgotten_after_a_move(
        servers, connections):
    old, new = servers("old", windows=True), servers("new", windows=True, position=1)
    conn = connections(old.address)
    data = _buffer(PEER_COPY_BYTES, 5)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    assert old.window_bytes(len(data)) == data.raw  # copied through the window
    # The window's release follows its grant at once, as its own kind of message.
    assert _until(lambda: old.kinds == [HELLO, CALLS, RELEASE])
    # The release has no position: the old server counted one message, and a redirect there
    # resends nothing before the call that meets it.
    old.on_calls = _redirect_on("cuMemGetInfo", new.address, 1)
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL
    assert [c[-1][0] for _, c, _ in new.calls] == ["cuMemGetInfo"]
    # The old server's window is forgotten: the next copy asks the new server for its own.
    data = _buffer(PEER_COPY_BYTES, 6)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    assert new.window_bytes(len(data)) == data.raw
    assert _until(lambda: new.kinds[-2:] == [CALLS, RELEASE])


def test_a_window_granted_but_not_used_is_released(servers, connections):
    server = servers("only", windows=True)
    conn = connections(server.address)
    data = _buffer(PEER_COPY_BYTES, 10)

    def grant(error=0, inode=None):
        def on_calls(server, seq, calls, frames):
            if calls[-1][0] == "vgpuDeviceWindow":
                server.reply(seq, server.window(inode), deferred=error)
            else:
                server.answer(seq, calls, frames)
        return on_calls

    # Earlier queued work failed: the copy fails with that error, and the grant goes back.
    server.on_calls = grant(error=[700, "an illegal address"])
    with pytest.raises(CudaError, match="an illegal address"):
        conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    assert _until(lambda: server.kinds == [HELLO, CALLS, RELEASE])
    # A window this process may not map (here: not the file the server means): the grant
    # goes back, and the server copies instead, straight from the application's buffer.
    server.on_calls = grant(inode=1)
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    assert _until(lambda: server.kinds[3:] == [CALLS, RELEASE, CALLS])
    (op, args), = server.calls[-1][1]
    assert op == "cuMemcpyHtoD" and args[1] == ["peer", ctypes.addressof(data)]


def test_a_session_with_pinned_memory_cannot_move(servers, connections):
    old, new = servers("old"), servers("new", position=1)
    old.on_calls = _redirect_on("cuMemGetInfo", new.address, 1)
    conn = connections(old.address)
    conn.call("vgpuMapHostSegment", 1, 3, 4096, 0x1000)  # the fake server maps nothing
    with pytest.raises(DeviceUnavailable, match="pinned host memory"):
        conn.call("cuMemGetInfo")
    assert not new.hellos


def _failover_session(servers, connections, standby_position: int):
    """A session on a server with a standby: four messages sent, the first covered by a
    checkpoint; the fifth waits when its server stops. Returns (old, standby, conn, the data
    of the second copy, what the waiting call raised or returned)."""
    old = servers("old", windows=True)  # it offers windows: a failover session uses none
    standby = servers("standby", position=standby_position)
    conn = connections(f"{old.address},{standby.address}")
    first, second = _buffer(64 << 10, 7), _buffer(CHUNK_BYTES + PEER_COPY_BYTES, 8)
    expected = second.raw
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(first), len(first))   # 1
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL                                # 2
    conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(second), len(second))  # 3, 4
    old.notice({"checkpointed": 1})
    first.raw = bytes(len(first))  # the application reuses its buffers
    second.raw = bytes(len(second))

    def stop(server, seq, calls, frames):
        server.notice(SHUTTING_DOWN, code=46)

    old.on_calls = stop
    try:
        outcome = conn.call("cuMemGetInfo")[0]                                       # 5
    except DeviceUnavailable as exc:
        outcome = exc
    return old, standby, conn, expected, outcome


def test_failover_replays_what_the_checkpoint_lacks_with_the_data_captured(
        servers, connections):
    old, standby, conn, second, outcome = _failover_session(servers, connections, 1)
    assert outcome == FREE_TOTAL
    assert [c[-1][0] for _, c, _ in old.calls] == [
        "cuMemcpyHtoD", "cuMemGetInfo", "cuMemcpyHtoD", "cuMemcpyHtoD", "cuMemGetInfo"]
    assert old.calls[0][1][0][1][1][0] == "shm"  # no window, no direct copy: the ring
    hello = standby.hellos[0]
    assert hello["token"] == old.hellos[0]["token"]
    assert hello["resume"] == {"position": 1}  # the checkpoint covers message 1
    # Message 2 was answered: its read-only call goes no more, but the message still counts,
    # and it says that what the program heard of ends there.
    # The copies carry their data as it was when sent; the call waited for keeps its seq.
    seqs = [seq for seq, _, _ in standby.calls]
    assert seqs == [0, 0, 0, old.calls[4][0]]
    assert standby.calls[0][1] == [["vgpuDiscardReported", []]]
    replayed = b""
    for _, calls, frames in standby.calls[1:3]:
        (op, args), = calls
        assert op == "cuMemcpyHtoD" and args[1][0] == "frame"
        replayed += frames[args[1][1]]
    assert replayed == second
    assert standby.calls[3][1] == [["cuMemGetInfo", []]]
    assert conn.moves[-1]["why"] == "failover"


def test_failover_says_so_once_on_stderr(servers, connections, capfd):
    _, standby, _, _, outcome = _failover_session(servers, connections, 1)
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert SHUTTING_DOWN in err and f"goes on at {standby.address}" in err


def test_failover_to_a_standby_without_the_checkpoint_is_device_unavailable(
        servers, connections):
    # A fresh session there (position 0) lacks message 1, which the client no longer holds.
    _, standby, conn, _, outcome = _failover_session(servers, connections, 0)
    assert isinstance(outcome, DeviceUnavailable)
    assert SHUTTING_DOWN in outcome.message
    assert "no standby server took the session over" in outcome.message
    assert f"{standby.address}: it resumed the session at message 0" in outcome.message
    assert not standby.calls
    with pytest.raises(DeviceUnavailable) as again:
        conn.call("cuMemGetInfo")
    assert again.value.message == outcome.message


def test_failover_when_the_server_process_is_gone(servers, connections):
    gone = subprocess.Popen(["true"])
    gone.wait()
    old, standby = servers("old", pid=gone.pid), servers("standby")
    old.on_calls = lambda *_: None  # it never answers: its process is gone
    conn = connections(f"{old.address},{standby.address}", timeout=30)
    started = time.monotonic()
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL
    assert time.monotonic() - started < 2  # no waiting for the timeout
    assert standby.hellos[0]["resume"] == {"position": 0}
    assert [seq for seq, _, _ in standby.calls] == [old.calls[0][0]]


def test_without_a_standby_a_stopping_server_is_device_unavailable(servers, connections):
    server = servers("only")
    server.on_calls = lambda server, seq, calls, frames: server.notice(SHUTTING_DOWN, 46)
    conn = connections(server.address)
    with pytest.raises(DeviceUnavailable) as lost:
        conn.call("cuMemGetInfo")
    assert lost.value.message == f"{SHUTTING_DOWN} ({server.address})"
    assert not conn.moves


def test_without_a_standby_a_silent_server_times_out(servers, connections):
    server = servers("silent")
    server.on_calls = lambda *_: None
    conn = connections(server.address, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(DeviceUnavailable, match="no answer from the vgpu server"):
        conn.call("cuMemGetInfo")
    assert time.monotonic() - started < 2


def test_a_session_whose_server_never_checkpoints_stops_retaining(
        servers, connections, monkeypatch, capfd):
    monkeypatch.setattr("vgpu.client.RETAIN_LIMIT_BYTES", 100 << 10)
    old, standby = servers("old"), servers("standby")
    conn = connections(f"{old.address},{standby.address}")
    data = _buffer(64 << 10, 9)
    for _ in range(2):
        conn.write_device("cuMemcpyHtoD", BASE, ctypes.addressof(data), len(data))
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert "awaits a checkpoint there" in err and f"not fail over to {standby.address}" in err
    old.on_calls = lambda server, seq, calls, frames: server.notice(SHUTTING_DOWN, 46)
    with pytest.raises(DeviceUnavailable) as lost:
        conn.call("cuMemGetInfo")
    assert lost.value.message == f"{SHUTTING_DOWN} ({old.address})"
    assert not standby.hellos


def _redirect_or_answer(redirect_op: str, address: str, position: int, delays: dict,
                        keepalive: bool = True):
    """An on_calls that redirects the message ending in `redirect_op` to `address` (where the
    session covers `position` messages) and answers the others, those ending in an op of
    `delays` after that many seconds (and, with `keepalive`, a keepalive notice at once)."""

    def on_calls(server: FakeServer, seq: int, calls: list, frames: list) -> None:
        op = calls[-1][0] if calls else None
        if op == redirect_op:
            server.notice({"redirect": address, "position": position})
        elif op in delays:
            if keepalive:
                server.notice()
            threading.Timer(delays[op], server.answer, (seq, calls, frames)).start()
        else:
            server.answer(seq, calls, frames)

    return on_calls


def test_replies_at_once_or_after_a_notice_keep_the_messages_positions(servers, connections):
    # Messages 1-2 answered at once, 3 after a keepalive, 4 never (queued work), 5
    # redirected: the new server covers 4, so message 5 alone goes again.
    old, new = servers("old"), servers("new", position=4)
    old.on_calls = _redirect_or_answer("cuCtxSynchronize", new.address, 4,
                                       {"cuMemGetInfo": 0.05})
    conn = connections(old.address)
    conn.call("vgpuSynchronize")
    conn.call("vgpuSynchronize")
    assert conn.call("cuMemGetInfo")[0] == FREE_TOTAL
    conn.post("cuMemAlloc", BASE, 1 << 20)
    conn.flush()
    conn.call("cuCtxSynchronize")
    assert [calls for _, calls, _ in new.calls] == [[["cuCtxSynchronize", []]]]
    assert new.calls[0][0] == old.calls[-1][0] != 0  # under its seq
    assert conn.moves[-1]["resent"] == 1


class _Interrupted(Exception):
    pass


def test_a_call_interrupted_while_it_waits_keeps_its_message_s_position(
        servers, connections):
    # A signal handler raises while message 1 waits for its reply: the application gets
    # the exception, the reply comes later and is passed over, and a redirect at message 2
    # resends message 3 alone (positions as the server counts them).
    old, new = servers("old"), servers("new", position=2)
    old.on_calls = _redirect_or_answer("cuCtxSynchronize", new.address, 2,
                                       {"cuMemGetInfo": 0.3}, keepalive=False)
    conn = connections(old.address)

    def interrupt(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)  # within the first receive
        with pytest.raises(_Interrupted):
            conn.call("cuMemGetInfo")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert conn.call("vgpuSynchronize")[0] is None  # after message 1's late reply
    conn.call("cuCtxSynchronize")
    assert [calls for _, calls, _ in new.calls] == [[["cuCtxSynchronize", []]]]
    assert conn.moves[-1]["resent"] == 1
