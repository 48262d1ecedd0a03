"""A client whose connection dropped comes back on a new one, with its session token: the
server rebinds the live session, says how many of the client's messages it received (the
client resends only the others: none runs twice), sends again the replies the client still
waits for, and ignores what the old connection still delivers. A session whose connection
dropped for longer than the grace period ends."""

from __future__ import annotations

import time

import pytest
import zmq
from vgpu_processes import ServerProcess, free_tcp_address

from vgpu.protocol import ADMIN, CALLS, HELLO, PROTOCOL_VERSION, pack, unpack

CONTEXT = 0x7667_0100_0000_0001
TOKEN = "5e" * 16


@pytest.fixture
def server():
    """A server on TCP, the kind of connection that drops while both ends live."""
    srv = ServerProcess(free_tcp_address(), "--reconnect-grace", "1")
    yield srv
    srv.stop()


class Client:
    """A raw protocol client on a connection of its own."""

    def __init__(self, address: str):
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)

    def send(self, kind: str, seq: int, body, frames=()) -> None:
        self.socket.send_multipart([pack([kind, seq, body]), *frames])

    def reply(self, seq: int) -> list:
        """The reply to `seq` (keepalives skipped), with its payload frames."""
        while True:
            assert self.socket.poll(10_000), f"no reply to {seq}"
            frames = self.socket.recv_multipart()
            reply = unpack(frames[0])
            if reply[0] == seq:
                return [*reply, frames[1:]]
            assert reply[0] == 0, f"reply to {reply[0]} while waiting for {seq}"

    def hello(self, seq: int, resume=None) -> dict:
        self.send(HELLO, seq, {"version": PROTOCOL_VERSION, "pid": 1, "host": "elsewhere",
                               "argv": ["resumed"], "shm": None, "probe": None,
                               "token": TOKEN, "resume": resume})
        reply = self.reply(seq)
        assert reply[1] == 0, reply
        return reply[2]

    def open_session(self) -> int:
        """Hello (seq 1), then a context and a 4 KiB allocation (seq 2): its address."""
        self.hello(1)
        self.send(CALLS, 2, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                             ["cuMemAlloc", [CONTEXT, 4096]]])
        code, pointer = self.reply(2)[1:3]
        assert code == 0, pointer
        return pointer

    def close(self) -> None:
        self.socket.close()


def sessions(address: str) -> list[dict]:
    admin = Client(address)
    admin.send(ADMIN, 1, ["ps", []])
    listed = admin.reply(1)[2]
    admin.close()
    return listed


def test_a_client_back_on_a_new_connection_finds_its_session_and_lost_replies(server):
    first = Client(server.address)
    pointer = first.open_session()
    first.send(CALLS, 0, [["vgpuMemset", [pointer, b"\x07", 4096]]])
    first.send(CALLS, 3, [["cuMemcpyDtoH", [pointer, 16, ["frame"]]]])
    time.sleep(0.5)  # answered; but the connection "drops" before the client reads it
    first.close()

    second = Client(server.address)
    info = second.hello(4, resume={"position": 1, "waiting": [3]})
    assert info["position"] == 3  # every message arrived: nothing to resend
    code, _, _, _, _, frames = second.reply(3)[1:]
    assert code == 0 and frames == [bytes([7]) * 16]  # the lost reply, sent again
    second.send(CALLS, 5, [["cuMemAlloc", [CONTEXT, 4096]]])
    assert second.reply(5)[1] == 0
    [session] = sessions(server.address)
    assert session["memory"] == 2 * 4096 and session["command"] == "resumed"
    second.close()


def test_what_the_old_connection_still_delivers_is_not_run(server):
    old = Client(server.address)
    old.open_session()
    new = Client(server.address)
    assert new.hello(3, resume={"position": 1, "waiting": []})["position"] == 1
    old.send(CALLS, 4, [["cuMemAlloc", [CONTEXT, 4096]]])  # late, from the dead connection
    assert old.reply(4)[1] == 46  # that connection has no session any more
    new.send(CALLS, 5, [["cuMemGetInfo", []]])
    assert new.reply(5)[1] == 0
    assert [s["memory"] for s in sessions(server.address)] == [4096]
    old.close()
    new.close()


def test_a_session_whose_connection_dropped_ends_after_the_grace_period(server):
    client = Client(server.address)
    client.open_session()
    client.close()  # and never comes back (its pid, 1, is no process of this client's)
    assert len(sessions(server.address)) == 1  # within its grace
    deadline = time.monotonic() + 10
    while sessions(server.address):
        assert time.monotonic() < deadline, "the session outlived its grace period"
        time.sleep(0.2)
