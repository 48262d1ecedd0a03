"""Tensor-core kernels as CUDA C++ writes them (tests/emu/kernels/tensor_cores.cu, compiled
once for compute_80): nvcuda::wmma GEMMs for every type and shape, element-wise work on
fragments, inline mma.sync fed by ldmatrix from tiles staged with cp.async, and cp.async
pipelines, each checked against products computed on the host (exact: the inputs are
chosen so, or the reference rounds exactly as the instruction does).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from emu_reference import round_exactly

SOURCE = Path(__file__).parent / "kernels" / "tensor_cores.cu"


@pytest.fixture(scope="module")
def ptx(toolkit):
    return toolkit.ptx(SOURCE.read_text(), arch="compute_80")


@pytest.fixture
def mod(device, ptx):
    return device.load(ptx)


def small_integers(rng, shape, low=-4, high=5):
    return rng.integers(low, high, shape)


def in_memory(matrix: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(matrix if layout == "r" else matrix.T)


# name, (M, N, K) of the instruction, input dtype, accumulator dtype, layouts of A and B
GEMMS = [
    ("gemm_f16_f32_rc", np.float16, np.float32, "rc"),
    ("gemm_f16_f32_cr", np.float16, np.float32, "cr"),
    ("gemm_f16_f16_rr", np.float16, np.float16, "rr"),
    ("gemm_f16_f32_m8n32", np.float16, np.float32, "rc"),
    ("gemm_f16_f16_m32n8", np.float16, np.float16, "cc"),
    ("gemm_bf16_f32", "bf16", np.float32, "rc"),
    ("gemm_bf16_f32_m32n8", "bf16", np.float32, "rr"),
    ("gemm_s8_s32", np.int8, np.int32, "rc"),
    ("gemm_u8_s32_m8n32", np.uint8, np.int32, "cr"),
]


def _bf16(values: np.ndarray) -> np.ndarray:
    """Small integers as bfloat16 bit patterns (exact)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("kernel,dtype,acc,layouts", GEMMS, ids=[g[0] for g in GEMMS])
def test_wmma_gemm_matches_the_host_product(device, mod, kernel, dtype, acc, layouts):
    rows = cols = depth = 32                   # 4 warps, each a tile, two k steps or more
    rng = np.random.default_rng(len(kernel))
    if dtype in (np.int8, np.uint8):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max + 1, (rows, depth))
        b = rng.integers(info.min, info.max + 1, (depth, cols))
    else:
        a, b = small_integers(rng, (rows, depth)), small_integers(rng, (depth, cols))
    c = small_integers(rng, (rows, cols), -50, 50)
    stored = {"bf16": _bf16}.get(dtype, lambda m: m.astype(dtype))
    pa = device.upload(stored(in_memory(a, layouts[0])))
    pb = device.upload(stored(in_memory(b, layouts[1])))
    pc = device.upload(c.astype(acc))
    device.launch(mod, kernel, (1,), (128,), pa, pb, pc, rows, cols, depth)
    got = device.download(pc, rows * cols, acc).reshape(rows, cols)
    np.testing.assert_array_equal(got, (a @ b + c).astype(acc))


def test_wmma_tf32_rounds_inputs_and_accumulates_in_f32(device, mod):
    rows = cols = 32
    depth = 16
    rng = np.random.default_rng(7)
    a = rng.uniform(-2, 2, (rows, depth)).astype(np.float32)
    b = rng.uniform(-2, 2, (depth, cols)).astype(np.float32)
    pc = device.zeros(rows * cols, np.float32)
    device.launch(mod, "gemm_tf32", (1,), (128,), device.upload(a),
                  device.upload(np.ascontiguousarray(b.T)), pc, rows, cols, depth)
    got = device.download(pc, rows * cols, np.float32).reshape(rows, cols)

    def tf32(x):   # __float_to_tf32: to nearest, ties away from zero, 10 significand bits
        bits = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        return [[Fraction(float(v)) for v in row] for row in bits.view(np.float32)]
    ta, tb = tf32(a), tf32(np.ascontiguousarray(b))
    for i in range(rows):
        for j in range(cols):
            acc = Fraction(0)
            for k0 in (0, 8):          # one mma per 8 columns of k, each rounded to f32
                exact = acc + sum(ta[i][k] * tb[k][j] for k in range(k0, k0 + 8))
                acc = Fraction(float(round_exactly(exact, "rn", np.float32)))
            assert Fraction(float(got[i, j])) == acc, (i, j)


