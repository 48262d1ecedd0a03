"""What the emulator's device runtime costs; prints a table.

    python benchmarks/bench_device_runtime.py

Each figure against a baseline measured in the same run:
- 64 children launched from the device (one per parent block) against the same 64 child
  grids launched one by one through the emulator's API (what a host launch costs there,
  without the server);
- malloc + free of 16 bytes by each of 4,096 threads against the same kernel storing into
  a preallocated buffer;
- a recursive Fibonacci against the same function written as a loop (calls and frames
  saved aside against plain arithmetic).
Kernels are compiled with nvcc (PATH, or the nvidia-cuda-nvcc wheel).
"""

from __future__ import annotations

import struct

import bench_emu
from bench_emu import compile_ptx

from vgpu.server.emu import DeviceMemory, PtxModule, prepare
from vgpu.server.emu.device_runtime import DeviceRuntime

SOURCE = r"""
extern "C" {
__global__ void child(int *out, int base) { out[base + threadIdx.x] = base + threadIdx.x; }
__global__ void parent(int *out) { child<<<1, 32>>>(out, blockIdx.x * 32); }
__global__ void with_heap(int *out) {
    int *p = (int *)malloc(16);
    p[0] = threadIdx.x;
    out[blockIdx.x * blockDim.x + threadIdx.x] = p[0];
    free(p);
}
__global__ void without_heap(int *out, int *scratch) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    scratch[4 * i] = threadIdx.x;
    out[i] = scratch[4 * i];
}
__device__ __noinline__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__device__ __noinline__ int fib_loop(int n) {
    int a = 0, b = 1;
    for (int i = 0; i < n; i++) { int t = a + b; a = b; b = t; }
    return a;
}
__global__ void recursive(int *out, int n) { out[threadIdx.x] = fib(n); }
__global__ void iterative(int *out, int n) { out[threadIdx.x] = fib_loop(n); }
}
"""

REPEAT = 5
MiB = 1 << 20


def timed(fn) -> float:
    """Median seconds of REPEAT runs, after one to warm up."""
    fn()
    return bench_emu.timed(fn, REPEAT)


def main() -> None:
    module = PtxModule.parse(compile_ptx(SOURCE, ("-rdc=true",)))
    memory = DeviceMemory()
    places = {}
    for at, (name, size) in enumerate([("out", 4 * MiB), ("scratch", 16 * 4096 * 4),
                                       ("heap", 8 * MiB), ("launch_buffers", 2048 * 4096)]):
        address = 0x7F00_0000_0000 + at * 0x1000_0000
        memory.map(address, size)
        places[name] = (address, size)
    out, scratch = places["out"][0], places["scratch"][0]

    def run(kernel, grid, block, params, runtime=None):
        prepared = prepare(module, kernel, grid, block)
        return lambda: prepared.execute(params, memory, runtime=runtime)

    def runtime():
        return DeviceRuntime(memory, places.__getitem__)

    rows = []
    parent = prepare(module, "parent", 64, 1)
    child = prepare(module, "child", 1, 32)
    device = timed(lambda: parent.execute(struct.pack("<Q", out), memory, runtime=runtime()))
    host = timed(lambda: [child.execute(struct.pack("<Qi", out, 32 * b), memory)
                          for b in range(64)])
    rows.append(("64 device-side launches (parent of 64 blocks)", device, host,
                 "64 launches of the child through the emulator's API"))
    heap_kernel = prepare(module, "with_heap", 16, 256)
    plain = run("without_heap", 16, 256, struct.pack("<QQ", out, scratch))
    with_heap = timed(lambda: heap_kernel.execute(struct.pack("<Q", out), memory,
                                                  runtime=runtime()))
    rows.append(("malloc + free of 16 bytes, 4,096 threads", with_heap, timed(plain),
                 "stores into a preallocated buffer"))
    recursive = run("recursive", 1, 32, struct.pack("<Qi", out, 12))
    iterative = run("iterative", 1, 32, struct.pack("<Qi", out, 12))
    rows.append(("recursive fib(12), 32 threads", timed(recursive), timed(iterative),
                 "the same as a loop"))
    print("| benchmark | result | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for name, value, base, what in rows:
        print(f"| {name} | {value * 1e3:.2f} ms | {what}: {base * 1e3:.2f} ms | "
              f"{value / base:.2f} |")


if __name__ == "__main__":
    main()
