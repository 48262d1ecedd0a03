"""numba-cuda's managed arrays (cuda.managed_array) under vgpu: numpy on the host and a kernel
on the device work on one allocation; each side sees the other's writes once the host has
synchronized. Prints one line when every value is right."""

import numpy as np
from numba import cuda


@cuda.jit
def affine(a, scale, shift):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] * scale + shift


n = 1000
a = cuda.managed_array(n, dtype=np.int64)
a[:] = np.arange(n)
affine[(n + 255) // 256, 256](a, 3, 1)
cuda.synchronize()
expected = np.arange(n) * 3 + 1
assert (np.asarray(a) == expected).all(), np.asarray(a)[:8]
a[::2] = -a[::2]
affine[(n + 255) // 256, 256](a, 2, 0)
cuda.synchronize()
expected[::2] = -expected[::2]
assert (np.asarray(a) == expected * 2).all(), np.asarray(a)[:8]
print(f"numba_managed: {n} values right after two rounds")
