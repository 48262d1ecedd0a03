"""Launch failures: memory checking (700/716), trap (719), bad launch configurations."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vgpu.server.emu import DeviceMemory, IllegalAddress, LaunchError, MemoryChecker, prepare

SOURCE = r"""
extern "C" {
__global__ void write_past_end(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = 1.0f;  // no bounds check: the last block runs past n
}
__global__ void read_at(const int* base, long long offset, int* out) {
    out[threadIdx.x] = base[offset + threadIdx.x];
}
__global__ void shared_oob(int* out, int k) {
    extern __shared__ int s[];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + k];
}
__global__ void local_oob(int* out, int k) {
    volatile int a[4];
    for (int i = 0; i < 4; ++i) a[i] = i;
    out[threadIdx.x] = a[k];
}
__global__ void misaligned(const char* p, int* out) {
    out[threadIdx.x] = *(const int*)(p + 1 + 4 * threadIdx.x);
}
__global__ void stray_then_far(const int* base, int* out) {
    out[0] = base[16];       // past the end of 16 ints: inside the granule
    out[1] = base[1 << 20];  // far outside it
}
__global__ void traps(int* out) {
    if (threadIdx.x == 3) asm volatile("trap;");
    out[threadIdx.x] = 1;
}
}
"""


@pytest.fixture(scope="module")
def ptx(toolkit):
    return toolkit.ptx(SOURCE)


@pytest.fixture
def mod(device, ptx):
    return device.load(ptx)


def test_out_of_bounds_global_write(device, mod):
    out = device.zeros(100, np.float32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "write_past_end", (2,), (64,), out, 100)
    err = info.value
    assert err.code == 700
    assert err.message.startswith(f"Invalid __global__ write of size 4 at 0x{out + 400:x} "
                                  "by thread (36,0,0) in block (1,0,0) of kernel "
                                  "'write_past_end' (PTX line ")
    assert err.message.endswith(f"): address is out of bounds and is 0 bytes after the "
                                f"nearest allocation at 0x{out:x} of size 400 bytes")
    line = int(re.search(r"PTX line (\d+)", err.message).group(1))
    assert [i.line for i in mod.ir.functions["write_past_end"].body if i.opcode == "st"] == [line]


def _stray_launch(device, ptx):
    """write_past_end over 100 floats of a memory that maps 512-byte granules: threads
    100..127 write past the allocation's end, inside its granule."""
    device.memory = DeviceMemory(granule=512)
    mod = device.load(ptx)
    out = device.zeros(100, np.float32)
    prepared = prepare(mod, "write_past_end", (2,), (64,))
    return out, prepared, mod, device.pack(mod, "write_past_end", (out, 100))


def test_stray_accesses_inside_the_granule_run_and_are_reported_once(device, ptx):
    out, prepared, _, params = _stray_launch(device, ptx)
    checker = MemoryChecker(strict=False)
    result = prepared.run(params, device.memory, checker)
    assert result.report.startswith(
        f"vgpu memcheck: Invalid __global__ write of size 4 at 0x{out + 400:x} by thread "
        f"(36,0,0) in block (1,0,0) of kernel 'write_past_end' (PTX line ")
    assert "0 bytes after the nearest allocation" in result.report
    assert result.report.count("\n") == 2
    assert device.download(out, 100, np.float32).tolist() == [1.0] * 100
    assert prepared.run(params, device.memory, checker).report == ""  # once per kernel
    with pytest.raises(IllegalAddress):  # the padding is not the allocation's to copy
        device.memory.read(out, 404)


def test_strict_checking_faults_inside_the_granule(device, ptx):
    out, prepared, _, params = _stray_launch(device, ptx)
    with pytest.raises(LaunchError) as info:
        prepared.run(params, device.memory, MemoryChecker(strict=True))
    assert info.value.code == 700
    assert f"at 0x{out + 400:x} by thread (36,0,0) in block (1,0,0)" in info.value.message


