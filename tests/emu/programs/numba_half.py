"""numba-cuda half-precision kernels: numba links cuda_fp16's functions (whose PTX declares
registers as `.reg.b16`), and every fp16 kernel of the process must keep working."""

import math

import numpy as np
from numba import cuda
from numba.cuda import fp16


@cuda.jit
def half_arith(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fp16.hfma(a[i], b[i], fp16.hadd(a[i], b[i]))


@cuda.jit
def half_exp(out, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fp16.hexp(a[i])


n = 200
a = (np.arange(n) * 0.01 - 1).astype(np.float16)
b = (np.arange(n)[::-1] * 0.02 - 2).astype(np.float16)
for _ in range(2):  # later launches of the process as well
    out = cuda.device_array(n, np.float16)
    half_arith[1, 256](out, cuda.to_device(a), cuda.to_device(b))
    got = out.copy_to_host()
    s = (a.astype(np.float64) + b).astype(np.float16)
    expected = (a.astype(np.float64) * b + s).astype(np.float16)  # one rounding: fused
    assert np.array_equal(got, expected), (got, expected)
    half_exp[1, 256](out, cuda.to_device(a))
    got = out.copy_to_host().astype(np.float64)
    exact = np.exp(a.astype(np.float64))
    ulp = np.array([math.ulp(float(np.float16(v))) for v in exact]) * 2.0 ** 42  # half ulps
    assert np.all(np.abs(got - exact) <= ulp), np.max(np.abs(got - exact) / ulp)
print(f"numba_half: {2 * n} fp16 results correct, twice")
