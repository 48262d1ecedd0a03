"""cuda-python's cuda.bindings.runtime (NVIDIA's runtime, linked into the bindings): device
queries, memory, copies, a memset, streams, events and a kernel from a library loaded at run
time. Exits 0 only when every result is right."""

import numpy as np
from cuda.bindings import driver, nvrtc
from cuda.bindings import runtime as rt

SOURCE = b'extern "C" __global__ void scale(float *x, float a, int n) {' \
         b' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }'


def ok(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def ptx() -> bytes:
    program = ok(nvrtc.nvrtcCreateProgram(SOURCE, b"scale.cu", 0, [], []))
    ok(nvrtc.nvrtcCompileProgram(program, 1, [b"--gpu-architecture=compute_75"]))
    text = b" " * ok(nvrtc.nvrtcGetPTXSize(program))
    ok(nvrtc.nvrtcGetPTX(program, text))
    return text


def main() -> None:
    assert ok(rt.cudaGetDeviceCount()) == 1
    ok(rt.cudaSetDevice(0))
    prop = ok(rt.cudaGetDeviceProperties(0))
    assert prop.warpSize == 32 and prop.maxThreadsPerBlock >= 256
    assert ok(rt.cudaDriverGetVersion()) >= 13000

    n = 300
    host = np.arange(n, dtype=np.float32)
    device = ok(rt.cudaMalloc(host.nbytes))
    ok(rt.cudaMemset(device, 0, host.nbytes))
    zeros = np.ones_like(host)
    ok(rt.cudaMemcpy(zeros.ctypes.data, device, host.nbytes,
                     rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    assert not zeros.any()
    ok(rt.cudaMemcpy(device, host.ctypes.data, host.nbytes,
                     rt.cudaMemcpyKind.cudaMemcpyHostToDevice))

    stream = ok(rt.cudaStreamCreate())
    start, end = ok(rt.cudaEventCreate()), ok(rt.cudaEventCreate())
    library = ok(rt.cudaLibraryLoadData(ptx(), None, None, 0, None, None, 0))
    kernel = ok(rt.cudaLibraryGetKernel(library, b"scale"))
    ok(rt.cudaEventRecord(start, stream))
    args = (np.array([int(device)], dtype=np.uint64), np.array([2.5], dtype=np.float32),
            np.array([n], dtype=np.int32))
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    # The runtime launches host stubs; a kernel from a library goes through the driver call.
    ok(driver.cuLaunchKernel(driver.CUfunction(int(kernel)), 2, 1, 1, 256, 1, 1, 0,
                             driver.CUstream(int(stream)), params.ctypes.data, 0))
    ok(rt.cudaEventRecord(end, stream))
    result = np.empty_like(host)
    ok(rt.cudaMemcpyAsync(result.ctypes.data, device, host.nbytes,
                          rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream))
    ok(rt.cudaStreamSynchronize(stream))
    ok(rt.cudaEventQuery(end))  # complete once the stream is
    assert ok(rt.cudaEventElapsedTime(start, end)) >= 0
    np.testing.assert_array_equal(result, host * 2.5)

    for event in (start, end):
        ok(rt.cudaEventDestroy(event))
    ok(rt.cudaStreamDestroy(stream))
    ok(rt.cudaLibraryUnload(library))
    ok(rt.cudaFree(device))
    ok(rt.cudaDeviceSynchronize())
    print("bindings_runtime: queries, memory, streams, events and a library kernel correct")


if __name__ == "__main__":
    main()