def _lenient_fault(device, ptx, kernel: str, threads: int, args) -> tuple[int, LaunchError]:
    """Run `kernel` on one block of `threads` over 16 ints in 512-byte granules with a
    lenient checker, passing args(base, out); the base and the LaunchError it must raise."""
    device.memory = DeviceMemory(granule=512)
    mod = device.load(ptx)
    base = device.upload(np.arange(16, dtype=np.int32))
    out = device.zeros(16, np.int32)
    prepared = prepare(mod, kernel, (1,), (threads,))
    with pytest.raises(LaunchError) as info:
        prepared.run(device.pack(mod, kernel, args(base, out)), device.memory,
                     MemoryChecker(strict=False))
    return base, info.value


def test_accesses_outside_every_granule_fault_whatever_the_checker(device, ptx):
    # 512 bytes on: past the granule
    base, error = _lenient_fault(device, ptx, "read_at", 16, lambda base, out: (base, 128, out))
    assert error.code == 700
    assert f"at 0x{base + 512:x} by thread (0,0,0)" in error.message


def test_a_stray_access_before_a_fault_is_reported_with_it(device, ptx):
    base, error = _lenient_fault(device, ptx, "stray_then_far", 1,
                                 lambda base, out: (base, out))
    assert error.code == 700
    assert f"at 0x{base + (4 << 20):x} by thread (0,0,0)" in error.message
    assert error.diagnostics.startswith(
        f"vgpu memcheck: Invalid __global__ read of size 4 at 0x{base + 64:x} by thread "
        f"(0,0,0) in block (0,0,0) of kernel 'stray_then_far' (PTX line ")


def test_out_of_bounds_global_read_before_allocation(device, mod):
    base = device.upload(np.arange(16, dtype=np.int32))
    out = device.zeros(16, np.int32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "read_at", (1,), (16,), base, -3, out)
    assert info.value.code == 700
    assert "Invalid __global__ read of size 4" in info.value.message
    assert "by thread (0,0,0) in block (0,0,0)" in info.value.message
    device.launch(mod, "read_at", (1,), (13,), base, 3, out)
    np.testing.assert_array_equal(device.download(out, 13, np.int32), np.arange(3, 16))


def test_out_of_bounds_shared(device, mod):
    out = device.zeros(32, np.int32)
    device.launch(mod, "shared_oob", (1,), (32,), out, 0, shared=128)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "shared_oob", (1,), (32,), out, 1, shared=128)
    assert info.value.code == 700
    assert "Invalid __shared__ read of size 4 at 0x80 by thread (31,0,0)" in info.value.message


def test_out_of_bounds_local(device, mod):
    out = device.zeros(32, np.int32)
    device.launch(mod, "local_oob", (1,), (4,), out, 2)
    assert list(device.download(out, 4, np.int32)) == [2] * 4
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "local_oob", (1,), (4,), out, 1000)
    assert info.value.code == 700
    assert "Invalid __local__" in info.value.message


def test_misaligned_access(device, mod):
    data = device.zeros(256, np.uint8)
    out = device.zeros(8, np.int32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "misaligned", (1,), (8,), data, out)
    assert info.value.code == 716
    assert "address is misaligned" in info.value.message


def test_trap(device, mod):
    out = device.zeros(8, np.int32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "traps", (1,), (8,), out)
    assert info.value.code == 719
    assert "thread (3,0,0)" in info.value.message


@pytest.mark.parametrize("grid,block", [((0, 1, 1), (32, 1, 1)), ((1, 1, 1), (1025, 1, 1)),
                                        ((1, 1, 1), (0, 1, 1)), ((1, 70000, 1), (1, 1, 1))])
def test_bad_launch_configuration(device, mod, grid, block):
    out = device.zeros(8, np.int32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "traps", grid, block, out)
    assert info.value.code == 1


def test_parameter_buffer_size_mismatch(device, mod):
    from vgpu.server.emu import launch
    with pytest.raises(LaunchError) as info:
        launch(mod, "traps", (1,), (1,), params=b"\0" * 4, memory=device.memory)
    assert info.value.code == 1
    assert "8 bytes of parameters, got 4" in info.value.message


def test_unknown_kernel(device, mod):
    from vgpu.server.emu import launch
    with pytest.raises(LaunchError) as info:
        launch(mod, "nope", (1,), (1,), memory=device.memory)
    assert info.value.code == 500


def test_too_much_dynamic_shared_memory(device, mod):
    out = device.zeros(32, np.int32)
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "shared_oob", (1,), (32,), out, 0, shared=1 << 20)
    assert info.value.code == 1
