"""CUDA C kernels compiled by nvcc, run on the emulator, compared with numpy references."""

from __future__ import annotations

import numpy as np
import pytest

SOURCE = r"""
#include <cstdint>
extern "C" {
__global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
__global__ void saxpy(float a, const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}
#define TILE 16
__global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
__global__ void block_sum(const int* in, int* partial, unsigned long long* total, int n) {
    __shared__ int s[256];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0) {
        partial[blockIdx.x] = s[0];
        atomicAdd(total, (unsigned long long)s[0]);
    }
}
__global__ void warp_sum(const float* in, float* out) {
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) out[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = v;
}
__global__ void shuffles(const int* in, int* up, int* xr, int* bcast, int* sub) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    up[i] = __shfl_up_sync(0xffffffffu, v, 3);
    xr[i] = __shfl_xor_sync(0xffffffffu, v, 5);
    bcast[i] = __shfl_sync(0xffffffffu, v, 7);
    sub[i] = __shfl_down_sync(0xffffffffu, v, 2, 8);
}
__global__ void votes(const int* in, int* all, int* any, unsigned* ballot, int* count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    all[i] = __all_sync(0xffffffffu, v > 0);
    any[i] = __any_sync(0xffffffffu, v > 5);
    unsigned b = __ballot_sync(0xffffffffu, v & 1);
    ballot[i] = b;
    count[i] = __popc(b);
}
__global__ void histogram(const unsigned* data, unsigned* bins, int n, int nbins) {
    extern __shared__ unsigned local_bins[];
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) local_bins[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local_bins[data[i] % nbins], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) atomicAdd(&bins[b], local_bins[b]);
}
__global__ void inclusive_scan(const int* in, int* out, int n) {
    __shared__ int buf[2][512];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    int src = 0;
    buf[0][t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
        int v = buf[src][t];
        if (t >= off) v += buf[src][t - off];
        buf[1 - src][t] = v;
        src = 1 - src;
        __syncthreads();
    }
    if (i < n) out[i] = buf[src][t];
}
__global__ void collatz(const unsigned* start, int* steps, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long x = start[i];
    int s = 0;
    while (x != 1) {
        x = (x & 1) ? 3 * x + 1 : x / 2;
        ++s;
        if (s > 1000) { steps[i] = -1; return; }
    }
    steps[i] = s;
}
__global__ void branches(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i], r;
    if (v % 3 == 0) {
        if (v % 2 == 0) r = v / 6; else { r = 0; for (int k = 0; k < (v & 7); ++k) r += k * v; }
    } else if (v % 3 == 1) {
        switch (v & 3) { case 0: r = 10; break; case 1: r = -v; break; default: r = v * v; }
    } else {
        r = 0;
        for (int k = 0; k < 32; ++k) { if ((v >> k) & 1) r++; if (r > 4) break; }
    }
    out[i] = r;
}
struct Pair { int a; float b; };
__device__ __noinline__ Pair make_pair(int a, float b) {
    Pair p; p.a = a * 2; p.b = b + 1.0f; return p;
}
__device__ __noinline__ int clamp_add(int x, int y, int lo, int hi) {
    int s = x + y;
    if (s < lo) return lo;
    if (s > hi) return hi;
    return s;
}
__device__ __noinline__ float inner(float x) { return x * x + 1.0f; }
__device__ __noinline__ float outer(float x, int k) {
    float s = 0.0f;
    for (int i = 0; i < k; ++i) s += inner(x + i);
    return s;
}
__global__ void calls(const int* in, int* ci, float* pf, int* pa, float* nested, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    ci[i] = clamp_add(v, 7, -20, 30);
    Pair p = make_pair(v, (float)i);
    pa[i] = p.a;
    pf[i] = p.b;
    nested[i] = outer((float)v, v & 3);
}
}
template <typename T> __global__ void scale_shift(T* x, T s, T d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s + d;
}
template __global__ void scale_shift<float>(float*, float, float, int);
template __global__ void scale_shift<double>(double*, double, double, int);
template __global__ void scale_shift<int>(int*, int, int, int);
template __global__ void scale_shift<long long>(long long*, long long, long long, int);
extern "C" {
__global__ void index3d(int* out) {
    int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int i = bx * blockDim.x * blockDim.y * blockDim.z + tx;
    out[4 * i + 0] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z;
    out[4 * i + 1] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z;
    out[4 * i + 2] = blockDim.x + 10 * blockDim.y + 100 * blockDim.z;
    out[4 * i + 3] = gridDim.x + 10 * gridDim.y + 100 * gridDim.z;
}
__constant__ float coefficients[4] = {1.5f, -2.0f, 0.25f, 8.0f};
__device__ int table[5] = {3, 1, 4, 1, 5};
__device__ int counter;
__global__ void globals(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = coefficients[i % 4] * table[i % 5];
    if (i == 0) counter += 41;
}
__global__ void local_array(const int* idx, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int a[24];
    for (int k = 0; k < 24; ++k) a[k] = k * k + i;
    if (i < n) out[i] = a[idx[i] % 24] + a[(idx[i] * 7) % 24];
}
struct Params { char tag; double scale; int count; short s; float v[3]; };
__global__ void by_value(Params p, double* out) {
    out[0] = p.tag; out[1] = p.scale; out[2] = p.count; out[3] = p.s;
    out[4] = p.v[0]; out[5] = p.v[1]; out[6] = p.v[2];
}
__global__ void atomics(int* i32, unsigned* u32, unsigned long long* u64, float* f32, double* f64) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&i32[0], t);
    atomicSub(&i32[1], 2);
    atomicMin(&i32[2], 100 - t);
    atomicMax(&i32[3], t * 3);
    atomicExch(&i32[4], 77);
    atomicCAS(&i32[5], 0, t + 1);
    atomicAnd(&u32[0], ~(1u << (t % 32)));
    atomicOr(&u32[1], 1u << (t % 32));
    atomicXor(&u32[2], 1u << (t % 7));
    atomicInc(&u32[3], 9u);
    atomicDec(&u32[4], 9u);
    atomicAdd(&u64[0], 1ull << 33);
    atomicMax(&u64[1], (unsigned long long)t << 40);
    atomicAdd(&f32[0], 0.5f);
    atomicAdd(&f64[0], 0.25);
    unsigned* as_bits = (unsigned*)&f32[1];
    unsigned old = *as_bits, assumed;
    do {
        assumed = old;
        float bigger = fmaxf(__uint_as_float(assumed), (float)t);
        old = atomicCAS(as_bits, assumed, __float_as_uint(bigger));
    } while (old != assumed);
}
__global__ void block_votes(int* out) {
    int t = threadIdx.x;
    int c = __syncthreads_count(t % 3 == 0);
    int a = __syncthreads_and(t < 1000);
    int o = __syncthreads_or(t == 17);
    out[t] = c * 100 + a * 10 + o;
}
__global__ void early_exit_barrier(int* out, int limit) {
    __shared__ int s[128];
    int t = threadIdx.x;
    s[t] = t;
    __syncthreads();
    if (t >= limit) return;
    out[t] = s[limit - 1 - t];
}
__global__ void grid_stride_sum(const double* x, double* out, int n) {
    double acc = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        acc += x[i];
    atomicAdd(out, acc);
}
}
"""


