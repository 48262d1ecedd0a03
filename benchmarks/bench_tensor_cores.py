"""Tensor-core kernels on the PTX emulator against the same product without them; prints a
table.

    python benchmarks/bench_tensor_cores.py

A 256x256x256 matrix product three ways, one run: the classic shared-memory tiled kernel
in f32 (the baseline: what a program without tensor cores runs), nvcuda::wmma with f16
inputs and f32 accumulators (one warp per 16x16 tile), and inline mma.sync.m16n8k16 fed by
ldmatrix from cp.async double buffers (one warp per 16x8 tile); the last two are the test
kernels of tests/e2e/tensor_kernels.cu and tests/emu/kernels/tensor_cores.cu. Each figure
is the median of 3 launches; ratios are against the tiled kernel's time.
"""

from __future__ import annotations

import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from bench_emu import SOURCE as BASELINE_SOURCE
from bench_emu import Device, nvcc, timed

from vgpu.server.emu import PtxModule, launch

# The tests' kernels: wmma_gemm (C = A x B, one warp per 16x16 tile) and mma_ldmatrix_gemm
# (cp.async double buffers, ldmatrix, mma.sync; one warp per 16x8 tile).
TESTS = Path(__file__).resolve().parents[1] / "tests"
WMMA_SOURCE = TESTS / "e2e" / "tensor_kernels.cu"
MMA_SOURCE = TESTS / "emu" / "kernels" / "tensor_cores.cu"


def compile_ptx(source: str, arch: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        subprocess.run([nvcc(), "-ptx", f"-arch={arch}", str(src), "-o", f"{tmp}/k.ptx"],
                       check=True)
        return (Path(tmp) / "k.ptx").read_text()


def main() -> None:
    size = 256
    baseline_module = PtxModule.parse(compile_ptx(BASELINE_SOURCE, "compute_75"))
    wmma_module = PtxModule.parse(compile_ptx(WMMA_SOURCE.read_text(), "compute_80"))
    mma_module = PtxModule.parse(compile_ptx(MMA_SOURCE.read_text(), "compute_80"))
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (size, size))
    b = rng.integers(-4, 5, (size, size))
    expected = (a @ b).astype(np.float32)
    dev = Device()
    pa32, pb32 = dev.upload(a.astype(np.float32)), dev.upload(b.astype(np.float32))
    pa16, pb16 = dev.upload(a.astype(np.float16)), dev.upload(b.astype(np.float16))
    pc = dev.upload(np.zeros(size * size, np.float32))

    def run(module, kernel, grid, block, pa, pb, *sizes):
        params = struct.pack(f"<QQQ{len(sizes)}i", pa, pb, pc, *sizes)
        params = params.ljust(module.kernels[kernel].param_size, b"\0")

        def once():
            return launch(module, kernel, grid, block, params=params, memory=dev.memory)
        once()
        got = np.frombuffer(dev.memory.read(pc, 4 * size * size), np.float32)
        assert np.array_equal(got.reshape(size, size), expected), kernel
        return timed(once, 3)

    tiled = run(baseline_module, "matmul", (size // 16, size // 16), (16, 16), pa32, pb32, size)
    wmma = run(wmma_module, "wmma_gemm", (size * size // 256 // 4,), (128,), pa16, pb16, size)
    mma = run(mma_module, "mma_ldmatrix_gemm", (size // 8, size // 16), (32,), pa16, pb16,
              size, size)
    rows = [("tiled f32 matmul, shared memory (baseline)", tiled),
            ("nvcuda::wmma f16 -> f32, 16x16 tiles", wmma),
            ("cp.async + ldmatrix + mma.sync.m16n8k16 f16 -> f32", mma)]
    width = max(len(name) for name, _ in rows)
    print(f"{'256x256x256 product':<{width}}  {'time':>10}  ratio to baseline")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds * 1e3:>7.1f} ms  {seconds / tiled:.3f}")


if __name__ == "__main__":
    main()
