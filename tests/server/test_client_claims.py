"""A client's word about files and processes is not acted on: raw clients offer files to map
and name processes to read, and the server maps only their own files sealed at their size,
reads and writes no other process, and serves the session through message frames instead."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import secrets
import socket
import subprocess
import sys

import pytest
import zmq

from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.registry import ask_sessions
from vgpu.sealed_files import sealed_file

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


SEALED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class Files:
    """Files this test process holds open for the server to be offered, by descriptor."""

    def __init__(self):
        self.fds: list[int] = []

    def memory(self, size: int = RING_BYTES, seals: int = SEALED,
               owner: int | None = None) -> tuple[int, str]:
        """(descriptor, name) of a new memory file; a vgpu client's is `sealed_file`'s."""
        name = f"vgpu-test-{secrets.token_hex(4)}"
        fd = self.keep(os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        os.ftruncate(fd, size)
        if owner is not None:
            os.fchown(fd, owner, -1)
        if seals:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd, name

    def ring(self) -> int:
        """A staging ring as a vgpu client makes it."""
        return self.keep(sealed_file("vgpu-ring", RING_BYTES))

    def keep(self, fd: int) -> int:
        self.fds.append(fd)
        return fd


@pytest.fixture
def files():
    held = Files()
    yield held
    for fd in held.fds:
        os.close(fd)


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file away needs root")


def _offered_file(kind: str, files: Files, tmp_path) -> tuple[int, str]:
    """(the descriptor the client names, what the server's maps would show of its file) for
    each kind of file a client must not get mapped."""
    if kind == "a memory file not sealed":
        return files.memory(seals=0)
    if kind == "a memory file sealed against growing only":
        return files.memory(seals=fcntl.F_SEAL_GROW)
    if kind == "a /dev/shm file":  # what clients offered before files were sealed
        path = f"/dev/shm/vgpu-test-{secrets.token_hex(4)}"
        fd = files.keep(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(path)
        os.ftruncate(fd, RING_BYTES)
        return fd, path
    if kind == "a file on disk":
        secret = tmp_path / "secret"
        secret.write_bytes(bytes(RING_BYTES))
        return files.keep(os.open(secret, os.O_RDONLY)), str(secret)
    if kind == "a pipe":
        reader, writer = os.pipe()
        files.keep(writer)
        return files.keep(reader), "pipe:"
    if kind == "another user's file":
        return files.memory(owner=NOBODY)
    if kind == "a file of another size":
        return files.memory(size=RING_BYTES // 2)
    if kind == "a descriptor the client does not hold":
        return 1 << 20, "vgpu-test-"
    raise AssertionError(kind)


BAD_FILES = ["a memory file not sealed", "a memory file sealed against growing only",
             "a /dev/shm file", "a file on disk", "a pipe",
             pytest.param("another user's file", marks=needs_root), "a file of another size",
             "a descriptor the client does not hold"]


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_hello_offering_a_file_not_made_for_the_session_gets_no_shared_memory(
        server, raw, files, tmp_path, kind):
    client = raw()
    fd, shown = _offered_file(kind, files, tmp_path)
    info = client.hello(shm={"fd": fd, "size": RING_BYTES})
    assert not info["shm"] and not info["peer_memory"]
    assert shown not in _server_maps(server)
    client.round_trip_by_frames()


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_host_segment_offering_a_file_not_made_for_the_session_is_refused(
        server, raw, files, tmp_path, kind):
    client = raw()
    assert client.hello(shm={"fd": files.ring(), "size": RING_BYTES})["shm"]
    fd, shown = _offered_file(kind, files, tmp_path)
    code, message, _ = client.call("vgpuMapHostSegment", 1, fd, RING_BYTES, None)
    assert code == 800  # CUDA_ERROR_NOT_PERMITTED
    assert "does not map that host memory" in message
    assert shown not in _server_maps(server)
    client.round_trip_by_frames()


def test_a_host_segment_that_could_shrink_is_refused_saying_so(server, raw, files):
    client = raw()
    assert client.hello(shm={"fd": files.ring(), "size": RING_BYTES})["shm"]
    fd, _ = files.memory(seals=0)
    code, message, _ = client.call("vgpuMapHostSegment", 1, fd, RING_BYTES, None)
    assert code == 800 and "not sealed against shrinking" in message


def test_a_client_cannot_shrink_its_ring_under_the_server(server, raw, files):
    """Shrinking a file the server maps would make its next access SIGBUS, ending every
    session: the ring cannot shrink, and a file that could is never mapped."""
    client = raw()
    ring = files.ring()
    assert client.hello(shm={"fd": ring, "size": RING_BYTES})["shm"]
    with pytest.raises(PermissionError):
        os.ftruncate(ring, 0)
    code, address, _ = client.call("cuMemAlloc", CONTEXT, 4096)
    data = secrets.token_bytes(4096)
    os.pwrite(ring, data, 0)
    assert client.call("cuMemcpyHtoD", address, ["shm", 0], 4096)[0] == 0
    code, _, frames = client.call("cuMemcpyDtoH", address, 4096, ["frame"])
    assert code == 0 and frames == [data]

    other = raw()
    shrinkable, _ = files.memory(seals=0)
    assert not other.hello(shm={"fd": shrinkable, "size": RING_BYTES})["shm"]
    os.ftruncate(shrinkable, 0)
    code, elsewhere, _ = other.call("cuMemAlloc", CONTEXT, 4096)
    code, message, _ = other.call("cuMemcpyHtoD", elsewhere, ["shm", 0], 4096)
    assert code != 0 and server.proc.poll() is None
    other.round_trip_by_frames()
    assert client.call("cuMemcpyHtoD", address, ["shm", 0], 4096)[0] == 0


def test_over_tcp_nothing_is_shared_whatever_the_client_offers(files):
    from vgpu_processes import ServerProcess

    server = ServerProcess("tcp://127.0.0.1:*", "--insecure")
    try:
        client = RawClient(server.address)
        ring = files.ring()
        info = client.hello(shm={"fd": ring, "size": RING_BYTES})
        assert not info["shm"] and not info["peer_memory"] and not info["device_windows"]
        assert client.call("vgpuMapHostSegment", 1, ring, RING_BYTES, None)[0] == 800
        assert "vgpu-ring" not in _server_maps(server)
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


def test_a_hello_naming_another_process_gets_none_of_its_memory(server, raw, files):
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        address = int(victim.stdout.readline())
        client = raw()
        # Everything right but the pid: a ring, and the victim's bytes as the probe's (which
        # would make the server copy from the victim's memory, and map the victim's file of
        # that descriptor number).
        info = client.hello(pid=victim.pid, shm={"fd": files.ring(), "size": RING_BYTES},
                            probe=[address, b"victim's own bytes, not to be read"])
        assert not info["shm"] and not info["peer_memory"] and not info["device_windows"]
        assert "vgpu-ring" not in _server_maps(server)
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


@pytest.fixture(params=["emu", "cuda"])
def any_backend(request):
    """The address of an emu server of the test's own, or of the shared nested cuda one."""
    if request.param == "emu":
        return request.getfixturevalue("server").address
    return request.getfixturevalue("nested_cuda")


def test_host_segments_serve_copies_and_kernels_at_the_clients_addresses(any_backend, files):
    """Pinned memory shown at the client's address: copies reach it, and kernels too (the
    reply says so: None); a second one overlapping it is refused; one at an address the
    server's process cannot take still serves copies, and a backend whose kernels need the
    host's addresses says why they do not reach it."""
    client = RawClient(any_backend)
    assert client.hello(shm={"fd": files.ring(), "size": RING_BYTES})["shm"]
    fd = files.keep(sealed_file("vgpu-host", 8192))
    mapping = mmap.mmap(fd, 8192)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))  # no export is kept
    try:
        code, unreached, _ = client.call("vgpuMapHostSegment", 1, fd, 8192, address)
        assert (code, unreached) == (0, None)
        code, device, _ = client.call("cuMemAlloc", CONTEXT, 4096)
        data = secrets.token_bytes(4096)
        mapping[:4096] = data
        assert client.call("cuMemcpyDtoD", device, address, 4096)[0] == 0
        assert client.call("cuMemcpyDtoD", address + 4096, device, 4096)[0] == 0
        assert mapping[4096:] == data
        code, message, _ = client.call("vgpuMapHostSegment", 2, fd, 8192, address + 4096)
        assert code == 1 and "overlaps" in message

        code, message, _ = client.call("vgpuMapHostSegment", 4, fd, 8192, 1 << 60)
        assert code == 1 and "not a range" in message
        # What the process that drives the device holds: the session's device process on
        # cuda (a process per session), the server's own on emu.
        holder = _device_process(any_backend) or _server_pid(any_backend)
        nowhere = _first_mapping(holder)
        code, unreached, _ = client.call("vgpuMapHostSegment", 3, fd, 8192, nowhere)
        assert code == 0
        assert (unreached is None) == (any_backend.endswith("/server.sock"))
        if unreached is not None:
            assert "is not free in the session's device process" in unreached
        assert client.call("cuMemcpyDtoD", device, nowhere + 100, 8)[0] == 0
        code, _, frames = client.call("cuMemcpyDtoH", device, 8, ["frame"])
        assert frames == [data[100:108]]
        for segment in (1, 3):
            assert client.call("vgpuUnmapHostSegment", segment)[0] == 0
    finally:
        client.close()
        mapping.close()


def _server_pid(address: str) -> int:
    """The pid of the `vgpu server` listening at `address`."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:  # not a process, or one gone meanwhile
            continue
        if args[1:4] == ["-m", "vgpu.cli", "server"] and address in args:
            return int(entry)
    raise AssertionError(f"no vgpu server listens at {address}")


def _device_process(address: str) -> int | None:
    """The pid of this process's session's device process at the server at `address`, if it
    has one."""
    (session,) = [s for s in ask_sessions(address, timeout_s=10) if s["pid"] == os.getpid()]
    return session.get("device_pid")


def _first_mapping(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as maps:
        return int(maps.readline().split("-")[0], 16)
