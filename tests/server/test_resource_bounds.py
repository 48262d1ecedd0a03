"""One message must not cost the server more than its client may have: every size a client
names or makes the server build is bounded, and passing a bound gets CUDA's error while the
server, and the client's session where it can, go on."""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct
from pathlib import Path

import pytest
import zmq
import zstandard
from vgpu_processes import ServerProcess, run_vgpu

from vgpu.client import Connection
from vgpu.errors import CudaError
from vgpu.fatbin import CONTAINER_MAGIC
from vgpu.protocol import BYE, CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.sealed_files import sealed_file
from vgpu.server.peers import Peer

CONTEXT = 0x7667_0100_0000_0001
MODULE, FUNCTION = 0x7667_0200_0000_0001, 0x7667_0300_0000_0001
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_INVALID_PTX = 218
CU_LIMIT_PRINTF_FIFO_SIZE = 1
SPIN_PTX = (Path(__file__).parent / "programs" / "spin.ptx").read_bytes()


def _open(address: str) -> Connection:
    conn = Connection(address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    return conn


def _raw(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def _exchange(sock: zmq.Socket, frames: list) -> list:
    sock.send_multipart(frames)
    assert sock.poll(10_000), "the server did not answer"
    return unpack(sock.recv_multipart()[0])


def _still_serves(address: str) -> None:
    conn = _open(address)
    address_, _ = conn.call("cuMemAlloc", CONTEXT, 4096)
    conn.post("cuMemFree", address_)
    conn.synchronize()
    conn.close()


# ----------------------------------------------------------------- the hello's probe

@pytest.mark.parametrize("expected", [1 << 36, b"x" * 4096, "a string"],
                         ids=["a size", "too many bytes", "not bytes"])
def test_a_hello_cannot_make_the_server_allocate_what_its_probe_names(server, expected):
    """The probe is bytes the client has at an address; a hello naming a size instead (a
    60-byte message once made the server allocate it) or too many bytes is no probe."""
    ring = sealed_file("vgpu-ring", mmap.PAGESIZE)  # a ring: only a client with one is probed
    hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
             "argv": ["probe"], "shm": {"fd": ring, "size": mmap.PAGESIZE},
             "probe": [id(expected), expected]}
    sock = _raw(server.address)
    reply = _exchange(sock, [pack([HELLO, 1, hello])])
    sock.close()
    os.close(ring)
    assert reply[1] == 0 and reply[2]["shm"] and reply[2]["peer_memory"] is False
    assert server.alive()
    _still_serves(server.address)


# ----------------------------------------------------------------- module images

def _fatbin(entry_payload: bytes, flags: int, stored: int, uncompressed: int) -> bytes:
    header = bytearray(0x40)
    padded = entry_payload.ljust((len(entry_payload) + 7) // 8 * 8, b"\0")
    struct.pack_into("<HHIQIIHHI", header, 0, 1, 0x0101, 0x40, len(padded), stored, 0, 0, 9,
                     75)
    struct.pack_into("<Q", header, 0x28, flags)
    struct.pack_into("<Q", header, 0x38, uncompressed)
    body = bytes(header) + padded
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(body)) + body


@pytest.mark.parametrize("declared", [4096, 1 << 40], ids=["lying", "huge"])
def test_a_compressed_fatbin_entry_cannot_unpack_to_gigabytes_in_the_server(server, declared):
    """zstd reaches 30,000:1: a few KiB would become GiB; unpacking stops at what the entry
    declares, and an entry declaring more than any real PTX is refused."""
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    image = _fatbin(bomb, 0x8011, len(bomb), declared)
    conn = _open(server.address)
    with pytest.raises(CudaError) as err:
        conn.call("cuModuleLoadData", MODULE, CONTEXT, conn.frame(image), len(image))
    assert err.value.code == CUDA_ERROR_NO_BINARY_FOR_GPU
    assert "unpacks to more than" in err.value.message or "unpacks at most" in \
        err.value.message
    conn.call("cuMemAlloc", CONTEXT, 4096)  # the session goes on
    conn.close()


def test_a_thread_may_not_use_more_local_memory_than_cuda_allows(server):
    """CUDA's 512 KiB per thread; the emulator holds local memory for every thread of a
    block at once, so a kernel asking 64 MiB a thread would need 64 GiB for 1024 of them."""
    ptx = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .entry greedy(.param .u32 n)
{
    .local .align 4 .b8 stack[%d];
    .reg .b32 %%r<2>;
    ld.param.u32 %%r1, [n];
    st.local.u32 [stack], %%r1;
    ret;
}
"""
    conn = _open(server.address)
    fits = ptx % (512 << 10)
    conn.call("cuModuleLoadData", MODULE, CONTEXT, ["inline", fits], len(fits))
    too_much = ptx % ((512 << 10) + 4)
    with pytest.raises(CudaError) as err:
        conn.call("cuModuleLoadData", MODULE + 1, CONTEXT, ["inline", too_much],
                  len(too_much))
    assert err.value.code == CUDA_ERROR_INVALID_PTX
    assert "uses too much local data (0x80004 bytes, 0x80000 max)" in err.value.message
    conn.close()


# ----------------------------------------------------------------- device printf

PRINTER = r"""
extern "C" __global__ void say(int width) { printf("%*d|\n", width, (int)threadIdx.x); }
"""


@pytest.fixture
def printer(server, toolkit):
    ptx = toolkit.ptx(PRINTER).encode()
    conn = _open(server.address)
    printed: list[str] = []
    conn.stdout_writer = printed.append
    conn.call("cuModuleLoadData", MODULE, CONTEXT, ["inline", ptx], len(ptx))
    conn.post("cuModuleGetFunction", FUNCTION, MODULE, "say")
    yield conn, printed
    conn.close()


def _say(conn: Connection, threads: int, width: int) -> None:
    conn.post("cuLaunchKernel", FUNCTION, 1, 1, 1, threads, 1, 1, 0, 0,
              width.to_bytes(4, "little", signed=True))


def test_printf_output_waiting_for_a_synchronization_is_bounded_by_the_fifo(printer):
    conn, printed = printer
    conn.call("cuCtxSetLimit", CU_LIMIT_PRINTF_FIFO_SIZE, 4096)
    conn.stderr_writer = lambda text: printed.append(f"stderr: {text}")
    for _ in range(64):  # 64 launches x 32 lines x 4 bytes of text: 8 KiB, twice the FIFO
        _say(conn, 32, 3)
    conn.synchronize()
    out = "".join(p for p in printed if not p.startswith("stderr"))
    assert 0 < len(out) <= 4096 and out.endswith("|\n")
    assert any("device printf output was dropped" in p for p in printed if
               p.startswith("stderr"))
    printed.clear()
    _say(conn, 32, 3)  # after a synchronization the FIFO is empty again
    conn.synchronize()
    assert "".join(printed) == "".join(f"{i:3d}|\n" for i in range(32))


def test_a_printf_field_width_cannot_make_gigabytes(printer):
    conn, printed = printer
    _say(conn, 1, 1 << 30)
    conn.synchronize()
    assert len("".join(printed)) <= 1 << 20


def test_a_printf_fifo_larger_than_the_sessions_memory_is_refused(printer):
    conn, _ = printer
    with pytest.raises(CudaError) as err:
        conn.call("cuCtxSetLimit", CU_LIMIT_PRINTF_FIFO_SIZE, 1 << 50)
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY


# ----------------------------------------------------------------- messages

@pytest.fixture
def small_messages(tmp_path):
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--max-message", "64K")
    yield srv
    srv.stop()


def test_a_message_larger_than_the_server_takes_is_dropped_with_its_connection(
        small_messages):
    address = small_messages.address
    sock = _raw(address)
    hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
             "argv": ["big"]}
    assert _exchange(sock, [pack([HELLO, 1, hello])])[1] == 0
    sock.send_multipart([pack([CALLS, 2, [["vgpuSynchronize", []]]]), b"\0" * (128 << 10)])
    assert not sock.poll(500), "a message over the limit was answered"
    sock.close()
    assert small_messages.alive()
    _still_serves(address)


def test_vgpus_client_refuses_to_send_what_the_server_would_not_take(small_messages):
    conn = _open(small_messages.address)
    target, _ = conn.call("cuMemAlloc", CONTEXT, 128 << 10)
    with pytest.raises(CudaError) as err:
        conn.call("cuMemcpyHtoD", target, conn.frame(b"\0" * (128 << 10)), 128 << 10)
    assert err.value.code == CUDA_ERROR_INVALID_VALUE
    assert f"is more than the vgpu server at {small_messages.address} accepts (65536)" in \
        err.value.message
    conn.call("cuMemcpyHtoD", target, conn.frame(b"\1" * (32 << 10)), 32 << 10)
    conn.close()


def test_bytes_queued_behind_a_running_kernel_are_bounded(small_messages):
    """A session may have two largest messages' worth of calls waiting; a batch past that is
    refused with CUDA_ERROR_OUT_OF_MEMORY, and the session is not closed for it."""
    sock = _raw(small_messages.address)
    hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
             "argv": ["queue"]}
    assert _exchange(sock, [pack([HELLO, 1, hello])])[1] == 0
    reply = _exchange(sock, [pack([CALLS, 2, [
        ["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
        ["cuModuleLoadData", [MODULE, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX)]],
        ["cuModuleGetFunction", [FUNCTION, MODULE, "spin"]],
        ["cuMemAlloc", [CONTEXT, 60 << 10]]]])])
    assert reply[1] == 0
    target = reply[2]
    sock.send_multipart([pack([CALLS, 0, [["cuLaunchKernel", [FUNCTION, 1, 1, 1, 1, 1, 1, 0,
                                                              0, b"\xff\xff\xff\xff"]]]])])
    copy = [pack([CALLS, 0, [["cuMemcpyHtoD", [target, ["frame", 0], 60 << 10]]]]),
            b"\2" * (60 << 10)]
    sock.send_multipart(copy)  # waits behind the kernel
    sock.send_multipart(copy)  # and so does this: 120 KiB and two headers
    sock.send_multipart([pack([CALLS, 900, [["cuMemcpyHtoD", [target, ["frame", 0],
                                                              60 << 10]]]]),
                         b"\3" * (60 << 10)])
    while True:  # the answer to 900 (keepalives, seq 0, may come before it)
        assert sock.poll(10_000), "the refused batch was not answered"
        reply = unpack(sock.recv_multipart()[0])
        if reply[0] == 900:
            break
    assert reply[1] == CUDA_ERROR_OUT_OF_MEMORY
    assert "bytes of calls waiting to run; the server holds at most 131072" in reply[2]
    sock.send(pack([BYE, 0, None]))  # ends the kernel with the session
    sock.close()
    assert small_messages.alive()
    _still_serves(small_messages.address)


@pytest.mark.parametrize(("size", "why"), [("lots", "'lots' is not a size"),
                                           ("0", "'0' is no room at all")])
def test_sizes_in_options_are_checked_when_the_server_starts(tmp_path, size, why):
    done = run_vgpu("server", "--listen", f"ipc://{tmp_path}/server.sock", "--backend", "emu",
                    "--mem-limit", size, timeout=60)
    assert done.returncode == 2 and f"--mem-limit: {why}" in done.stderr


def test_a_large_copy_without_shared_memory_goes_in_messages_the_server_takes(tmp_path):
    """A recorded session has no staging ring: its copies travel in messages, each within
    the server's limit however large the copy."""
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--max-message", "64K",
                        "--record", str(tmp_path / "trace"))
    try:
        conn = _open(srv.address)
        assert conn.ring is None
        size = 1 << 20
        target, _ = conn.call("cuMemAlloc", CONTEXT, size)
        data = bytes(range(256)) * (size // 256)
        conn.write_device("cuMemcpyHtoD", target, ctypes.cast(data, ctypes.c_void_p).value,
                          size)
        back = ctypes.create_string_buffer(size)
        conn.read_device("cuMemcpyDtoH", target, ctypes.addressof(back), size)
        assert back.raw == data
        conn.close()
    finally:
        srv.stop()


# ----------------------------------------------------------------- objects a session holds

def _in_process_session():
    """A session in this process, with a context, as this process's own verified local
    client (only such a one's files are mapped)."""
    from vgpu.server.arena import VaArena
    from vgpu.server.backends.emu import EmuBackend
    from vgpu.server.session import Session

    me = Peer("ipc", uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), name="me")
    session = Session(1, {"pid": os.getpid(), "token": "5e" * 16}, EmuBackend(),
                      VaArena(1 << 44, 1 << 40), peer=me)
    session.primary_ctx_retain(CONTEXT, 0)
    return session


