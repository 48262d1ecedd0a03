"""An unmodified numba-cuda program: y = a*x + y on the GPU (run it with `vgpu run`).

numba compiles the kernel to PTX itself and drives the CUDA driver API (cuLinkCreate,
cuModuleLoadData, cuLaunchKernel, ...), which is what vgpu's libcuda answers.
"""

import numpy as np
from numba import cuda


@cuda.jit
def axpy(r, a, x, y):
    i = cuda.grid(1)
    if i < r.size:
        r[i] = a * x[i] + y[i]

n = 100000
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
r = cuda.device_array_like(x)
axpy[(n + 255) // 256, 256](r, np.float32(2.0), cuda.to_device(x), cuda.to_device(y))
out = r.copy_to_host()
assert np.allclose(out, 2 * x + y)
print("numba axpy ok on", cuda.get_current_device().name)
