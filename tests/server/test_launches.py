"""Launches as the server runs them: a kernel's shapes are checked and prepared once, then
reused. What a user sees must not depend on what was reused."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from vgpu.client import MAX_QUEUED_CALLS, Connection
from vgpu.errors import CudaError

CONTEXT = 0x7667_0100_0000_0001
MODULE, FUNCTION = 0x7667_0200_0000_0001, 0x7667_0300_0000_0001

# out[global thread index] = blockDim.x * 1000 + gridDim.x
SHAPE_PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .entry shape(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %nctaid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r3, %r1, %r4;
    mad.lo.s32 %r6, %r1, 1000, %r2;
    mul.wide.u32 %rd2, %r5, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
    ret;
}
"""
SLOTS = 4096  # u32 results: enough for the largest shape below


@pytest.fixture
def kernel(server):
    conn = Connection(server.address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    conn.call("cuModuleLoadData", MODULE, CONTEXT, ["inline", SHAPE_PTX], len(SHAPE_PTX))
    conn.post("cuModuleGetFunction", FUNCTION, MODULE, "shape")
    out, _ = conn.call("cuMemAlloc", CONTEXT, SLOTS * 4)
    yield conn, out
    conn.close()


def _launch_and_read(conn, out: int, grid: int, block: int) -> list[int]:
    conn.post("vgpuMemset", out, bytes(4), SLOTS)
    conn.post("cuLaunchKernel", FUNCTION, grid, 1, 1, block, 1, 1, 0, 0,
              out.to_bytes(8, "little"))
    result = (ctypes.c_uint32 * SLOTS)()
    conn.read_device("cuMemcpyDtoH", out, ctypes.addressof(result), SLOTS * 4)
    return list(result)


def test_every_shape_computes_its_own_result_also_after_others_displaced_it(kernel):
    conn, out = kernel
    # More shapes than a function keeps prepared (16), then the first ones again.
    shapes = [(g, b) for g in (1, 2, 3, 5, 8) for b in (1, 32, 64, 100, 128)][:20]
    for grid, block in shapes + shapes[:4]:
        result = _launch_and_read(conn, out, grid, block)
        threads = grid * block
        assert result[:threads] == [block * 1000 + grid] * threads, (grid, block)
        assert result[threads:] == [0] * (SLOTS - threads), (grid, block)


def test_a_bad_shape_is_refused_every_time_and_good_ones_still_run(kernel):
    conn, out = kernel
    params = out.to_bytes(8, "little")
    for _ in range(2):  # the second time must not find anything prepared for it
        conn.post("cuLaunchKernel", FUNCTION, 1, 1, 1, 2048, 1, 1, 0, 0, params)
        with pytest.raises(CudaError) as err:
            conn.call("vgpuSynchronize")
        assert err.value.code == 1  # CUDA_ERROR_INVALID_VALUE: too many threads
    assert _launch_and_read(conn, out, 2, 64)[:128] == [64 * 1000 + 2] * 128


@pytest.mark.parametrize("args", [
    ([1], 1, 1, 1, 1, 1, 0, 0),          # a list where a dimension goes
    (1, 1, 1, -4, 1, 1, 0, 0),           # a negative block
    (1, 1, 1, 1, 1, 1, "x", 0),          # shared bytes that are not a number
    (1, 1, 1, 1, 1, 1, 0, 0, b"", 7),    # one argument too many
])
def test_malformed_launch_arguments_get_invalid_value(kernel, args):
    conn, out = kernel
    params = out.to_bytes(8, "little")
    call = args if len(args) > 8 else (*args, params)
    conn.post("cuLaunchKernel", FUNCTION, *call)
    with pytest.raises(CudaError) as err:
        conn.call("vgpuSynchronize")
    assert err.value.code == 1
    assert _launch_and_read(conn, out, 1, 32)[:32] == [32 * 1000 + 1] * 32


HELLO_PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0,
                                                 .param .b64 vprintf_param_1);
.global .align 1 .b8 $str[4] = {104, 105, 10, 0};
.visible .entry hello()
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    cvta.global.u64 %rd1, $str;
    mov.u64 %rd2, 0;
    {
    .param .b64 param0;
    st.param.b64 [param0], %rd1;
    .param .b64 param1;
    st.param.b64 [param1], %rd2;
    .param .b32 retval0;
    call.uni (retval0), vprintf, (param0, param1);
    ld.param.b32 %r1, [retval0];
    }
    ret;
}
"""


# A program that launches HELLO_PTX's kernel `launches` times without waiting, synchronizes
# once and exits: argv is the server's address, the PTX and the number of launches.
PRINTING_PROGRAM = f"""
import sys
from vgpu.client import Connection
address, ptx, launches = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
conn = Connection(address)
conn.post("cuDevicePrimaryCtxRetain", {CONTEXT}, 0)
conn.call("cuModuleLoadData", {MODULE}, {CONTEXT}, ["inline", ptx], len(ptx))
conn.post("cuModuleGetFunction", {FUNCTION}, {MODULE}, "hello")
for _ in range(launches):
    conn.post("cuLaunchKernel", {FUNCTION}, 1, 1, 1, 1, 1, 1, 0, 0, b"")
conn.synchronize()
"""


def test_device_printf_of_every_launch_shows_at_the_next_sync(server):
    """Launches fill many batches that nobody waits for; all their output still comes, on
    the program's stdout as the program leaves it: a pipe, which C's stdio buffers (no
    PYTHONUNBUFFERED to make it write at once), flushed when the program exits."""
    launches = 10 * MAX_QUEUED_CALLS + 7
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", PRINTING_PROGRAM, server.address,
                           HELLO_PTX.decode(), str(launches)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n" * launches
