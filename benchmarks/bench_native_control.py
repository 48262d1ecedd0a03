"""Benchmarks of the native compiler on control flow and warp code; prints a table.

    python benchmarks/bench_native_control.py

Every figure is a ratio against a baseline measured in the same run: a warp-shuffle
reduction of 4M integers (shfl.down, a warp's atomicAdd) against numpy's `x.sum()`, and the
one-thread Collatz walk with its step in a `__noinline__` device function (a call per
iteration, inlined by the compiler) against the same loop compiled by the host's C compiler.
The interpreter's figures are in the table too (the walk on a shorter range, scaled), and
the shuffles alone (65536 threads, five shfl.down each) against the interpreter.
"""

from __future__ import annotations

import tempfile

import numpy as np
from bench_emu import Device, compile_ptx
from bench_native import host_library, row, run, timed

from vgpu.server.emu import PtxModule, native, prepare

SOURCE = r"""
extern "C" {
__global__ void warp_sum(const int* x, unsigned long long* total, int n) {
    long long s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        s += x[i];
    for (int offset = 16; offset > 0; offset >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(total, (unsigned long long)s);
}
__global__ void shuffles(unsigned long long* total) {
    long long s = threadIdx.x;
    for (int offset = 16; offset > 0; offset >>= 1)
        s += __shfl_down_sync(0xffffffffu, s, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(total, (unsigned long long)s);
}
__device__ __noinline__ unsigned long long step(unsigned long long x) {
    return (x & 1) ? 3 * x + 1 : x >> 1;
}
__global__ void collatz_calls(unsigned long long* steps, int limit) {
    unsigned long long total = 0;
    for (int n = 1; n <= limit; ++n) {
        unsigned long long x = n;
        while (x != 1) { x = step(x); ++total; }
    }
    *steps = total;
}
}
"""
LIMIT = 20_000
INTERPRETED_LIMIT = 100


def main() -> None:
    directory = tempfile.mkdtemp()
    loops = host_library(directory)
    ptx = compile_ptx(SOURCE)
    assert "call.uni" in ptx and "shfl.sync.down" in ptx
    rows: list[tuple[str, str, str]] = []
    device = Device()
    interpreted = PtxModule.parse(ptx)
    native.configure(enabled=True)
    module = PtxModule.parse(ptx)

    n = 1 << 22
    x = np.random.default_rng(0).integers(-1000, 1000, n).astype(np.int32)
    dx, total = device.upload(x), device.upload(np.zeros(1, np.uint64))
    params = dx.to_bytes(8, "little") + total.to_bytes(8, "little") + n.to_bytes(4, "little")
    params += b"\0" * (module.kernels["warp_sum"].param_size - len(params))
    baseline = timed(lambda: x.sum(), 21)
    rows.append(row("warp-shuffle sum of 4M int32 (256 blocks of 256): numpy x.sum()",
                    baseline, None))
    for threads in (1, 2):
        assert prepare(module, "warp_sum", (256,), (256,)).native is not None
        rows.append(row(f"  compiled, {threads} thread(s)",
                        run(module, device, "warp_sum", (256,), (256,), params, threads),
                        baseline))
    got = int(np.frombuffer(device.memory.read(total, 8), np.int64)[0])
    runs = 1 + 9 + 1 + 9   # every launch of the two rows adds the sum once more
    assert got == runs * int(x.sum()), "the compiled reduction disagrees with numpy"
    native.configure(enabled=False)
    rows.append(row("  interpreter", run(interpreted, device, "warp_sum", (256,), (256,),
                                         params), baseline))

    # the shuffles alone: 65536 threads x 5, against the interpreter
    params = total.to_bytes(8, "little")
    interpreter = run(interpreted, device, "shuffles", (256,), (256,), params)
    rows.append(row("5 shuffles in each of 65536 threads (256 blocks): interpreter",
                    interpreter, None))
    native.configure(enabled=True)
    rows.append(row("  compiled, 1 thread", run(module, device, "shuffles", (256,), (256,),
                                                params), interpreter))

    out = device.upload(np.zeros(1, np.uint64))
    short = out.to_bytes(8, "little") + INTERPRETED_LIMIT.to_bytes(4, "little")
    native.configure(enabled=False)
    interpreter = timed(lambda: prepare(interpreted, "collatz_calls", 1, 1).run(
        short, device.memory), 3)
    short_steps = loops.collatz(INTERPRETED_LIMIT)
    native.configure(enabled=True)
    assert prepare(module, "collatz_calls", 1, 1).native is not None
    params = out.to_bytes(8, "little") + LIMIT.to_bytes(4, "little")
    compiled = run(module, device, "collatz_calls", 1, 1, params)
    steps = int(np.frombuffer(device.memory.read(out, 8), np.uint64)[0])
    assert steps == loops.collatz(LIMIT), "the compiled kernel disagrees with C"
    host = timed(lambda: loops.collatz(LIMIT), 9)
    rows.append(row(f"Collatz 1..{LIMIT} with a device-function call per step, one thread: "
                    "C (cc -O2)", host, None))
    rows.append(row("  compiled kernel", compiled, host))
    per_step = tuple(t / short_steps * steps for t in interpreter)
    rows.append(row(f"  interpreter (1..{INTERPRETED_LIMIT}, scaled to {LIMIT})", per_step,
                    host, 1, "s"))
    native.configure(enabled=False, threads=1)
    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'best / median':>24}  ratio (best / median)")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:>24}  {ratio}")


if __name__ == "__main__":
    main()
