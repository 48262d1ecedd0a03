"""Device-memory quotas: a session's own limit (`vgpu server --mem-limit`), its key's, and
what the server's sessions may hold together. Past one, an allocation fails with
CUDA_ERROR_OUT_OF_MEMORY and the session goes on; cuMemGetInfo shows the session's view."""

from __future__ import annotations

import hashlib
import time

import pytest
from vgpu_processes import ServerProcess

from vgpu.client import Connection
from vgpu.errors import CudaError
from vgpu.server.peers import Peer, parse_size
from vgpu.server.quotas import MemoryQuotas

CONTEXT = 0x7667_0100_0000_0001
MODULE = 0x7667_0200_0000_0001
MEMORY = 0x7667_0a00_0000_0001
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_INVALID_HANDLE = 400
KIB = 1 << 10

# A module whose one variable takes 2 MiB of device memory: 150 bytes of PTX.
BIG_VARIABLE_PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .global .align 4 .b8 big[2097152];
"""


@pytest.fixture
def limited(tmp_path):
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--mem-limit", "1M",
                        "--server-mem-limit", "1536K")
    yield srv
    srv.stop()


def _open(address: str) -> Connection:
    conn = Connection(address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    return conn


def _out_of_memory(conn: Connection, *call) -> str:
    with pytest.raises(CudaError) as err:
        conn.call(*call)
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
    return err.value.message


def test_a_session_allocates_up_to_its_limit_and_goes_on_after_running_out(limited):
    conn = _open(limited.address)
    assert conn.call("cuMemGetInfo")[0] == [1 << 20, 1 << 20]
    first, _ = conn.call("cuMemAlloc", CONTEXT, 768 * KIB)
    assert conn.call("cuMemGetInfo")[0] == [256 * KIB, 1 << 20]
    assert "session's limit of 1 MiB" in _out_of_memory(conn, "cuMemAlloc", CONTEXT, 512 * KIB)
    second, _ = conn.call("cuMemAlloc", CONTEXT, 256 * KIB)  # what is left still works
    conn.post("cuMemFree", first)
    third, _ = conn.call("cuMemAlloc", CONTEXT, 512 * KIB)  # what was freed is back
    conn.call("vgpuMemset", third, b"\x07", 512 * KIB)
    assert conn.call("vgpuSynchronize")[0] is None
    assert conn.call("cuMemGetInfo")[0] == [256 * KIB, 1 << 20]
    conn.close()
    assert limited.alive()


def test_module_variables_are_device_memory_the_limit_counts(limited):
    conn = _open(limited.address)
    _out_of_memory(conn, "cuModuleLoadData", MODULE, CONTEXT, ["inline", BIG_VARIABLE_PTX],
                   len(BIG_VARIABLE_PTX))
    assert conn.call("cuMemGetInfo")[0] == [1 << 20, 1 << 20], "nothing of it stays"
    two = BIG_VARIABLE_PTX.replace(b"2097152", b"524288") + \
        b".visible .global .align 4 .b8 more[786432];\n"
    _out_of_memory(conn, "cuModuleLoadData", MODULE, CONTEXT, ["inline", two], len(two))
    whole, _ = conn.call("cuMemAlloc", CONTEXT, 1 << 20)  # where the first one was placed
    conn.post("cuMemFree", whole)
    small = BIG_VARIABLE_PTX.replace(b"2097152", b"262144")
    conn.call("cuModuleLoadData", MODULE, CONTEXT, ["inline", small], len(small))
    # The variable, and the module's code (its image, in 512-byte granules) as on a GPU.
    assert conn.call("cuMemGetInfo")[0] == [768 * KIB - 512, 1 << 20]
    with pytest.raises(CudaError) as err:  # a handle in use: nothing is loaded or charged
        conn.call("cuModuleLoadData", MODULE, CONTEXT, ["inline", small], len(small))
    assert err.value.code == CUDA_ERROR_INVALID_HANDLE
    assert conn.call("cuMemGetInfo")[0] == [768 * KIB - 512, 1 << 20]
    conn.post("cuModuleUnload", MODULE)
    assert conn.call("cuMemGetInfo")[0] == [1 << 20, 1 << 20]
    conn.close()


def test_sessions_share_the_servers_memory_without_seeing_each_others_use(limited):
    a, b = _open(limited.address), _open(limited.address)
    held, _ = a.call("cuMemAlloc", CONTEXT, 1 << 20)
    assert b.call("cuMemGetInfo")[0] == [1 << 20, 1 << 20]
    message = _out_of_memory(b, "cuMemAlloc", CONTEXT, 768 * KIB)
    assert "1.5 MiB this server's sessions may hold together" in message
    b.call("cuMemAlloc", CONTEXT, 512 * KIB)
    a.post("cuMemFree", held)
    a.call("vgpuSynchronize")
    assert b.call("cuMemGetInfo")[0] == [512 * KIB, 1 << 20]
    b.call("cuMemAlloc", CONTEXT, 512 * KIB)
    a.close()
    b.close()


def test_a_closed_sessions_memory_goes_back_to_the_others(limited):
    a, b = _open(limited.address), _open(limited.address)
    a.call("cuMemAlloc", CONTEXT, 1 << 20)
    a.close()
    # Its worker releases the session after the goodbye, on a thread of its own.
    deadline = time.monotonic() + 10
    while True:
        try:
            b.call("cuMemAlloc", CONTEXT, 1 << 20)
            break
        except CudaError as exc:
            assert exc.code == CUDA_ERROR_OUT_OF_MEMORY
            assert time.monotonic() < deadline, "the closed session's memory never came back"
            time.sleep(0.01)
    b.close()


def test_queued_allocations_past_the_limit_fail_at_the_next_synchronization(limited):
    conn = _open(limited.address)
    conn.post("cuMemAlloc", CONTEXT, 768 * KIB)
    conn.post("cuMemAlloc", CONTEXT, 768 * KIB)
    with pytest.raises(CudaError) as err:
        conn.synchronize()
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
    assert conn.call("cuMemGetInfo")[0] == [256 * KIB, 1 << 20]
    conn.close()


def test_a_keys_limit_is_shared_by_its_sessions_and_each_session_has_its_own():
    quotas = MemoryQuotas(total=8 << 20, session_limit=3 << 20)
    alice = Peer("curve", key="A" * 40, name="key alice", options={"mem-limit": "4M"})
    first, second = quotas.account(alice), quotas.account(alice)
    other = quotas.account(Peer("curve", key="B" * 40, name="key bob"))
    first.charge(3 << 20)
    with pytest.raises(CudaError, match="session's limit of 3 MiB") as err:
        first.charge(1)
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
    assert second.info() == (1 << 20, 3 << 20)
    with pytest.raises(CudaError, match="limit of 4 MiB for key alice"):
        second.charge(2 << 20)
    other.charge(3 << 20)  # another key: the server's total counts, unseen by others
    assert other.info() == (0, 3 << 20)
    third = quotas.account(Peer("curve", key="C" * 40, name="key carol"))
    assert third.info() == (3 << 20, 3 << 20)
    with pytest.raises(CudaError, match="8 MiB this server's sessions may hold together"):
        third.charge(3 << 20)
    first.release_all()
    second.charge(2 << 20)
    assert quotas.used == 5 << 20 and quotas.key_used == {"key alice": 2 << 20,
                                                          "key bob": 3 << 20}


def test_a_keys_sessions_option_bounds_its_open_sessions(tmp_path):
    from vgpu.server.server import ProxyServer

    server = ProxyServer(f"ipc://{tmp_path}/server.sock", "emu")
    try:
        peer = Peer("curve", key="A" * 40, name="key alice", options={"sessions": 1})
        session, slot = server._new_session({}, None, peer=peer)
        server.sessions[b"one"] = session
        with pytest.raises(CudaError, match="key alice may have 1 session") as err:
            server._new_session({}, None, peer=peer)
        assert err.value.code == CUDA_ERROR_DEVICE_UNAVAILABLE
        other, _ = server._new_session({}, None, peer=Peer("curve", key="B" * 40, name="key bob"))
        for s in (session, other):
            s.close()
    finally:
        server.sessions.clear()
        server.close()


@pytest.mark.parametrize(("text", "size"), [("512M", 512 << 20), ("4G", 4 << 30),
                                            ("1536K", 1536 << 10), ("4096", 4096)])
def test_sizes_read_as_powers_of_1024(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1M", "1.5G", "4X", "G"])
def test_a_size_that_is_none_is_refused(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_a_suspended_session_whose_memory_was_taken_resumes_once_it_is_free(tmp_path):
    from vgpu.admin import AdminError, request

    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--server-mem-limit", "1M")
    try:
        a, b = _open(srv.address), _open(srv.address)
        a.call("cuMemAlloc", CONTEXT, 256 * KIB)  # restored first, then the one that fails
        held, _ = a.call("cuMemAlloc", CONTEXT, 512 * KIB)
        a.call("vgpuMemset", held, b"\x5a", 512 * KIB)
        first = a.info["session"]
        assert request(srv.address, "suspend", [{"session": first}], timeout_s=60)
        taken, _ = b.call("cuMemAlloc", CONTEXT, 512 * KIB)  # what A held is free now
        with pytest.raises(AdminError, match="out of device memory"):
            request(srv.address, "resume", [{"session": first}], timeout_s=60)
        b.post("cuMemFree", taken)
        b.call("vgpuSynchronize")
        assert request(srv.address, "resume", [{"session": first}], timeout_s=60)
        assert a.call("vgpuDigest", held, 16)[0] == hashlib.sha256(b"\x5a" * 16).digest()
        assert a.call("cuMemGetInfo")[0] == [256 * KIB, 1 << 20]
        a.close()
        b.close()
    finally:
        srv.stop()


def test_physical_memory_of_the_virtual_memory_api_counts_against_the_limit(tmp_path):
    """cuMemCreate takes device memory as cuMemAlloc does: charged, shown by cuMemGetInfo,
    refused past the limit, given back when the last reference goes."""
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--mem-limit", "5M")
    try:
        conn = _open(srv.address)
        pinned_on_device_0 = [1, 0, 1, 0, 0, 0, 0]
        conn.call("cuMemCreate", MEMORY, 4 << 20, pinned_on_device_0)
        assert conn.call("cuMemGetInfo")[0] == [1 << 20, 5 << 20]
        assert "session's limit of 5 MiB" in _out_of_memory(
            conn, "cuMemCreate", MEMORY + 1, 2 << 20, pinned_on_device_0)
        conn.call("cuMemRelease", MEMORY)
        assert conn.call("cuMemGetInfo")[0] == [5 << 20, 5 << 20]
        conn.call("cuMemCreate", MEMORY + 1, 4 << 20, pinned_on_device_0)
        conn.close()
        assert srv.alive()
    finally:
        srv.stop()