def test_wmma_f64_is_a_chain_of_fused_multiply_adds(device, mod):
    rows = cols = 16
    depth = 8
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (rows, depth)), rng.uniform(-1, 1, (depth, cols))
    c = rng.uniform(-1, 1, (rows, cols))
    pc = device.upload(c)
    device.launch(mod, "gemm_f64", (1,), (128,), device.upload(a),
                  device.upload(np.ascontiguousarray(b.T)), pc, rows, cols, depth)
    got = device.download(pc, rows * cols, np.float64).reshape(rows, cols)
    for i in range(rows):
        for j in range(cols):
            d = c[i, j]
            for k in range(depth):
                d = float(Fraction(a[i, k]) * Fraction(b[k, j]) + Fraction(d))
            assert got[i, j] == d, (i, j)


def test_fragments_support_element_wise_scaling(device, mod):
    rng = np.random.default_rng(5)
    a, b = small_integers(rng, (16, 16)), small_integers(rng, (16, 16))
    c = small_integers(rng, (16, 16), -50, 50)
    pd = device.zeros(256, np.float32)
    device.launch(mod, "scaled_f16", (1,), (32,), device.upload(a.astype(np.float16)),
                  device.upload(b.astype(np.float16)), device.upload(c.astype(np.float32)),
                  pd, np.float32(2.0), np.float32(0.5))
    got = device.download(pd, 256, np.float32).reshape(16, 16).T   # stored column-major
    np.testing.assert_array_equal(got, 2 * a @ b + 0.5 * c)


def test_wmma_s4_product(device, mod):
    rng = np.random.default_rng(11)
    a, b = rng.integers(-8, 8, (8, 32)), rng.integers(-8, 8, (32, 8))

    def packed(matrix):       # row-major nibbles, element 0 in the low nibble
        nibbles = (matrix.ravel() & 0xF).astype(np.uint32).reshape(-1, 8)
        return (nibbles << (4 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype(np.uint32)
    pc = device.zeros(64, np.int32)
    device.launch(mod, "gemm_s4", (1,), (32,), device.upload(packed(a)),
                  device.upload(packed(b.T)), pc)
    np.testing.assert_array_equal(device.download(pc, 64, np.int32).reshape(8, 8), a @ b)


def test_wmma_b1_xor_popc_product(device, mod):
    rng = np.random.default_rng(13)
    a, b = rng.integers(0, 2, (8, 128)), rng.integers(0, 2, (128, 8))

    def packed(matrix):       # row-major bits, element 0 in bit 0 of each word
        bits = matrix.ravel().astype(np.uint64).reshape(-1, 32)
        return (bits << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(np.uint32)
    pc = device.zeros(64, np.int32)
    device.launch(mod, "gemm_b1", (1,), (32,), device.upload(packed(a)),
                  device.upload(packed(b.T)), pc)
    expected = (a[:, :, None] ^ b[None, :, :]).sum(axis=1)
    np.testing.assert_array_equal(device.download(pc, 64, np.int32).reshape(8, 8), expected)


def test_mma_sync_with_ldmatrix_and_cp_async_double_buffering(device, mod):
    rows, cols, depth = 32, 16, 48           # three k steps through two shared buffers
    rng = np.random.default_rng(17)
    a, b = small_integers(rng, (rows, depth)), small_integers(rng, (depth, cols))
    pc = device.zeros(rows * cols, np.float32)
    device.launch(mod, "mma_ldmatrix_gemm", (cols // 8, rows // 16), (32,),
                  device.upload(a.astype(np.float16)), device.upload(b.astype(np.float16)),
                  pc, cols, depth)
    got = device.download(pc, rows * cols, np.float32).reshape(rows, cols)
    np.testing.assert_array_equal(got, a @ b)


def test_cuda_pipeline_stages_tiles_with_memcpy_async(device, mod):
    tiles, threads = 10, 64
    data = np.arange(tiles * 64, dtype=np.int32) * 3 - 100
    out = device.zeros(threads, np.int32)
    device.launch(mod, "pipeline_sums", (1,), (threads,), device.upload(data), out, tiles)
    t = np.arange(threads)
    expected = sum(data[k * 64 + (t * 7 + k) % 64] for k in range(tiles))
    np.testing.assert_array_equal(device.download(out, threads, np.int32), expected)


@pytest.mark.parametrize("valid_bytes", [0, 8, 16])
def test_cp_async_zero_fills_past_the_source_size(device, mod, valid_bytes):
    data = np.arange(128, dtype=np.int32) + 1
    out = device.zeros(128, np.int32)
    device.launch(mod, "zero_filled_copies", (1,), (32,), device.upload(data), out, valid_bytes)
    expected = np.where((np.arange(128) % 4) < valid_bytes // 4, data, 0)
    np.testing.assert_array_equal(device.download(out, 128, np.int32), expected)