def test_a_session_holds_a_bounded_number_of_allocations_objects_and_host_buffers(monkeypatch):
    """Each costs the server bookkeeping that no device quota counts: past the bound (a
    million of a kind; three here) creating one fails with CUDA_ERROR_OUT_OF_MEMORY."""
    from vgpu.server import handles as handles_module
    from vgpu.server import session as session_module

    monkeypatch.setattr(session_module, "MAX_ALLOCATIONS", 3)
    monkeypatch.setattr(handles_module, "MAX_HANDLES", 3)
    monkeypatch.setattr(session_module, "MAX_SEGMENTS", 3)
    session = _in_process_session()
    allocations = [session.mem_alloc(CONTEXT, 16) for _ in range(3)]
    for handle in (11, 12, 13):
        session.event_create(handle, CONTEXT, 0)
    segment = sealed_file("vgpu-host", mmap.PAGESIZE)
    for seg_id in (1, 2, 3):
        session.map_host_segment(seg_id, segment, mmap.PAGESIZE, None)
    for create in (lambda: session.mem_alloc(CONTEXT, 16),
                   lambda: session.event_create(14, CONTEXT, 0),
                   lambda: session.map_host_segment(4, segment, mmap.PAGESIZE, None)):
        with pytest.raises(CudaError) as err:
            create()
        assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
        assert "the most a session may" in err.value.message
    session.mem_free(allocations[0])
    session.event_destroy(11)
    session.unmap_host_segment(1)
    session.mem_alloc(CONTEXT, 16)
    session.event_create(14, CONTEXT, 0)
    session.map_host_segment(4, segment, mmap.PAGESIZE, None)
    session.close()
    os.close(segment)


def test_a_module_image_is_bounded_in_size(monkeypatch):
    """Parsing holds several times an image's size: the server loads images up to the size
    of the largest PTX real programs have (256 MiB; 100 bytes here)."""
    from vgpu.server import session as session_module

    monkeypatch.setattr(session_module, "MAX_MODULE_BYTES", 100)
    session = _in_process_session()
    image = b".version 9.0\n.target sm_75\n.address_size 64\n" + b" " * 60
    with pytest.raises(CudaError) as err:
        session.module_load(MODULE, CONTEXT, ["inline", image], len(image))
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
    assert "is more than the server loads (100)" in err.value.message
    image = image.rstrip()
    session.module_load(MODULE, CONTEXT, ["inline", image], len(image))
    session.close()
