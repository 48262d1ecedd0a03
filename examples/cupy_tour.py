"""CuPy (whose wheel links NVIDIA's runtime statically) on vgpu: elementwise and reduction
kernels, user kernels of each kind, indexing, sorting, random numbers (the Generator API:
CuPy's own kernels), streams and events, pinned memory and the memory pool. Prints one line
per feature; exits 0 when all are right. What needs NVIDIA's math libraries fails naming the
library: cuBLAS here, and cuRAND's host library, behind the legacy RandomState, which hands
the driver only the cubin for the device's compute capability (its PTX is for GPUs it has
no cubin for), which the emulator cannot run.

On the emu backend, with cupy-cuda13x installed:

    vgpu run -- python examples/cupy_tour.py

CuPy asks NVRTC for cubins, which the emulator cannot run; vgpu's libnvrtc.so.13 hands them
back with their PTX, which it runs. CUB's and Thrust's modules (20-30 MB of PTX each) load
lazily: only the kernels a program launches are compiled. The run takes about half a
minute on two busy cores (it took four to five before lazy loading).
"""

import cupy as cp
import numpy as np

HOST = np.arange(12, dtype=np.float32).reshape(3, 4)


def user_kernels() -> bool:
    x = cp.asarray(HOST)
    mul_add = cp.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a * b + 1",
                                   "mul_add")
    squares = cp.ReductionKernel("float32 a", "float32 s", "a * a", "a + b", "s = a", "0",
                                 "sum_squares")
    raw = cp.RawKernel(r"""extern "C" __global__ void twice(float *p, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] *= 2; }""", "twice")
    ones = cp.ones(100, dtype=cp.float32)
    raw((1,), (128,), (ones, cp.int32(100)))
    module = cp.RawModule(code=r'extern "C" __global__ void inc(int *p) { p[threadIdx.x] += 1; }')
    counts = cp.zeros(8, dtype=cp.int32)
    module.get_function("inc")((1,), (8,), (counts,))
    return (np.array_equal(mul_add(x, x).get(), HOST * HOST + 1)
            and float(squares(x)) == float((HOST * HOST).sum())
            and float(ones.sum()) == 200 and counts.get().tolist() == [1] * 8)


def streams_and_pinned() -> bool:
    stream, done = cp.cuda.Stream(), cp.cuda.Event()
    with stream:
        thrice = cp.arange(5) * 3
        done.record(stream)
    done.synchronize()
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(64), np.float32, 16)
    pinned[:] = 7
    return thrice.get().tolist() == [0, 3, 6, 9, 12] and float(cp.asarray(pinned).sum()) == 112


def main() -> None:
    x = cp.asarray(HOST)
    checks = {
        "elementwise": lambda: np.allclose((cp.sin(x) * 2 + x).get(), np.sin(HOST) * 2 + HOST),
        "reductions": lambda: float(x.sum()) == 66 and x.max(axis=0).get().tolist() == [8, 9,
                                                                                      10, 11],
        "user kernels": user_kernels,
        "indexing": lambda: x[1, 2:].get().tolist() == [6, 7] and float(x[x > 9].sum()) == 21,
        "sorting": lambda: cp.sort(cp.array([3, 1, 2])).get().tolist() == [1, 2, 3]
        and cp.argsort(cp.array([3.0, 1.0, 2.0])).get().tolist() == [1, 2, 0],
        "random": lambda: 0.4 < float(cp.random.default_rng(1).random(1000).mean()) < 0.6,
        "streams, events and pinned memory": streams_and_pinned,
        "memory pool": lambda: cp.get_default_memory_pool().used_bytes() > 0,
    }
    failed = [name for name, check in checks.items() if not check()]
    for name in checks:
        print(f"cupy: {name} {'WRONG' if name in failed else 'correct'}")
    try:
        x @ x.T
        print("cupy: matrix multiply ran")
    except Exception as exc:  # cuBLAS: absent, or its kernels without PTX
        print(f"cupy: matrix multiply refused: {str(exc).splitlines()[0]}")
    try:
        float(cp.random.RandomState(1).random_sample(16).sum())
        print("cupy: legacy random ran")
    except Exception as exc:  # cuRAND's host library: absent, or its kernels without PTX
        print(f"cupy: legacy random refused: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
