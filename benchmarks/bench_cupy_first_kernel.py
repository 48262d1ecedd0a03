"""CuPy's first kernel of a program under `vgpu run` on emu: an ElementwiseKernel and a
ReductionKernel (CuPy compiles its reductions with CUB's block reduction: a module of about
1300 variables), each timed from its first call to its result (NVRTC compile through vgpu's
libnvrtc, module load on the server, launch), then its second call (a launch). Each program
runs twice in the same run: with CuPy's kernel cache empty, then with it filled by the first
run, whose difference is the compile's share. Medians of --rounds programs; prints a table.

    python benchmarks/bench_cupy_first_kernel.py [--rounds N]   (needs cupy-cuda13x)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

PROGRAM = r"""
import time
import cupy

x = cupy.empty(4096, cupy.float32)  # memory only: no kernel before the timed ones
kernels = {
    "elementwise": cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2 + 1",
                                          "bench_first_elementwise"),
    "reduction": cupy.ReductionKernel("float32 x", "float32 y", "x", "a + b", "y = a", "0",
                                      "bench_first_reduction"),
}
for name, kernel in kernels.items():
    times = []
    for _ in range(2):
        start = time.perf_counter()
        kernel(x)
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - start)
    print(name, *times)
"""


UNDER_VGPU_ON_EMU = [sys.executable, "-m", "vgpu.cli", "run", "--backend", "emu", "--"]


def run_once(cache: str, launcher: list[str] = UNDER_VGPU_ON_EMU, env: dict | None = None,
             timeout: float = 600) -> dict[str, tuple[float, float]]:
    """{kernel: (first call s, second call s)} of one program, started by `launcher` (vgpu
    run on emu unless told otherwise; scripts/gpu_check.py runs it natively and under vgpu on
    a GPU too)."""
    result = subprocess.run([*launcher, sys.executable, "-c", PROGRAM], capture_output=True,
                            text=True, env={**(env or os.environ), "CUPY_CACHE_DIR": cache},
                            timeout=timeout, check=True)
    rows = {}
    for line in result.stdout.splitlines():
        name, first, second = line.split()
        rows[name] = (float(first), float(second))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    cold, warm = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(run_once(cache))  # CuPy compiles: its cache is empty
            warm.append(run_once(cache))  # the same kernels found in its cache
    print(f"{'kernel':<12} {'cold first s':>13} {'warm first s':>13} {'compile share':>14} "
          f"{'second call ms':>15}")
    for name in cold[0]:
        c = statistics.median(r[name][0] for r in cold)
        w = statistics.median(r[name][0] for r in warm)
        again = statistics.median(r[name][1] for r in cold + warm)
        print(f"{name:<12} {c:>13.2f} {w:>13.2f} {(c - w) / c:>13.0%} {again * 1e3:>15.1f}")


if __name__ == "__main__":
    main()
