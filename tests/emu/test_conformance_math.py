"""Math-heavy CUDA C kernels: libdevice single/double precision functions, half precision
conversions, integer intrinsics. libdevice results are compared with numpy within a few
ulps (they are correctly rounded or close to it on the GPU too)."""

from __future__ import annotations

import numpy as np
import pytest

SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" {
__global__ void double_math(const double* x, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double v = x[i];
    out[8 * i + 0] = sqrt(v);
    out[8 * i + 1] = exp(v);
    out[8 * i + 2] = sin(v);
    out[8 * i + 3] = cos(v);
    out[8 * i + 4] = log(v);
    out[8 * i + 5] = pow(v, 1.7);
    out[8 * i + 6] = tanh(v);
    out[8 * i + 7] = atan2(v, 1.5) + cbrt(v) + 1.0 / v;
}
__global__ void float_math(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    out[8 * i + 0] = sqrtf(v);
    out[8 * i + 1] = expf(v);
    out[8 * i + 2] = sinf(v);
    out[8 * i + 3] = logf(v);
    out[8 * i + 4] = powf(v, 2.5f);
    out[8 * i + 5] = tanhf(v);
    out[8 * i + 6] = v / 3.0f;
    out[8 * i + 7] = rsqrtf(v);
}
__global__ void fast_math(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    out[4 * i + 0] = __expf(v);
    out[4 * i + 1] = __sinf(v);
    out[4 * i + 2] = __logf(v);
    out[4 * i + 3] = __fdividef(v, 7.0f);
}
__global__ void rounding_intrinsics(const float* a, const float* b, float* out, int* iout,
                                    int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i], y = b[i];
    out[6 * i + 0] = __fadd_rz(x, y);
    out[6 * i + 1] = __fadd_rd(x, y);
    out[6 * i + 2] = __fmul_ru(x, y);
    out[6 * i + 3] = __fdiv_rz(x, y);
    out[6 * i + 4] = __fmaf_rd(x, y, 1.0f);
    out[6 * i + 5] = __fsqrt_ru(fabsf(x));
    iout[4 * i + 0] = __float2int_rn(x * 100.0f);
    iout[4 * i + 1] = __float2int_rz(x * 100.0f);
    iout[4 * i + 2] = __float2int_rd(x * 100.0f);
    iout[4 * i + 3] = __float2int_ru(x * 100.0f);
}
__global__ void halves(const float* x, float* back, unsigned short* bits, float* bf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half h = __float2half(x[i]);
    back[i] = __half2float(h);
    bits[i] = __half_as_ushort(h);
    __nv_bfloat16 b = __float2bfloat16(x[i]);
    bf[i] = __bfloat162float(b);
}
__global__ void half_arith(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half a = __float2half(x[i]), b = __float2half(1.5f);
    out[3 * i + 0] = __half2float(__hadd(a, b));
    out[3 * i + 1] = __half2float(__hmul(a, b));
    out[3 * i + 2] = __half2float(__hfma(a, b, a));
}
__global__ void int_intrinsics(const unsigned* a, const unsigned* b, unsigned* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = a[i], y = b[i];
    out[10 * i + 0] = __popc(x);
    out[10 * i + 1] = __clz(x);
    out[10 * i + 2] = __brev(x);
    out[10 * i + 3] = __byte_perm(x, y, 0x5140);
    out[10 * i + 4] = __funnelshift_l(x, y, i);
    out[10 * i + 5] = __funnelshift_r(x, y, i);
    out[10 * i + 6] = __umulhi(x, y);
    unsigned long long xy = ((unsigned long long)x << 32) | y;
    out[10 * i + 7] = (unsigned)(__umul64hi(xy, 0x9E3779B97F4A7C15ull) >> 7);
    out[10 * i + 8] = __ffs(x) + __popcll(((unsigned long long)y << 32) | x);
    out[10 * i + 9] = __sad(x, y, 3u) + __usad(y, x, 5u);
}
__global__ void int_division(const int* a, const int* b, int* q, int* r, unsigned* uq,
                             unsigned* ur, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    q[i] = a[i] / b[i];
    r[i] = a[i] % b[i];
    uq[i] = (unsigned)a[i] / (unsigned)b[i];
    ur[i] = (unsigned)a[i] % (unsigned)b[i];
}
__global__ void conversions(const double* x, long long* ll, unsigned long long* ull, float* f,
                            double* back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    ll[i] = (long long)x[i];
    ull[i] = (unsigned long long)x[i];
    f[i] = (float)x[i];
    back[i] = (double)(long long)(x[i] * 1e6) + (double)(float)ll[i];
}
}
"""


@pytest.fixture(scope="module")
def ptx(toolkit):
    return toolkit.ptx(SOURCE)


@pytest.fixture
def mod(device, ptx):
    return device.load(ptx)


def test_double_precision_libdevice(device, mod):
    x = np.linspace(0.05, 20.0, 300)
    out = device.zeros(8 * len(x), np.float64)
    device.launch(mod, "double_math", (3,), (128,), device.upload(x), out, len(x))
    got = device.download(out, 8 * len(x), np.float64).reshape(-1, 8)
    expected = np.stack([np.sqrt(x), np.exp(x), np.sin(x), np.cos(x), np.log(x), x ** 1.7,
                         np.tanh(x), np.arctan2(x, 1.5) + np.cbrt(x) + 1.0 / x], axis=1)
    np.testing.assert_array_equal(got[:, 0], expected[:, 0])  # sqrt.rn is exact
    np.testing.assert_allclose(got, expected, rtol=4e-16 * 4, atol=1e-15)


def test_single_precision_libdevice(device, mod):
    x = np.linspace(0.1, 9.0, 200).astype(np.float32)
    out = device.zeros(8 * len(x), np.float32)
    device.launch(mod, "float_math", (2,), (128,), device.upload(x), out, len(x))
    got = device.download(out, 8 * len(x), np.float32).reshape(-1, 8)
    x64 = x.astype(np.float64)
    expected = np.stack([np.sqrt(x64), np.exp(x64), np.sin(x64), np.log(x64), x64 ** 2.5,
                         np.tanh(x64), x64 / 3.0, 1 / np.sqrt(x64)], axis=1)
    np.testing.assert_array_equal(got[:, 0], np.sqrt(x))
    np.testing.assert_array_equal(got[:, 6], x / np.float32(3))
    np.testing.assert_allclose(got, expected, rtol=3e-7)


def test_fast_math_intrinsics(device, mod, ptx):
    assert "ex2.approx" in ptx and "sin.approx" in ptx
    x = np.linspace(0.5, 3.0, 64).astype(np.float32)
    out = device.zeros(4 * len(x), np.float32)
    device.launch(mod, "fast_math", (1,), (64,), device.upload(x), out, len(x))
    got = device.download(out, 4 * len(x), np.float32).reshape(-1, 4)
    expected = np.stack([np.exp(x), np.sin(x), np.log(x), x / 7], axis=1)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


def test_directed_rounding_intrinsics(device, mod):
    from fractions import Fraction
    rng = np.random.default_rng(3)
    n = 256
    a = (rng.standard_normal(n) * 10).astype(np.float32)
    b = (rng.standard_normal(n) * 3).astype(np.float32)
    out = device.zeros(6 * n, np.float32)
    iout = device.zeros(4 * n, np.int32)
    device.launch(mod, "rounding_intrinsics", (2,), (128,), device.upload(a), device.upload(b),
                  out, iout, n)
    got = device.download(out, 6 * n, np.float32).reshape(-1, 6)

    def directed(exact: Fraction, mode: str) -> np.float32:
        near = np.float32(float(exact))
        if Fraction(float(near)) == exact:
            return near
        lower = near if Fraction(float(near)) < exact else np.nextafter(near, np.float32(-np.inf))
        upper = np.nextafter(lower, np.float32(np.inf))
        if mode == "rz":
            return lower if exact > 0 else upper
        return lower if mode == "rd" else upper
    for k in range(n):
        x, y = Fraction(float(a[k])), Fraction(float(b[k]))
        assert got[k, 0] == directed(x + y, "rz")
        assert got[k, 1] == directed(x + y, "rd")
        assert got[k, 2] == directed(x * y, "ru")
        assert got[k, 3] == directed(x / y, "rz")
        assert got[k, 4] == directed(x * y + 1, "rd")
    sq = got[:, 5].astype(np.float64)
    below = np.nextafter(got[:, 5], np.float32(0)).astype(np.float64)
    assert (sq ** 2 >= np.abs(a).astype(np.float64)).all()
    assert (below ** 2 < np.abs(a).astype(np.float64)).all()
    ints = device.download(iout, 4 * n, np.int32).reshape(-1, 4)
    scaled = (a * np.float32(100)).astype(np.float64)
    np.testing.assert_array_equal(ints[:, 0], np.rint(scaled))
    np.testing.assert_array_equal(ints[:, 1], np.trunc(scaled))
    np.testing.assert_array_equal(ints[:, 2], np.floor(scaled))
    np.testing.assert_array_equal(ints[:, 3], np.ceil(scaled))


def test_half_and_bfloat16_conversions(device, mod):
    x = np.concatenate([np.random.default_rng(4).standard_normal(200).astype(np.float32) * 100,
                        np.array([65504, 65520, 1e-8, -0.0, np.inf, np.nan, 3.0e-5, 2 ** -24],
                                 np.float32)])
    n = len(x)
    back, bits, bf = device.zeros(n, np.float32), device.zeros(n, np.uint16), \
        device.zeros(n, np.float32)
    device.launch(mod, "halves", (1,), (256,), device.upload(x), back, bits, bf, n)
    with np.errstate(over="ignore"):
        half = x.astype(np.float16)
    np.testing.assert_array_equal(device.download(back, n, np.float32), half.astype(np.float32))
    got_bits = device.download(bits, n, np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got_bits[finite], half.view(np.uint16)[finite])
    # bfloat16: round to nearest even on the upper 16 bits
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    expected = np.where(np.isnan(x), np.nan, rounded.astype(np.uint32).view(np.float32))
    np.testing.assert_array_equal(device.download(bf, n, np.float32), expected)


def test_half_arithmetic(device, mod):
    x = np.linspace(-4, 4, 64).astype(np.float32)
    out = device.zeros(3 * len(x), np.float32)
    device.launch(mod, "half_arith", (1,), (64,), device.upload(x), out, len(x))
    got = device.download(out, 3 * len(x), np.float32).reshape(-1, 3)
    h = x.astype(np.float16).astype(np.float64)
    expected = np.stack([(h + 1.5), (h * 1.5), (h * 1.5 + h)], 1).astype(np.float16)
    np.testing.assert_array_equal(got, expected.astype(np.float32))


def test_integer_intrinsics(device, mod):
    rng = np.random.default_rng(5)
    n = 64
    a = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    a[0] = 0
    out = device.zeros(10 * n, np.uint32)
    device.launch(mod, "int_intrinsics", (1,), (64,), device.upload(a), device.upload(b), out, n)
    got = device.download(out, 10 * n, np.uint32).reshape(-1, 10)
    def signed(v):
        return v - (1 << 32) if v >> 31 else v
    for i in range(n):
        x, y = int(a[i]), int(b[i])
        pool = x | (y << 32)
        perm = 0
        for k, sel in enumerate((0x0, 0x4, 0x1, 0x5)):
            perm |= ((pool >> (8 * sel)) & 0xFF) << (8 * k)
        both = (y << 32) | x
        s = i & 31
        expected = [
            bin(x).count("1"), 32 - x.bit_length(), int(f"{x:032b}"[::-1], 2), perm,
            ((both << s) >> 32) & 0xFFFFFFFF, (both >> s) & 0xFFFFFFFF, (x * y) >> 32,
            ((((x << 32) | y) * 0x9E3779B97F4A7C15) >> 64 >> 7) & 0xFFFFFFFF,
            ((x & -x).bit_length() if x else 0) + bin((y << 32) | x).count("1"),
            (abs(signed(x) - signed(y)) + 3 + abs(y - x) + 5) & 0xFFFFFFFF,
        ]
        np.testing.assert_array_equal(got[i], expected, err_msg=f"lane {i}")


def test_integer_division_including_by_zero(device, mod):
    a = np.array([7, -7, 7, -7, 2**31 - 1, -2**31, -2**31, 5, -5, 0, 123, -9], np.int32)
    b = np.array([2, 2, -2, -2, 1, -1, 1, 0, 0, 0, 10, 4], np.int32)
    n = len(a)
    q, r, uq, ur = (device.zeros(n, d) for d in (np.int32, np.int32, np.uint32, np.uint32))
    device.launch(mod, "int_division", (1,), (32,), device.upload(a), device.upload(b),
                  q, r, uq, ur, n)
    nz = b != 0
    tq = np.zeros(n, np.int64)
    tq[nz] = np.trunc(a[nz].astype(np.float64) / b[nz])
    tq = np.where(tq == 2**31, -2**31, tq)
    got_q = device.download(q, n, np.int32)
    np.testing.assert_array_equal(got_q[nz], tq[nz])
    np.testing.assert_array_equal(got_q[~nz], np.where(a[~nz] < 0, 1, -1))
    got_r = device.download(r, n, np.int32)
    np.testing.assert_array_equal(got_r[nz], np.fmod(a[nz].astype(np.int64), b[nz]))
    np.testing.assert_array_equal(got_r[~nz], a[~nz])
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    got_uq = device.download(uq, n, np.uint32)
    np.testing.assert_array_equal(got_uq[nz], ua[nz] // ub[nz])
    assert (got_uq[~nz] == 0xFFFFFFFF).all()
    got_ur = device.download(ur, n, np.uint32)
    np.testing.assert_array_equal(got_ur, np.where(nz, ua % np.where(nz, ub, 1), ua))


def test_double_integer_conversions(device, mod):
    x = np.array([1.9, -1.9, 3e9, -3e9, 1e19, -1e19, 2e19, np.nan, np.inf, -np.inf, 0.5,
                  9.2e18, 123456.789])
    n = len(x)
    ll, ull, f, back = (device.zeros(n, d) for d in (np.int64, np.uint64, np.float32,
                                                       np.float64))
    device.launch(mod, "conversions", (1,), (32,), device.upload(x), ll, ull, f, back, n)
    imax, imin = 2**63 - 1, -2**63
    exp_ll = [0 if np.isnan(v) else imax if v >= 2**63 else imin if v < -2**63 else int(v)
              for v in x]
    exp_ull = [0 if np.isnan(v) or v < 0 else 2**64 - 1 if v >= 2**64 else int(v) for v in x]
    np.testing.assert_array_equal(device.download(ll, n, np.int64), exp_ll)
    assert [int(v) for v in device.download(ull, n, np.uint64)] == exp_ull
    np.testing.assert_array_equal(device.download(f, n, np.float32), x.astype(np.float32))
    # back = (double)(long long)(x * 1e6) + (double)(float)ll: saturating conversions, each
    # int -> float conversion rounded once (numpy's int64 casts round to nearest even).
    scaled = [0 if np.isnan(v) else imax if v >= 2**63 else imin if v < -2**63 else int(v)
              for v in x * 1e6]
    exp_back = (np.array(scaled, np.int64).astype(np.float64)
                + np.array(exp_ll, np.int64).astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(device.download(back, n, np.float64), exp_back)


SM80_SOURCE = r"""
#include <cuda_pipeline.h>
#include <cuda_fp16.h>
extern "C" __global__ void async_copy(const float4* in, float4* out) {
    __shared__ float4 s[64];
    __pipeline_memcpy_async(&s[threadIdx.x], &in[threadIdx.x], sizeof(float4));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    out[threadIdx.x] = s[63 - threadIdx.x];
}
extern "C" __global__ void half2_math(__half2* a, const __half2* b, float* o) {
    int i = threadIdx.x;
    __half2 c = __hfma2(a[i], b[i], a[i]);
    c = __hmax2(c, __hneg2(b[i]));
    o[2 * i] = __low2float(c);
    o[2 * i + 1] = __high2float(c);
    __syncthreads();
    atomicAdd(&a[0], b[i]);
}
extern "C" __global__ void warp_reduce_builtin(const unsigned* in, unsigned* out) {
    unsigned v = in[threadIdx.x];
    out[threadIdx.x] = __reduce_add_sync(0xffffffffu, v) + __reduce_max_sync(0xffffffffu, v);
}
"""


@pytest.fixture(scope="module")
def sm80_ptx(toolkit):
    return toolkit.ptx(SM80_SOURCE, arch="compute_80")


def test_async_copy_to_shared(device, sm80_ptx):
    assert "cp.async" in sm80_ptx
    mod = device.load(sm80_ptx)
    x = np.arange(256, dtype=np.float32)
    out = device.zeros(256, np.float32)
    device.launch(mod, "async_copy", (1,), (64,), device.upload(x), out)
    np.testing.assert_array_equal(device.download(out, 256, np.float32).reshape(64, 4),
                                  x.reshape(64, 4)[::-1])


def test_half2_arithmetic_and_atomics(device, sm80_ptx):
    mod = device.load(sm80_ptx)
    a = np.array([1.5, -2, 0.25, 3] * 8, np.float16)
    b = np.array([0.5, 4, -1, 2] * 8, np.float16)
    pa, out = device.upload(a), device.zeros(32, np.float32)
    device.launch(mod, "half2_math", (1,), (16,), pa, device.upload(b), out)
    A, B = a.astype(np.float64), b.astype(np.float64)
    fused = (A * B + A).astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(device.download(out, 32, np.float32),
                                  np.maximum(fused, -B).astype(np.float32))
    np.testing.assert_array_equal(device.download(pa, 2, np.float16), [1.5 - 4, -2 + 48])


def test_warp_reduce_builtins(device, sm80_ptx):
    mod = device.load(sm80_ptx)
    x = np.random.default_rng(2).integers(0, 1 << 20, 64).astype(np.uint32)
    out = device.zeros(64, np.uint32)
    device.launch(mod, "warp_reduce_builtin", (1,), (64,), device.upload(x), out)
    expected = np.repeat([x[:32].sum() + x[:32].max(), x[32:].sum() + x[32:].max()], 32)
    np.testing.assert_array_equal(device.download(out, 64, np.uint32), expected)
