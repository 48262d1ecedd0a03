"""PTX from numba-cuda (NVVM, `compile_ptx` needs no GPU) runs on the emulator.

numba passes each array as seven parameters: meminfo, parent, nitems, itemsize, data,
shape[0], strides[0].
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import cuda, float32, float64, int32  # the test extra installs numba-cuda


def array_args(device, array: np.ndarray) -> list[int]:
    address = device.upload(array)
    return [0, 0, array.size, array.itemsize, address, array.size, array.itemsize]


def compile_kernel(device, fn, signature):
    ptx, _ = cuda.compile_ptx(fn, signature, cc=(7, 5))
    mod = device.load(ptx)
    (name,) = mod.kernels
    return mod, name


def axpy(r, a, x, y):
    i = cuda.grid(1)
    if i < r.size:
        r[i] = a * x[i] + y[i]


def test_numba_axpy(device):
    mod, name = compile_kernel(device, axpy,
                               (float32[::1], float32, float32[::1], float32[::1]))
    n = 1000
    x = np.random.default_rng(1).random(n, np.float32)
    y = np.random.default_rng(2).random(n, np.float32)
    r = array_args(device, np.zeros(n, np.float32))
    device.launch(mod, name, (4,), (256,), *r, np.float32(2.0), *array_args(device, x),
                  *array_args(device, y))
    got = device.download(r[4], n, np.float32)
    np.testing.assert_array_equal(got, (np.float64(2.0) * x + y).astype(np.float32))


def block_sum(x, out):
    s = cuda.shared.array(128, dtype=float64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    s[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    k = 64
    while k > 0:
        if t < k:
            s[t] += s[t + k]
        cuda.syncthreads()
        k //= 2
    if t == 0:
        cuda.atomic.add(out, 0, s[0])


def test_numba_shared_memory_reduction_and_atomics(device):
    mod, name = compile_kernel(device, block_sum, (float64[::1], float64[::1]))
    n = 1000
    x = np.random.default_rng(3).random(n)
    out = array_args(device, np.zeros(1))
    device.launch(mod, name, (8,), (128,), *array_args(device, x), *out)
    assert device.download(out[4], 1, np.float64)[0] == pytest.approx(x.sum(), rel=1e-12)


def math_kernel(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(a[i] * a[i] + b[i] * b[i]) * 0.5 + math.sin(a[i])


def test_numba_math(device):
    mod, name = compile_kernel(device, math_kernel, (float32[::1], float32[::1], float32[::1]))
    n = 64
    a = np.linspace(0, 3, n).astype(np.float32)
    b = np.linspace(1, 2, n).astype(np.float32)
    out = array_args(device, np.zeros(n, np.float32))
    device.launch(mod, name, (1,), (64,), *out, *array_args(device, a), *array_args(device, b))
    expected = np.hypot(a, b) * 0.5 + np.sin(a)
    np.testing.assert_allclose(device.download(out[4], n, np.float32), expected, rtol=2e-6)


def histogram(data, bins):
    i = cuda.grid(1)
    if i < data.size:
        cuda.atomic.add(bins, data[i] % bins.size, 1)


def test_numba_integer_atomics(device):
    mod, name = compile_kernel(device, histogram, (int32[::1], int32[::1]))
    data = np.random.default_rng(4).integers(0, 1000, 3000).astype(np.int32)
    bins = array_args(device, np.zeros(10, np.int32))
    device.launch(mod, name, (12,), (256,), *array_args(device, data), *bins)
    np.testing.assert_array_equal(device.download(bins[4], 10, np.int32),
                                  np.bincount(data % 10, minlength=10))
