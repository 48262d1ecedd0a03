"""Two sessions on one server: each names only its own memory, handles and segments.

Session A holds an allocation, a module with a `__device__` variable, a function, a stream and
an event; session B tries every path with A's addresses and handles, and gets CUDA's error
each time while A's memory stays as it was. One session's kernel faults never touch the other.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from vgpu.client import Connection
from vgpu.errors import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_ASSERT = 710

# A's handles (client-chosen, as vgpu's client chooses them) and B's own.
A_CTX, A_MODULE, A_POKE, A_STREAM, A_EVENT = (0x7667_0100_0000_00A1, 0x7667_0200_0000_00A1,
                                              0x7667_0300_0000_00A1, 0x7667_0400_0000_00A1,
                                              0x7667_0500_0000_00A1)
B_CTX, B_MODULE = 0x7667_0100_0000_00B1, 0x7667_0200_0000_00B1
B_POKE, B_PEEK, B_CHECK = 0x7667_0300_0000_00B1, 0x7667_0300_0000_00B2, 0x7667_0300_0000_00B3
SIZE = 4096
SECRET = 0x5EC2E7

SOURCE = r"""
#include <cassert>
__device__ unsigned secret = 0x5EC2E7;
extern "C" __global__ void poke(unsigned *p, unsigned v) { *p = v; }
extern "C" __global__ void peek(const unsigned *src, unsigned *dst) { *dst = *src; }
extern "C" __global__ void check(int v) { assert(v == 0); }
"""


@pytest.fixture
def kernels(toolkit) -> bytes:
    return toolkit.ptx(SOURCE).encode()


@pytest.fixture
def sessions(server, kernels):
    """(a, b, what A holds): A's allocation filled with a pattern, its module's variable."""
    a, b = Connection(server.address), Connection(server.address)
    a.post("cuCtxCreate", A_CTX, 0, 0)
    held, _ = a.call("cuMemAlloc", A_CTX, SIZE)
    a.call("vgpuMemset", held, b"\xab", SIZE)
    loaded, _ = a.call("cuModuleLoadData", A_MODULE, A_CTX, ["inline", kernels], len(kernels))
    a.post("cuModuleGetFunction", A_POKE, A_MODULE, "poke")
    a.post("cuStreamCreate", A_STREAM, A_CTX, 0, 0)
    a.post("cuEventCreate", A_EVENT, A_CTX, 0)
    a.call("vgpuSynchronize")
    b.post("cuCtxCreate", B_CTX, 0, 0)
    b.call("cuModuleLoadData", B_MODULE, B_CTX, ["inline", kernels], len(kernels))
    for handle, name in ((B_POKE, "poke"), (B_PEEK, "peek"), (B_CHECK, "check")):
        b.post("cuModuleGetFunction", handle, B_MODULE, name)
    mine, _ = b.call("cuMemAlloc", B_CTX, SIZE)
    yield a, b, {"held": held, "secret": loaded["variables"]["secret"][0], "mine": mine}
    a.close()
    b.close()
    assert server.alive()


def _fails(conn: Connection, code: int, op: str, *args) -> None:
    with pytest.raises(CudaError) as err:
        conn.call(op, *args)
    assert err.value.code == code, err.value.message


def _unchanged(a: Connection, held: int) -> None:
    out = (ctypes.c_char * SIZE)()
    a.read_device("cuMemcpyDtoH", held, ctypes.addressof(out), SIZE)
    assert bytes(out) == b"\xab" * SIZE


def test_the_sessions_have_address_ranges_of_their_own(sessions):
    _, _, at = sessions
    assert at["held"] >> 40 != at["mine"] >> 40


@pytest.mark.parametrize("target", ["held", "secret"])
def test_copies_and_memsets_in_every_direction_refuse_the_other_sessions_memory(sessions,
                                                                               target):
    a, b, at = sessions
    theirs, mine = at[target], at["mine"]
    data = (ctypes.c_char * 16).from_buffer_copy(b"\x01" * 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD", theirs, ["inline", bytes(data)], 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD", theirs, b.frame(bytes(data)), 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH", theirs, 16, ["frame"])
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoD", theirs, mine, 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoD", mine, theirs, 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "vgpuMemset", theirs, b"\0", 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "vgpuMemset", theirs, b"\0\0\0\0", 4)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "vgpuDigest", theirs, 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "vgpuDeviceWindow", theirs, 16)
    _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemFree", theirs)
    # Through vgpu's own copy paths too (staging ring, frames), as a program's copies go.
    with pytest.raises(CudaError) as err:
        b.write_device("cuMemcpyHtoD", theirs, ctypes.addressof(data), 16)
        b.synchronize()
    assert err.value.code == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as err:
        b.read_device("cuMemcpyDtoH", theirs, ctypes.addressof(data), 16)
    assert err.value.code == CUDA_ERROR_INVALID_VALUE
    _unchanged(a, at["held"])
    assert a.call("cuMemcpyDtoH", at["secret"], 4, ["frame"])[1][0] == \
        SECRET.to_bytes(4, "little")


@pytest.mark.parametrize("target", ["held", "secret"])
@pytest.mark.parametrize("access", ["write", "read"])
def test_a_kernel_given_the_other_sessions_address_faults_without_touching_it(sessions,
                                                                             target, access):
    a, b, at = sessions
    theirs = at[target]
    if access == "write":
        b.post("cuLaunchKernel", B_POKE, 1, 1, 1, 1, 1, 1, 0, 0,
               theirs.to_bytes(8, "little") + (7).to_bytes(4, "little"))
    else:
        b.post("cuLaunchKernel", B_PEEK, 1, 1, 1, 1, 1, 1, 0, 0,
               theirs.to_bytes(8, "little") + at["mine"].to_bytes(8, "little"))
    _fails(b, CUDA_ERROR_ILLEGAL_ADDRESS, "vgpuSynchronize")
    _unchanged(a, at["held"])
    assert a.call("vgpuSynchronize")[0] is None, "A has no error of B's"


def test_the_other_sessions_handles_are_unknown(sessions):
    _, b, at = sessions
    _fails(b, CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc", A_CTX, SIZE)
    _fails(b, CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy", A_CTX)
    _fails(b, CUDA_ERROR_INVALID_CONTEXT, "cuStreamCreate", 0x7667_0400_0000_00B9, A_CTX, 0, 0)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction", 0x7667_0300_0000_00B9,
           A_MODULE, "poke")
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload", A_MODULE)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel", A_POKE, 1, 1, 1, 1, 1, 1, 0, 0,
           at["mine"].to_bytes(8, "little") + bytes(4))
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel", B_POKE, 1, 1, 1, 1, 1, 1, 0,
           A_STREAM, at["mine"].to_bytes(8, "little") + bytes(4))
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", A_STREAM)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent", 0, A_EVENT)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuEventRecord", A_EVENT, 0)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime", A_EVENT, A_EVENT)
    _fails(b, CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy", A_EVENT)
    a = sessions[0]  # B's calls changed nothing of A's: A goes on with all of it
    a.post("cuLaunchKernel", A_POKE, 1, 1, 1, 1, 1, 1, 0, A_STREAM,
           at["held"].to_bytes(8, "little") + (0xABABABAB).to_bytes(4, "little"))
    a.post("cuEventRecord", A_EVENT, A_STREAM)
    a.post("cuStreamWaitEvent", A_STREAM, A_EVENT)
    a.call("vgpuSynchronize")
    _unchanged(a, at["held"])


def test_host_segments_are_the_sessions_own(sessions):
    a, b, at = sessions
    # Segment ids are numbered per client from 1: B names ids it never mapped.
    for seg in (1, 2):
        _fails(b, CUDA_ERROR_INVALID_VALUE, "vgpuUnmapHostSegment", seg)
        _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD", at["mine"], ["seg", seg, 0], 16)
        _fails(b, CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH", at["mine"], 16, ["seg", seg, 0])


def test_a_sessions_faults_and_asserts_stay_its_own(sessions):
    a, b, at = sessions
    b.post("cuLaunchKernel", B_CHECK, 1, 1, 1, 32, 1, 1, 0, 0, (1).to_bytes(4, "little"))
    _fails(b, CUDA_ERROR_ASSERT, "vgpuSynchronize")
    _fails(b, CUDA_ERROR_ASSERT, "cuMemAlloc", B_CTX, SIZE)  # sticky, for B alone
    # A launches, allocates and synchronizes as if nothing happened.
    a.post("cuLaunchKernel", A_POKE, 1, 1, 1, 1, 1, 1, 0, 0,
           at["held"].to_bytes(8, "little") + (0xABABABAB).to_bytes(4, "little"))
    other, _ = a.call("cuMemAlloc", A_CTX, SIZE)
    assert a.call("vgpuSynchronize")[0] is None
    a.post("cuMemFree", other)
    _unchanged(a, at["held"])


def test_a_client_cannot_shrink_device_memory_it_maps_under_the_server(server):
    """A local client maps large allocations itself (through the server's /proc fd); the
    file is sealed at its size, so truncating it, which would make the server's next access
    to that memory a SIGBUS for every session, is refused."""
    conn = Connection(server.address)
    conn.post("cuCtxCreate", A_CTX, 0, 0)
    size = 1 << 20
    target, _ = conn.call("cuMemAlloc", A_CTX, size)
    window, _ = conn.call("vgpuDeviceWindow", target, size)
    assert window is not None, "the server shares large allocations with local clients"
    pid, fd = window[0], window[1]
    opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(opened, 0)
    finally:
        os.close(opened)
    conn.call("vgpuMemset", target, b"\1", size)
    assert conn.call("vgpuDigest", target, 16)[0]
    conn.close()
    assert server.alive()