@pytest.fixture(scope="module")
def ptx(toolkit):
    return toolkit.ptx(SOURCE)


@pytest.fixture
def mod(device, ptx):
    return device.load(ptx)


def test_vector_add(device, mod):
    n = 1000
    rng = np.random.default_rng(1)
    a, b = rng.random(n, np.float32), rng.random(n, np.float32)
    c = device.zeros(n, np.float32)
    device.launch(mod, "vector_add", (4,), (256,), device.upload(a), device.upload(b), c, n)
    np.testing.assert_array_equal(device.download(c, n, np.float32), a + b)


def test_saxpy_grid_stride(device, mod):
    n = 5000
    rng = np.random.default_rng(2)
    x, y = rng.random(n, np.float32), rng.random(n, np.float32)
    dy = device.upload(y)
    device.launch(mod, "saxpy", (3,), (128,), 2.5, device.upload(x), dy, n)
    expected = (np.float64(2.5) * x + y).astype(np.float32)  # fma: one rounding
    np.testing.assert_array_equal(device.download(dy, n, np.float32), expected)


@pytest.mark.parametrize("m,n,k", [(32, 48, 16), (37, 21, 50)])
def test_tiled_matmul(device, mod, m, n, k):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = device.zeros(m * n, np.float32)
    grid = ((n + 15) // 16, (m + 15) // 16)
    device.launch(mod, "matmul", grid, (16, 16), device.upload(a), device.upload(b), c, m, n, k)
    np.testing.assert_allclose(device.download(c, m * n, np.float32).reshape(m, n), a @ b,
                               rtol=1e-4, atol=1e-4)


def test_block_reduction(device, mod):
    n = 10_000
    data = np.random.default_rng(4).integers(-1000, 1000, n).astype(np.int32)
    blocks = (n + 255) // 256
    partial = device.zeros(blocks, np.int32)
    total = device.zeros(1, np.uint64)
    device.launch(mod, "block_sum", (blocks,), (256,), device.upload(data), partial, total, n)
    padded = np.zeros(blocks * 256, np.int64)
    padded[:n] = data
    np.testing.assert_array_equal(device.download(partial, blocks, np.int32),
                                  padded.reshape(blocks, 256).sum(1))
    assert int(device.download(total, 1, np.uint64)[0]) == int(data.sum()) % 2**64


def test_warp_reduction(device, mod):
    x = np.random.default_rng(5).standard_normal(256).astype(np.float32)
    out = device.zeros(8, np.float32)
    device.launch(mod, "warp_sum", (2,), (128,), device.upload(x), out)
    # reference: the same butterfly order the kernel uses
    v = x.reshape(8, 32).copy()
    for o in (16, 8, 4, 2, 1):
        shifted = np.concatenate([v[:, o:], v[:, -o:] * 0 + v[:, -o:]], axis=1)
        v = v + shifted
    np.testing.assert_array_equal(device.download(out, 8, np.float32), v[:, 0])


def test_shuffles(device, mod):
    x = np.arange(64, dtype=np.int32) * 3 + 1
    outs = [device.zeros(64, np.int32) for _ in range(4)]
    device.launch(mod, "shuffles", (1,), (64,), device.upload(x), *outs)
    up, xr, bc, sub = (device.download(o, 64, np.int32) for o in outs)
    lane = np.arange(64) % 32
    base = np.arange(64) - lane
    np.testing.assert_array_equal(up, np.where(lane >= 3, x[base + lane - 3], x))
    np.testing.assert_array_equal(xr, x[base + (lane ^ 5)])
    np.testing.assert_array_equal(bc, x[base + 7])
    seg = lane % 8
    below = x[np.minimum(np.arange(64) + 2, 63)]
    np.testing.assert_array_equal(sub, np.where(seg + 2 < 8, below, x))


def test_votes_and_ballot(device, mod):
    x = np.random.default_rng(6).integers(-3, 12, 96).astype(np.int32)
    x[:32] = np.abs(x[:32]) + 1  # first warp: all positive
    outs = [device.zeros(96, np.int32), device.zeros(96, np.int32),
            device.zeros(96, np.uint32), device.zeros(96, np.int32)]
    device.launch(mod, "votes", (1,), (96,), device.upload(x), *outs)
    all_, any_, ballot, count = (device.download(o, 96, d) for o, d in
                                 zip(outs, [np.int32, np.int32, np.uint32, np.int32],
                                     strict=True))
    for w in range(3):
        seg = x[32 * w:32 * (w + 1)]
        bits = sum(1 << k for k in range(32) if seg[k] & 1)
        assert set(all_[32 * w:32 * (w + 1)]) == {int((seg > 0).all())}
        assert set(any_[32 * w:32 * (w + 1)]) == {int((seg > 5).any())}
        assert set(ballot[32 * w:32 * (w + 1)]) == {bits}
        assert set(count[32 * w:32 * (w + 1)]) == {bin(bits).count("1")}


def test_histogram_shared_and_global_atomics(device, mod):
    n, nbins = 20_000, 37
    data = np.random.default_rng(7).integers(0, 1 << 30, n).astype(np.uint32)
    bins = device.zeros(nbins, np.uint32)
    device.launch(mod, "histogram", (8,), (256,), device.upload(data), bins, n, nbins,
                  shared=nbins * 4)
    np.testing.assert_array_equal(device.download(bins, nbins, np.uint32),
                                  np.bincount(data % nbins, minlength=nbins))


def test_prefix_scan(device, mod):
    n = 1500
    data = np.random.default_rng(8).integers(-50, 50, n).astype(np.int32)
    out = device.zeros(n, np.int32)
    device.launch(mod, "inclusive_scan", (3,), (512,), device.upload(data), out, n)
    expected = np.concatenate([np.cumsum(data[i:i + 512]) for i in range(0, n, 512)])
    np.testing.assert_array_equal(device.download(out, n, np.int32), expected)


def collatz_steps(x: int) -> int:
    """What the collatz kernel computes, on the host (-1 beyond 1000 steps)."""
    s = 0
    while x != 1:
        x = 3 * x + 1 if x & 1 else x // 2
        s += 1
        if s > 1000:
            return -1
    return s


def test_data_dependent_loops_and_early_return(device, mod):
    n = 300
    start = np.arange(1, n + 1, dtype=np.uint32)
    steps = device.zeros(n, np.int32)
    device.launch(mod, "collatz", (3,), (128,), device.upload(start), steps, n)
    np.testing.assert_array_equal(device.download(steps, n, np.int32),
                                  [collatz_steps(int(v)) for v in start])


def test_nested_branches(device, mod):
    n = 500
    v = np.random.default_rng(9).integers(0, 10_000, n).astype(np.int32)
    out = device.zeros(n, np.int32)
    device.launch(mod, "branches", (2,), (256,), device.upload(v), out, n)

    def ref(x):
        if x % 3 == 0:
            return x // 6 if x % 2 == 0 else sum(k * x for k in range(x & 7))
        if x % 3 == 1:
            return {0: 10, 1: -x}.get(x & 3, x * x)
        r = 0
        for k in range(32):
            r += (x >> k) & 1
            if r > 4:
                break
        return r
    np.testing.assert_array_equal(device.download(out, n, np.int32), [ref(int(x)) for x in v])


def test_device_function_calls(device, mod, ptx):
    assert "call.uni" in ptx
    n = 100
    v = np.arange(-50, 50, dtype=np.int32)
    outs = [device.zeros(n, np.int32), device.zeros(n, np.float32), device.zeros(n, np.int32),
            device.zeros(n, np.float32)]
    device.launch(mod, "calls", (1,), (128,), device.upload(v), *outs, n)
    check_calls(device, outs, v)


def check_calls(device, outs, v) -> None:
    """The calls kernel's four outputs against the host's values."""
    n = len(v)
    ci, pf, pa, nested = (device.download(o, n, d) for o, d in
                          zip(outs, [np.int32, np.float32, np.int32, np.float32], strict=True))
    np.testing.assert_array_equal(ci, np.clip(v + 7, -20, 30))
    np.testing.assert_array_equal(pa, v * 2)
    np.testing.assert_array_equal(pf, np.arange(n, dtype=np.float32) + 1)
    expected = [sum(np.float32((np.float32(x) + i) * (np.float32(x) + i) + 1) for i in
                    range(x & 3)) for x in v]
    np.testing.assert_allclose(nested, np.array(expected, np.float32), rtol=1e-6)


@pytest.mark.parametrize("name,dtype,s,d", [
    ("scale_shift<float>", np.float32, 1.5, -0.25),
    ("scale_shift<double>", np.float64, -3.25, 2.0),
    ("scale_shift<int>", np.int32, 7, -3),
    ("scale_shift<long long>", np.int64, 1 << 35, 11),
])
def test_templated_kernels(device, mod, name, dtype, s, d):
    mangled = {"float": "_Z11scale_shiftIfEvPT_S0_S0_i",
               "double": "_Z11scale_shiftIdEvPT_S0_S0_i",
               "int": "_Z11scale_shiftIiEvPT_S0_S0_i",
               "long long": "_Z11scale_shiftIxEvPT_S0_S0_i"}[name[12:-1]]
    n = 77
    x = (np.arange(n) - 30).astype(dtype)
    dx = device.upload(x)
    device.launch(mod, mangled, (1,), (128,), dx, dtype(s), dtype(d), n)
    expected = x * dtype(s) + dtype(d)
    if dtype in (np.float32, np.float64):
        expected = (x.astype(np.float64) * s + d).astype(dtype) if dtype == np.float32 else expected
    np.testing.assert_array_equal(device.download(dx, n, dtype), expected)


def test_3d_indices(device, mod):
    grid, block = (3, 2, 2), (4, 3, 2)
    total = 12 * 24
    out = device.zeros(total * 4, np.int32)
    device.launch(mod, "index3d", grid, block, out)
    got = device.download(out, total * 4, np.int32).reshape(total, 4)
    rows = []
    for bz in range(2):
        for by in range(2):
            for bx in range(3):
                for tz in range(2):
                    for ty in range(3):
                        for tx in range(4):
                            rows.append([tx + 10 * ty + 100 * tz, bx + 10 * by + 100 * bz,
                                         4 + 30 + 200, 3 + 20 + 200])
    np.testing.assert_array_equal(got, rows)


def test_constant_and_global_variables(device, mod):
    assert mod.variables["coefficients"].space == "const"
    n = 40
    out = device.zeros(n, np.float32)
    device.launch(mod, "globals", (1,), (64,), out, n)
    i = np.arange(n)
    expected = np.array([1.5, -2, 0.25, 8], np.float32)[i % 4] * np.array([3, 1, 4, 1, 5])[i % 5]
    np.testing.assert_array_equal(device.download(out, n, np.float32), expected)
    address = device.symbols[id(mod)]["counter"]
    assert device.download(address, 1, np.int32)[0] == 41


def test_local_array_dynamic_index(device, mod):
    n = 200
    idx = np.random.default_rng(10).integers(0, 1000, n).astype(np.int32)
    out = device.zeros(n, np.int32)
    device.launch(mod, "local_array", (2,), (128,), device.upload(idx), out, n)
    i = np.arange(n)
    a1, a2 = idx % 24, (idx * 7) % 24
    np.testing.assert_array_equal(device.download(out, n, np.int32), a1 * a1 + a2 * a2 + 2 * i)


def test_struct_by_value(device, mod):
    info = mod.kernels["by_value"]
    assert [p.size for p in info.params] == [40, 8]
    import struct
    blob = struct.pack("<b7xdih2xfff4x", -5, 2.5, 123456, -7, 1.0, 2.0, 3.0)
    out = device.zeros(7, np.float64)
    device.launch(mod, "by_value", (1,), (1,), blob, out)
    np.testing.assert_array_equal(device.download(out, 7, np.float64),
                                  [-5, 2.5, 123456, -7, 1, 2, 3])


def test_atomics(device, mod):
    i32 = device.upload(np.array([0, 0, 1000, -1, 0, 0], np.int32))
    u32 = device.upload(np.array([0xFFFFFFFF, 0, 0, 0, 0], np.uint32))
    u64 = device.upload(np.zeros(2, np.uint64))
    f32 = device.upload(np.array([0, -1], np.float32))
    f64 = device.upload(np.zeros(1, np.float64))
    threads = 200
    device.launch(mod, "atomics", (2,), (100,), i32, u32, u64, f32, f64)
    t = np.arange(threads)
    got = device.download(i32, 6, np.int32)
    np.testing.assert_array_equal(got[:5], [t.sum(), -2 * threads, 100 - 199, 3 * 199, 77])
    assert 1 <= got[5] <= threads  # the thread whose CAS came first: blocks run in parallel
    xor = 0
    for k in t:
        xor ^= 1 << (k % 7)
    np.testing.assert_array_equal(device.download(u32, 5, np.uint32),
                                  [0, 0xFFFFFFFF, xor, threads % 10, (-threads) % 10])
    np.testing.assert_array_equal(device.download(u64, 2, np.uint64),
                                  [threads << 33, 199 << 40])
    np.testing.assert_array_equal(device.download(f32, 2, np.float32), [100, 199])
    assert device.download(f64, 1, np.float64)[0] == 50.0


def test_block_wide_votes(device, mod):
    out = device.zeros(96, np.int32)
    device.launch(mod, "block_votes", (1,), (96,), out)
    np.testing.assert_array_equal(device.download(out, 96, np.int32), [32 * 100 + 10 + 1] * 96)


def test_exited_threads_do_not_block_barriers(device, mod):
    out = device.upload(np.full(128, -1, np.int32))
    device.launch(mod, "early_exit_barrier", (1,), (128,), out, 50)
    got = device.download(out, 128, np.int32)
    np.testing.assert_array_equal(got[:50], np.arange(50)[::-1])
    assert (got[50:] == -1).all()


def test_many_blocks_run_in_chunks(device, mod):
    n = 300_000
    x = np.random.default_rng(11).random(n)
    out = device.zeros(1, np.float64)
    device.launch(mod, "grid_stride_sum", (1200,), (256,), device.upload(x), out, n)
    assert device.download(out, 1, np.float64)[0] == pytest.approx(x.sum(), rel=1e-12)


SPIN_SOURCE = r"""
extern "C" __global__ void locked_increment(int* lock, int* counter, int* order) {
    // The losers spin at the loop head, below the winner's critical section in the code:
    // only independent thread scheduling lets the winner reach the release.
    while (atomicCAS(lock, 0, 1) != 0) {}
    int seen = *(volatile int*)counter;
    order[seen] = blockIdx.x * blockDim.x + threadIdx.x;
    *(volatile int*)counter = seen + 1;
    __threadfence();
    atomicExch(lock, 0);
}
"""


def test_spin_lock_between_threads_of_one_warp(device, toolkit):
    mod = device.load(toolkit.ptx(SPIN_SOURCE))
    lock, counter, order = device.zeros(1, np.int32), device.zeros(1, np.int32), \
        device.zeros(64, np.int32)
    device.launch(mod, "locked_increment", (2,), (32,), lock, counter, order)
    assert device.download(counter, 1, np.int32)[0] == 64
    assert sorted(device.download(order, 64, np.int32)) == list(range(64))


CUB_SOURCE = r"""
#include <cub/cub.cuh>
extern "C" __global__ void block_reduce(const int* in, int* out) {
    typedef cub::BlockReduce<int, 128> Reduce;
    __shared__ typename Reduce::TempStorage tmp;
    int s = Reduce(tmp).Sum(in[blockIdx.x * 128 + threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
extern "C" __global__ void block_scan(const int* in, int* out) {
    typedef cub::BlockScan<int, 128> Scan;
    __shared__ typename Scan::TempStorage tmp;
    int r;
    Scan(tmp).ExclusiveSum(in[threadIdx.x], r);
    out[threadIdx.x] = r;
}
extern "C" __global__ void block_sort(const unsigned* in, unsigned* out) {
    typedef cub::BlockRadixSort<unsigned, 128, 4> Sort;
    __shared__ typename Sort::TempStorage tmp;
    unsigned keys[4];
    for (int i = 0; i < 4; ++i) keys[i] = in[threadIdx.x * 4 + i];
    Sort(tmp).Sort(keys);
    for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = keys[i];
}
"""


def test_cub_block_primitives(device, toolkit):
    mod = device.load(toolkit.ptx(CUB_SOURCE))
    rng = np.random.default_rng(12)
    x = rng.integers(-100, 100, 512).astype(np.int32)
    out = device.zeros(4, np.int32)
    device.launch(mod, "block_reduce", (4,), (128,), device.upload(x), out)
    np.testing.assert_array_equal(device.download(out, 4, np.int32), x.reshape(4, 128).sum(1))
    out = device.zeros(128, np.int32)
    device.launch(mod, "block_scan", (1,), (128,), device.upload(x), out)
    np.testing.assert_array_equal(device.download(out, 128, np.int32),
                                  np.concatenate([[0], np.cumsum(x[:127])]))
    keys = rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32)
    out = device.zeros(512, np.uint32)
    device.launch(mod, "block_sort", (1,), (128,), device.upload(keys), out)
    np.testing.assert_array_equal(device.download(out, 512, np.uint32), np.sort(keys))


