"""Benchmarks of the PTX emulator (vgpu.server.emu); prints a table.

    python benchmarks/bench_emu.py

Each figure comes with a ratio against a baseline measured in the same run: numpy's own
rate for a simple element-wise operation (float32 add of two 1M arrays, elements/s), which
is the ceiling for one emulated instruction per lane; the small-launch latency is compared
with numpy making one call per emulated instruction on 256 elements. Kernels are compiled
with nvcc (PATH, or the nvidia-cuda-nvcc wheel).
"""

from __future__ import annotations

import shutil
import statistics
import struct
import subprocess
import sysconfig
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from vgpu.server.emu import DeviceMemory, PtxModule, launch, native

SOURCE = r"""
extern "C" {
__global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
#define TILE 16
__global__ void matmul(const float* A, const float* B, float* C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n / TILE; ++t) {
        As[threadIdx.y][threadIdx.x] = A[row * n + t * TILE + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(t * TILE + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[row * n + col] = acc;
}
__global__ void reduce(const float* in, float* out, int n) {
    __shared__ float s[256];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0) atomicAdd(out, s[0]);
}
__global__ void straight(unsigned* data, float* f) {
    int i = threadIdx.x;
    unsigned x = data[i];
    float y = f[i];
#pragma unroll
    for (int k = 0; k < 12; ++k) {
        x = x * 1664525u + 1013904223u;
        x ^= x >> 13;
        y = fmaf(y, 1.0001f, (float)(x & 255));
        x += (unsigned)y;
    }
    data[i] = x;
    f[i] = y;
}
}
"""


def nvcc() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    wheel = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / "nvcc"
    if wheel.exists():
        return str(wheel)
    raise SystemExit("nvcc not found (install the test extra)")


def compile_ptx(source: str, flags: tuple[str, ...] = ()) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        subprocess.run([nvcc(), "-ptx", "-arch=compute_75", *flags, str(src), "-o",
                        f"{tmp}/k.ptx"], check=True)
        return (Path(tmp) / "k.ptx").read_text()


class Device:
    def __init__(self):
        self.memory = DeviceMemory()
        self.next = 0x7F00_0000_0000

    def upload(self, array: np.ndarray) -> int:
        address = self.next
        self.next += (array.nbytes + 0xFFFF) & ~0xFFFF
        self.memory.map(address, array.nbytes)
        self.memory.write(address, array.tobytes())
        return address


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_baseline() -> float:
    a = np.random.rand(1 << 20).astype(np.float32)
    b = np.random.rand(1 << 20).astype(np.float32)
    seconds = timed(lambda: np.add(a, b), 20)
    return a.size / seconds


def main() -> None:
    native.configure(enabled=False)   # the interpreter's figures (bench_native: compiled)
    module = PtxModule.parse(compile_ptx(SOURCE))
    baseline = numpy_baseline()
    rows: list[tuple[str, str, str]] = [
        ("numpy float32 add, 1M elements (baseline)", f"{baseline / 1e6:,.0f} M elem/s", "1")]

    def add_rate(name: str, seconds: float, lane_instructions: int, extra: str = "") -> None:
        rate = lane_instructions / seconds
        rows.append((name, f"{seconds * 1e3:,.1f} ms, {rate / 1e6:,.0f} M lane-instr/s{extra}",
                     f"{rate / baseline:.3f}"))

    # 1. vector add over 1M threads
    dev = Device()
    n = 1 << 20
    a, b = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.upload(np.zeros(n, np.float32))
    params = struct.pack("<QQQi4x", pa, pb, pc, n)[:module.kernels["vector_add"].param_size]

    def vector_add():
        return launch(module, "vector_add", (n // 256,), (256,), params=params,
                      memory=dev.memory)
    result = vector_add()
    assert np.array_equal(np.frombuffer(dev.memory.read(pc, 4 * n), np.float32), a + b)
    add_rate("vector add, 1M threads", timed(vector_add, 5), result.lane_instructions)

    # 2. tiled 256x256 matrix multiply
    size = 256
    A = np.random.rand(size, size).astype(np.float32)
    B = np.random.rand(size, size).astype(np.float32)
    qa, qb, qc = dev.upload(A), dev.upload(B), dev.upload(np.zeros(size * size, np.float32))
    params_mm = struct.pack("<QQQi4x", qa, qb, qc, size)[:module.kernels["matmul"].param_size]

    def matmul():
        return launch(module, "matmul", (size // 16, size // 16), (16, 16), params=params_mm,
                      memory=dev.memory)
    result = matmul()
    got = np.frombuffer(dev.memory.read(qc, 4 * size * size), np.float32).reshape(size, size)
    assert np.allclose(got, A @ B, rtol=1e-4)
    numpy_mm = timed(lambda: A @ B, 20)
    mm = timed(matmul, 3)
    add_rate("tiled matmul 256x256 (shared memory, barriers)", mm, result.lane_instructions,
             f" (numpy A@B x{mm / numpy_mm:,.0f})")

    # 3. 1M-element reduction
    x = np.random.rand(n).astype(np.float32)
    px, pout = dev.upload(x), dev.upload(np.zeros(1, np.float32))
    params_red = struct.pack("<QQi4x", px, pout, n)[:module.kernels["reduce"].param_size]

    def reduction():
        return launch(module, "reduce", (n // 256,), (256,), params=params_red,
                      memory=dev.memory)
    result = reduction()
    add_rate("block reduction + atomicAdd, 1M elements", timed(reduction, 3),
             result.lane_instructions)

    # 4. one block of 256 threads running ~100 instructions: launch to completion
    pd = dev.upload(np.arange(256, dtype=np.uint32))
    pf = dev.upload(np.ones(256, np.float32))
    params_small = struct.pack("<QQ", pd, pf)

    def small():
        return launch(module, "straight", (1,), (256,), params=params_small, memory=dev.memory)
    result = small()
    per_thread = result.lane_instructions // 256
    latency = timed(small, 50)
    # baseline: numpy doing the same number of 256-element operations, one call each
    u, v = np.arange(256, dtype=np.uint32), np.ones(256, np.uint32)

    def numpy_calls():
        for _ in range(per_thread):
            np.add(u, v)
    floor = timed(numpy_calls, 50)
    rows.append((f"1 block x 256 threads, {per_thread} instructions: launch to completion",
                 f"{latency * 1e3:.2f} ms (numpy, {per_thread} calls: {floor * 1e3:.2f} ms)",
                 f"{latency / floor:.1f}"))

    # 5. peak memory of a launch vs the grid's register footprint
    for threads in (1 << 20, 1 << 22):
        m = threads
        big = [dev.upload(np.zeros(m, np.float32)) for _ in range(3)]
        params_big = struct.pack("<QQQi4x", *big, m)[:module.kernels["vector_add"].param_size]
        tracemalloc.start()
        launch(module, "vector_add", (m // 256,), (256,), params=params_big, memory=dev.memory)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        registers = module.program.kernels["vector_add"].register_count
        footprint = m * registers * 8
        rows.append((f"peak memory, vector add {m >> 20}M threads",
                     f"{peak / 2**20:,.1f} MiB vs {footprint / 2**20:,.0f} MiB of registers",
                     f"{peak / footprint:.3f}"))
        for address in big:
            dev.memory.unmap(address)

    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'result':<58}  ratio to baseline")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:<58}  {ratio}")


if __name__ == "__main__":
    main()
