"""A client's word about files and processes is not acted on: raw clients name files to map
and processes to read, and the server maps none of them, reads and writes no other process,
and serves the session through message frames instead."""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import subprocess
import sys

import pytest
import zmq

from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, pack, unpack

CONTEXT = 0x7667_0100_0000_0001
NOBODY = 65534
RING_BYTES = 1 << 20


class RawClient:
    """A client that speaks the wire protocol by hand, saying whatever it likes."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.seq = 0
        self.token = secrets.token_hex(16)

    def request(self, kind: str, body, frames=()) -> list:
        self.seq += 1
        self.sock.send_multipart([pack([kind, self.seq, body]), *frames])
        assert self.sock.poll(10_000), "the server did not answer"
        reply = self.sock.recv_multipart()
        header = unpack(reply[0])
        assert header[0] == self.seq
        return [*header[1:3], reply[1:]]

    def hello(self, **claims) -> dict:
        body = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
                "argv": ["raw"], "token": self.token, **claims}
        code, info, _ = self.request(HELLO, body)
        assert code == 0, info
        self.request(CALLS, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]]])
        return info

    def call(self, op: str, *args, frames=()) -> tuple[int, object, list]:
        return tuple(self.request(CALLS, [[op, list(args)]], frames))

    def round_trip_by_frames(self) -> bytes:
        """Copy bytes to the device and back in payload frames, as a client does without
        shared memory: the session works."""
        code, address, _ = self.call("cuMemAlloc", CONTEXT, 4096)
        assert code == 0
        data = secrets.token_bytes(4096)
        assert self.call("cuMemcpyHtoD", address, ["frame", 0], 4096, frames=[data])[0] == 0
        code, _, frames = self.call("cuMemcpyDtoH", address, 4096, ["frame"])
        assert code == 0 and frames == [data]
        return data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(server):
    clients = []

    def open_raw() -> RawClient:
        clients.append(RawClient(server.address))
        return clients[-1]

    yield open_raw
    for client in clients:
        client.close()


def _server_maps(server) -> str:
    with open(f"/proc/{server.proc.pid}/maps") as f:
        return f.read()


def _shm_file(name: str, size: int = RING_BYTES, mode: int = 0o600, owner: int | None = None,
              contents: bytes = b"") -> str:
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, contents)
    os.ftruncate(fd, size)
    os.fchmod(fd, mode)
    if owner is not None:
        os.fchown(fd, owner, -1)
    os.close(fd)
    return path


@pytest.fixture
def shm_files():
    made = []
    yield made
    for path in made:
        if os.path.lexists(path):
            os.unlink(path)


def _prefix(client: RawClient) -> str:
    return f"vgpu-{os.getpid()}-{client.token}-"


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file away needs root")


def _offered_files(kind: str, client: RawClient, tmp_path) -> tuple[str, str]:
    """(the path the client names, the file the server would map) for each kind of file a
    client must not get mapped."""
    name = f"{_prefix(client)}ring-x"
    if kind == "a file outside /dev/shm":
        target = tmp_path / "secret"
        target.write_bytes(bytes(RING_BYTES))
        target.chmod(0o600)
        return str(target), str(target)
    if kind == "a symlink to another file":
        target = tmp_path / "secret"
        target.write_bytes(bytes(RING_BYTES))
        target.chmod(0o600)
        os.symlink(target, f"/dev/shm/{name}")
        return f"/dev/shm/{name}", str(target)
    if kind == "another user's file":
        path = _shm_file(name, owner=NOBODY)
        return path, path
    if kind == "a file others may read":
        path = _shm_file(name, mode=0o644)
        return path, path
    if kind == "a file not named for the session":
        path = _shm_file(f"vgpu-{os.getpid()}-{secrets.token_hex(16)}-ring-x")
        return path, path
    if kind == "a file of another size":
        path = _shm_file(name, size=RING_BYTES // 2)
        return path, path
    raise AssertionError(kind)


BAD_FILES = ["a file outside /dev/shm", "a symlink to another file",
             pytest.param("another user's file", marks=needs_root), "a file others may read",
             "a file not named for the session", "a file of another size"]


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_hello_naming_a_file_not_made_for_the_session_gets_no_shared_memory(
        server, raw, shm_files, tmp_path, kind):
    client = raw()
    named, target = _offered_files(kind, client, tmp_path)
    shm_files.append(named)
    info = client.hello(shm={"path": named, "size": RING_BYTES})
    assert not info["shm"] and not info["peer_memory"]
    assert target not in _server_maps(server) and named not in _server_maps(server)
    client.round_trip_by_frames()


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_host_segment_naming_a_file_not_made_for_the_session_is_refused(
        server, raw, shm_files, tmp_path, kind):
    client = raw()
    ring = _shm_file(f"{_prefix(client)}ring-ok")
    shm_files.append(ring)
    assert client.hello(shm={"path": ring, "size": RING_BYTES})["shm"]
    named, target = _offered_files(kind, client, tmp_path)
    shm_files.append(named)
    code, message, _ = client.call("vgpuMapHostSegment", 1, named, RING_BYTES, None)
    assert code == 800  # CUDA_ERROR_NOT_PERMITTED
    assert "does not map that host memory" in message
    assert target not in _server_maps(server) and named not in _server_maps(server)
    client.round_trip_by_frames()


def test_over_tcp_nothing_is_shared_whatever_the_client_names(tmp_path, shm_files):
    from vgpu_processes import ServerProcess

    server = ServerProcess("tcp://127.0.0.1:*", "--insecure")
    try:
        client = RawClient(server.address)
        ring = _shm_file(f"{_prefix(client)}ring-ok")
        shm_files.append(ring)
        info = client.hello(shm={"path": ring, "size": RING_BYTES})
        assert not info["shm"] and not info["peer_memory"] and not info["device_windows"]
        assert client.call("vgpuMapHostSegment", 1, ring, RING_BYTES, None)[0] == 800
        assert ring not in _server_maps(server)
        client.round_trip_by_frames()
        client.close()
    finally:
        server.stop()


VICTIM = """
import ctypes, sys
secret = ctypes.create_string_buffer(b"victim's own bytes, not to be read", 64)
print(ctypes.addressof(secret), flush=True)
sys.stdin.read()
print(secret.raw.hex(), flush=True)
"""


def test_a_hello_naming_another_process_gets_none_of_its_memory(server, raw, shm_files):
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        address = int(victim.stdout.readline())
        client = raw()
        # Everything right but the pid: a ring named for the victim, and the victim's bytes
        # as the probe's (which would make the server copy from the victim's memory).
        ring = _shm_file(f"vgpu-{victim.pid}-{client.token}-ring-x")
        shm_files.append(ring)
        info = client.hello(pid=victim.pid, shm={"path": ring, "size": RING_BYTES},
                            probe=[address, b"victim's own bytes, not to be read"])
        assert not info["shm"] and not info["peer_memory"] and not info["device_windows"]
        assert ring not in _server_maps(server)
        code, device, _ = client.call("cuMemAlloc", CONTEXT, 64)
        data = b"x" * 64
        assert client.call("cuMemcpyHtoD", device, ["frame", 0], 64, frames=[data])[0] == 0
        code, message, _ = client.call("cuMemcpyDtoH", device, 64, ["peer", address])
        assert code == 1 and "direct client memory access is off" in message
        code, message, _ = client.call("cuMemcpyHtoD", device, ["peer", address], 64)
        assert code == 1 and "direct client memory access is off" in message
        code, _, frames = client.call("cuMemcpyDtoH", device, 64, ["frame"])
        assert frames == [data]  # nothing of the victim's came in
        client.round_trip_by_frames()
    finally:
        out, _ = victim.communicate("", timeout=10)
    expected = ctypes.create_string_buffer(b"victim's own bytes, not to be read", 64)
    assert out.strip() == expected.raw.hex()  # and nothing went out to it
