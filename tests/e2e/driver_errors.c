/* Bad input through the driver API must get CUDA's own error codes, never a crash.
 * Prints one line per check: "name got expected". Usage: driver_errors KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include "test_files.h"

static int failures = 0;
static void expect(const char *what, CUresult got, CUresult want) {
    printf("%s %d %d\n", what, got, want);
    if (got != want) failures++;
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod, stale_mod; CUfunction fn;
    CUdeviceptr d, freed; CUstream stream; CUevent event;
    char host[256] = {0};
    char *ptx = read_file(argv[1]);

    expect("before_init", cuMemAlloc(&d, 16), CUDA_ERROR_NOT_INITIALIZED);
    expect("init", cuInit(0), CUDA_SUCCESS);
    expect("bad_device", cuDeviceGet(&dev, 7), CUDA_ERROR_INVALID_DEVICE);
    expect("no_context", cuMemAlloc(&d, 16), CUDA_ERROR_INVALID_CONTEXT);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    expect("zero_alloc", cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    expect("huge_alloc", cuMemAlloc(&d, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
    cuMemAlloc(&d, 256);
    cuMemAlloc(&freed, 256);
    cuMemFree(freed);
    expect("free_freed", cuMemFree(freed), CUDA_ERROR_INVALID_VALUE);
    expect("free_foreign", cuMemFree((CUdeviceptr)host), CUDA_ERROR_INVALID_VALUE);
    expect("free_interior", cuMemFree(d + 16), CUDA_ERROR_INVALID_VALUE);
    expect("copy_to_freed", cuMemcpyHtoD(freed, host, 16), CUDA_ERROR_INVALID_VALUE);
    expect("copy_past_end", cuMemcpyHtoD(d + 200, host, 100), CUDA_ERROR_INVALID_VALUE);
    expect("copy_from_foreign", cuMemcpyDtoH(host, (CUdeviceptr)host, 16),
           CUDA_ERROR_INVALID_VALUE);
    expect("memset_past_end", cuMemsetD32(d, 0, 65), CUDA_ERROR_INVALID_VALUE);
    expect("dtod_past_end", cuMemcpyDtoD(d, d + 128, 256), CUDA_ERROR_INVALID_VALUE);

    expect("load", cuModuleLoadData(&mod, ptx), CUDA_SUCCESS);
    expect("load_garbage", cuModuleLoadData(&stale_mod, "this is not a module"),
           CUDA_ERROR_INVALID_IMAGE);
    expect("no_such_kernel", cuModuleGetFunction(&fn, mod, "nope"), CUDA_ERROR_NOT_FOUND);
    expect("get_function", cuModuleGetFunction(&fn, mod, "scale"), CUDA_SUCCESS);
    float factor = 2.0f; int n = 64;
    void *args[] = {&d, &factor, &n};
    expect("too_many_threads", cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, NULL, args, NULL),
           CUDA_ERROR_INVALID_VALUE);
    expect("zero_grid", cuLaunchKernel(fn, 0, 1, 1, 32, 1, 1, 0, NULL, args, NULL),
           CUDA_ERROR_INVALID_VALUE);
    char packed[12];
    size_t wrong_size = 12, right_size = 16;
    void *extra_wrong[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                           &wrong_size, CU_LAUNCH_PARAM_END};
    expect("wrong_param_size", cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra_wrong),
           CUDA_ERROR_INVALID_VALUE);
    (void)right_size;
    expect("launch_ok", cuLaunchKernel(fn, 2, 1, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    expect("sync_ok", cuCtxSynchronize(), CUDA_SUCCESS);

    cuModuleLoadData(&stale_mod, ptx);
    cuModuleUnload(stale_mod);
    expect("stale_module", cuModuleGetFunction(&fn, stale_mod, "scale"), CUDA_ERROR_INVALID_HANDLE);
    expect("unload_twice", cuModuleUnload(stale_mod), CUDA_ERROR_INVALID_HANDLE);
    cuStreamCreate(&stream, 0);
    cuStreamDestroy(stream);
    expect("stale_stream", cuStreamSynchronize(stream), CUDA_ERROR_INVALID_HANDLE);
    cuEventCreate(&event, 0);
    cuEventDestroy(event);
    expect("stale_event", cuEventRecord(event, NULL), CUDA_ERROR_INVALID_HANDLE);
    expect("wrong_kind", cuStreamSynchronize((CUstream)ctx), CUDA_ERROR_INVALID_HANDLE);
    expect("garbage_handle", cuEventSynchronize((CUevent)0x1234), CUDA_ERROR_INVALID_HANDLE);
    expect("null_out", cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);

    /* an out-of-bounds store in a kernel: sticky CUDA_ERROR_ILLEGAL_ADDRESS. It runs 4 MiB
     * past the allocation, beyond the 2 MiB granule a GPU maps it in, so that a GPU (and the
     * cuda backend) faults too, not only a memory checker */
    n = 1 << 20;
    expect("oob_launch", cuLaunchKernel(fn, n / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL),
           CUDA_SUCCESS);
    expect("oob_reported", cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    expect("oob_sticky", cuMemAlloc(&freed, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
    printf("failures %d\n", failures);
    return failures != 0;
}
