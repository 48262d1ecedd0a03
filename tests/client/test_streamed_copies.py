"""Large copies to and from a server without shared memory (one on another host, as the
client sees it: no staging ring) stream in chunks, and `vgpu ps` shows a copy under way."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import zmq
from vgpu_processes import ServerProcess, TcpForwarder, free_tcp_address, run_vgpu

import vgpu.client
from vgpu.client import STREAM_CHUNK_BYTES, Connection
from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, pack, unpack

CONTEXT = 0x7667_0100_0000_0001
MIB = 1 << 20


@pytest.fixture
def tcp_server():
    server = ServerProcess(free_tcp_address())
    yield server
    server.stop()


@pytest.fixture
def remote(monkeypatch):
    """Connections as from another host: no shared-memory staging ring."""
    def no_ring(size):
        raise OSError("no shared memory with a server on another host")

    monkeypatch.setattr(vgpu.client, "StagingRing", no_ring)


def test_large_copies_without_shared_memory_arrive_whole_and_in_place(tcp_server, remote):
    conn = Connection(tcp_server.address)
    assert conn.ring is None
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    size = 5 * STREAM_CHUNK_BYTES + 12345  # chunks, and a short last one
    address, _ = conn.call("cuMemAlloc", CONTEXT, size + 2 * 4096)
    guard = bytes(range(256)) * 16
    before, after = ((ctypes.c_char * 4096).from_buffer_copy(guard) for _ in range(2))
    original = os.urandom(size)
    data = (ctypes.c_char * size).from_buffer_copy(original)
    conn.write_device("cuMemcpyHtoD", address, ctypes.addressof(before), 4096)
    conn.write_device("cuMemcpyHtoD", address + 4096, ctypes.addressof(data), size)
    conn.write_device("cuMemcpyHtoD", address + 4096 + size, ctypes.addressof(after), 4096)
    ctypes.memset(data, 0, size)  # the buffer is the application's again once the copy returns
    back = (ctypes.c_char * (size + 2 * 4096))()
    conn.read_device("cuMemcpyDtoH", address, ctypes.addressof(back), size + 2 * 4096)
    assert bytes(back) == guard + original + guard
    conn.close()


def test_streamed_copies_survive_connections_cut_under_them(tcp_server, remote):
    port = int(tcp_server.address.rsplit(":", 1)[1])
    forwarder = TcpForwarder(("127.0.0.1", port))
    stop = threading.Event()

    def cut() -> None:
        while not stop.wait(0.05):
            forwarder.drop()

    cutter = threading.Thread(target=cut)
    try:
        conn = Connection(forwarder.address)
        conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
        size = 4 * STREAM_CHUNK_BYTES + 7
        address, _ = conn.call("cuMemAlloc", CONTEXT, size)
        cutter.start()
        for _ in range(6):
            original = os.urandom(size)
            data = (ctypes.c_char * size).from_buffer_copy(original)
            conn.write_device("cuMemcpyHtoD", address, ctypes.addressof(data), size)
            back = (ctypes.c_char * size)()
            conn.read_device("cuMemcpyDtoH", address, ctypes.addressof(back), size)
            assert bytes(back) == original
        stop.set()
        cutter.join()
        assert len(conn.moves) > 1, "no connection was cut under the copies"
        assert {move["why"] for move in conn.moves} == {"reconnect"}
        assert {move["to"] for move in conn.moves} == {forwarder.address}
        conn.close()
    finally:
        stop.set()
        forwarder.close()


def _request(sock, kind: str, seq: int, body, frames=()) -> list:
    sock.send_multipart([pack([kind, seq, body]), *frames])
    while True:
        assert sock.poll(10_000), "the server did not answer"
        reply = unpack(sock.recv_multipart()[0])
        if reply[0] == seq:
            return reply


def test_ps_shows_the_bytes_done_of_a_copy_under_way(tcp_server):
    context = zmq.Context.instance()
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(tcp_server.address)
    hello = {"version": PROTOCOL_VERSION, "pid": 1, "host": "another-host", "argv": ["copier"],
             "shm": None, "probe": None, "token": "ab" * 16, "resume": None}
    assert _request(client, HELLO, 1, hello)[1] == 0
    reply = _request(client, CALLS, 2, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                                        ["cuMemAlloc", [CONTEXT, 8 * MIB]]])
    assert reply[1] == 0, reply
    address = reply[2]
    # Two chunks of an 8 MiB copy have arrived; the rest is still on its way.
    for i in range(2):
        announce = [["vgpuTransfer", ["HtoD", 8 * MIB]]] if i == 0 else []
        client.send_multipart([pack([CALLS, 0, [
            *announce, ["cuMemcpyHtoD", [address + i * 2 * MIB, ["frame", 0], 2 * MIB]]]]),
            bytes(2 * MIB)])
    result = run_vgpu("ps", "--server", tcp_server.address)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "copier" in line)
    assert "HtoD 4.0 MiB/8.0 MiB" in row
    for i in range(2, 4):
        client.send_multipart([pack([CALLS, 0, [
            ["cuMemcpyHtoD", [address + i * 2 * MIB, ["frame", 0], 2 * MIB]]]]),
            bytes(2 * MIB)])
    reply = _request(client, CALLS, 3, [["vgpuSynchronize", []]])
    assert reply[1] == 0, reply
    row = next(line for line in run_vgpu("ps", "--server", tcp_server.address)
               .stdout.splitlines() if "copier" in line)
    assert "HtoD" not in row  # done
    client.close()
