"""Queued work that fails for a reason other than CUDA's (the host out of memory, say) is
not lost: its failure surfaces at the next synchronizing call, and the server logs why."""

from __future__ import annotations

import resource

import pytest

from vgpu.client import Connection
from vgpu.errors import CudaError

CONTEXT = 0x7667_0100_0000_0001
CUDA_ERROR_OUT_OF_MEMORY = 2
SIZE = 256 << 20


def _virtual_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/<pid>/status")


def test_queued_work_that_runs_the_server_out_of_host_memory_fails_the_next_sync(server):
    conn = Connection(server.address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    conn.call("vgpuSynchronize")  # the session and its worker exist before the cap
    # Room for what the server has, not for SIZE more: the allocation, queued as a raw client
    # may queue any call, cannot get its host memory on the emulator.
    _, hard = resource.prlimit(server.proc.pid, resource.RLIMIT_AS)
    limit = _virtual_size(server.proc.pid) + SIZE // 4
    resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (limit, hard))
    conn.post("cuMemAlloc", CONTEXT, SIZE)
    with pytest.raises(CudaError) as err:
        conn.synchronize()
    assert err.value.code == CUDA_ERROR_OUT_OF_MEMORY
    resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (hard, hard))
    conn.synchronize()  # reported once; the session goes on
    (free, total), _ = conn.call("cuMemGetInfo")
    assert free == total, "the failed allocation holds no device memory"
    address, _ = conn.call("cuMemAlloc", CONTEXT, SIZE)
    conn.post("cuMemFree", address)
    conn.synchronize()
    conn.close()
    assert server.alive()
    log = server.stop()
    assert "cuMemAlloc failed" in log and "MemoryError" in log, log
