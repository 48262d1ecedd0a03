"""An unmodified cuda-python program: vector addition through the CUDA driver API.

It knows nothing of vgpu. Run it on a GPU as it is, or through vgpu:

    vgpu run -- python examples/vector_add.py

The kernel ships as PTX (what `nvcc -ptx -arch=compute_75` makes of the CUDA C below), so no
compiler is needed to run it.

    extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) c[i] = a[i] + b[i];
    }
"""

import sys

import numpy as np
from cuda.bindings import driver as cu

PTX = b"""
.version 9.0
.target sm_75
.address_size 64

.visible .entry vector_add(
    .param .u64 vector_add_param_0,
    .param .u64 vector_add_param_1,
    .param .u64 vector_add_param_2,
    .param .u32 vector_add_param_3
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [vector_add_param_0];
    ld.param.u64 %rd2, [vector_add_param_1];
    ld.param.u64 %rd3, [vector_add_param_2];
    ld.param.u32 %r2, [vector_add_param_3];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.s32 %p1, %r1, %r2;
    @%p1 bra $L__BB0_2;
    cvta.to.global.u64 %rd4, %rd1;
    mul.wide.s32 %rd5, %r1, 4;
    add.s64 %rd6, %rd4, %rd5;
    cvta.to.global.u64 %rd7, %rd2;
    add.s64 %rd8, %rd7, %rd5;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd6];
    add.f32 %f3, %f2, %f1;
    cvta.to.global.u64 %rd9, %rd3;
    add.s64 %rd10, %rd9, %rd5;
    st.global.f32 [%rd10], %f3;
$L__BB0_2:
    ret;
}
\0"""


def check(result):
    """cuda-python returns (error, *values); stop with CUDA's own error name on failure."""
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        name = cu.cuGetErrorName(err)[1]
        sys.exit(f"CUDA error: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


def main() -> None:
    n = 1 << 20
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    name = check(cu.cuDeviceGetName(64, device)).split(b"\0")[0].decode()
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    module = check(cu.cuModuleLoadData(PTX))
    kernel = check(cu.cuModuleGetFunction(module, b"vector_add"))

    a = np.random.default_rng(0).random(n, dtype=np.float32)
    b = np.random.default_rng(1).random(n, dtype=np.float32)
    c = np.zeros_like(a)
    da, db, dc = (check(cu.cuMemAlloc(a.nbytes)) for _ in range(3))
    check(cu.cuMemcpyHtoD(da, a.ctypes.data, a.nbytes))
    check(cu.cuMemcpyHtoD(db, b.ctypes.data, b.nbytes))

    args = [np.array([int(p)], dtype=np.uint64) for p in (da, db, dc)]
    args.append(np.array([n], dtype=np.int32))
    params = np.array([arg.ctypes.data for arg in args], dtype=np.uint64)
    threads = 256
    check(cu.cuLaunchKernel(kernel, (n + threads - 1) // threads, 1, 1, threads, 1, 1, 0, 0,
                            params.ctypes.data, 0))
    check(cu.cuCtxSynchronize())
    check(cu.cuMemcpyDtoH(c.ctypes.data, dc, c.nbytes))

    assert np.array_equal(c, a + b), "wrong result"
    print(f"vector_add of {n} floats on '{name}': correct")
    for p in (da, db, dc):
        check(cu.cuMemFree(p))
    check(cu.cuDevicePrimaryCtxRelease(device))


if __name__ == "__main__":
    main()