GROUPS_SOURCE = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
extern "C" __global__ void tiles(const int* in, int* sums, int* ranks) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<16> tile = cg::tiled_partition<16>(block);
    int v = in[block.thread_rank()];
    int s = cg::reduce(tile, v, cg::plus<int>());
    block.sync();
    if (tile.thread_rank() == 0) sums[block.thread_rank() / 16] = s;
    if (v & 1) {
        cg::coalesced_group odd = cg::coalesced_threads();
        ranks[block.thread_rank()] = odd.size() * 1000 + odd.thread_rank();
    } else {
        ranks[block.thread_rank()] = -1;
    }
}
"""


@pytest.mark.parametrize("arch", ["compute_75", "compute_80"])
def test_cooperative_groups_tiles(device, toolkit, arch):
    ptx = toolkit.ptx(GROUPS_SOURCE, arch=arch)
    mod = device.load(ptx)
    x = np.random.default_rng(13).integers(0, 100, 64).astype(np.int32)
    sums, ranks = device.zeros(4, np.int32), device.zeros(64, np.int32)
    device.launch(mod, "tiles", (1,), (64,), device.upload(x), sums, ranks)
    np.testing.assert_array_equal(device.download(sums, 4, np.int32), x.reshape(4, 16).sum(1))
    expected = np.full(64, -1)
    for w in range(2):
        odd = np.flatnonzero(x[32 * w:32 * w + 32] & 1) + 32 * w
        expected[odd] = len(odd) * 1000 + np.arange(len(odd))
    np.testing.assert_array_equal(device.download(ranks, 64, np.int32), expected)


def test_debug_build_runs_the_same(device, toolkit):
    """-G PTX: unoptimized code, debug sections, everything through local memory."""
    mod = device.load(toolkit.ptx(SOURCE, flags=["-G"]))
    n = 300
    start = np.arange(1, n + 1, dtype=np.uint32)
    steps = device.zeros(n, np.int32)
    device.launch(mod, "collatz", (3,), (128,), device.upload(start), steps, n)
    np.testing.assert_array_equal(device.download(steps, n, np.int32),
                                  [collatz_steps(int(v)) for v in start])
    v = np.arange(-50, 50, dtype=np.int32)
    outs = [device.zeros(100, d) for d in (np.int32, np.float32, np.int32, np.float32)]
    device.launch(mod, "calls", (1,), (128,), device.upload(v), *outs, 100)
    check_calls(device, outs, v)
