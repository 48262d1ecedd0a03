"""Tensor-core kernels on the PTX emulator against the same product without them; prints a
table.

    python benchmarks/bench_tensor_cores.py

A 256x256x256 matrix product three ways, one run: the classic shared-memory tiled kernel
in f32 (the baseline: what a program without tensor cores runs), nvcuda::wmma with f16
inputs and f32 accumulators (one warp per 16x16 tile), and inline mma.sync.m16n8k16 fed by
ldmatrix (one warp per 16x8 tile). Each figure is the median of 3 launches; ratios are
against the tiled kernel's time.
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

TENSOR_SOURCE = r"""
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
extern "C" __global__ void wmma_gemm(const half *a, const half *b, float *c, int n) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tile_m = warp / (n / 16), tile_n = warp % (n / 16);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < n; k += 16) {
        wmma::load_matrix_sync(fa, a + tile_m * 16 * n + k, n);
        wmma::load_matrix_sync(fb, b + k * n + tile_n * 16, n);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + tile_m * 16 * n + tile_n * 16, acc, n, wmma::mem_row_major);
}
extern "C" __global__ void mma_gemm(const half *a, const half *b, float *c, int n) {
    __shared__ __align__(16) half ta[16][16];
    __shared__ __align__(16) half tb[16][8];
    int lane = threadIdx.x, row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
    float acc[4] = {0, 0, 0, 0};
    for (int k = 0; k < n; k += 16) {
        for (int i = lane; i < 256; i += 32)
            ta[i / 16][i % 16] = a[(row0 + i / 16) * n + k + i % 16];
        for (int i = lane; i < 128; i += 32)
            tb[i / 8][i % 8] = b[(k + i / 8) * n + col0 + i % 8];
        __syncwarp();
        unsigned fa[4], fb[2];
        unsigned sa = (unsigned)__cvta_generic_to_shared(&ta[lane % 16][(lane / 16) * 8]);
        unsigned sb = (unsigned)__cvta_generic_to_shared(&tb[lane % 16][0]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(fa[0]), "=r"(fa[1]), "=r"(fa[2]), "=r"(fa[3]) : "r"(sa));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(fb[0]), "=r"(fb[1]) : "r"(sb));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
        __syncwarp();
    }
    int g = lane / 4, p = (lane % 4) * 2;
    c[(row0 + g) * n + col0 + p] = acc[0];
    c[(row0 + g) * n + col0 + p + 1] = acc[1];
    c[(row0 + g + 8) * n + col0 + p] = acc[2];
    c[(row0 + g + 8) * n + col0 + p + 1] = acc[3];
}
"""


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
    tensor_module = PtxModule.parse(compile_ptx(TENSOR_SOURCE, "compute_80"))
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (size, size))
    b = rng.integers(-4, 5, (size, size))
    expected = (a @ b).astype(np.float32)
    dev = Device()
    pa32, pb32 = dev.upload(a.astype(np.float32)), dev.upload(b.astype(np.float32))
    pa16, pb16 = dev.upload(a.astype(np.float16)), dev.upload(b.astype(np.float16))
    pc = dev.upload(np.zeros(size * size, np.float32))

    def run(module, kernel, grid, block, pa, pb):
        params = struct.pack("<QQQi4x", pa, pb, pc, size)[:module.kernels[kernel].param_size]

        def once():
            return launch(module, kernel, grid, block, params=params, memory=dev.memory)
        once()
        got = np.frombuffer(dev.memory.read(pc, 4 * size * size), np.float32)
        assert np.array_equal(got.reshape(size, size), expected), kernel
        return timed(once, 3)

    tiled = run(baseline_module, "matmul", (size // 16, size // 16), (16, 16), pa32, pb32)
    wmma = run(tensor_module, "wmma_gemm", (size * size // 256 // 4,), (128,), pa16, pb16)
    mma = run(tensor_module, "mma_gemm", (size // 8, size // 16), (32,), pa16, pb16)
    rows = [("tiled f32 matmul, shared memory (baseline)", tiled),
            ("nvcuda::wmma f16 -> f32, 16x16 tiles", wmma),
            ("ldmatrix + mma.sync.m16n8k16 f16 -> f32", mma)]
    width = max(len(name) for name, _ in rows)
    print(f"{'256x256x256 product':<{width}}  {'time':>10}  ratio to baseline")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds * 1e3:>7.1f} ms  {seconds / tiled:.3f}")


if __name__ == "__main__":
    main()
