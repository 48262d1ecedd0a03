/* A driver-API program on a server started with `--mem-limit 4M`: it sees a 4 MiB device,
 * runs out of memory there with CUDA_ERROR_OUT_OF_MEMORY (plain and stream-ordered
 * allocations alike), and goes on working: what was allocated keeps its contents, and what
 * is freed can be allocated again. Prints one line per check: "name got expected". */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define MIB (1024 * 1024)

static int failures = 0;
static void expect(const char *what, long long got, long long want) {
    printf("%s %lld %lld\n", what, got, want);
    if (got != want) failures++;
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUdeviceptr big, more, pooled; CUstream stream;
    size_t free_bytes = 0, total_bytes = 0;
    static unsigned char data[MIB], back[MIB];

    expect("init", cuInit(0), CUDA_SUCCESS);
    cuDeviceGet(&dev, 0);
    expect("retain", cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    cuCtxSetCurrent(ctx);
    expect("device_total", cuDeviceTotalMem(&total_bytes, dev), CUDA_SUCCESS);
    expect("device_total_value", (long long)total_bytes, 4 * MIB);
    expect("info", cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
    expect("info_total", (long long)total_bytes, 4 * MIB);
    expect("info_free", (long long)free_bytes, 4 * MIB);

    expect("alloc_3m", cuMemAlloc(&big, 3 * MIB), CUDA_SUCCESS);
    for (int i = 0; i < MIB; i++) data[i] = (unsigned char)(i * 7);
    expect("fill", cuMemcpyHtoD(big + 2 * MIB, data, MIB), CUDA_SUCCESS);
    expect("alloc_2m_over", cuMemAlloc(&more, 2 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    expect("stream", cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    expect("async_2m_over", cuMemAllocAsync(&pooled, 2 * MIB, stream), CUDA_ERROR_OUT_OF_MEMORY);
    expect("info_after", cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
    expect("info_free_after", (long long)free_bytes, 1 * MIB);

    /* The session goes on: what it holds is intact, and what it frees comes back. */
    expect("sync", cuCtxSynchronize(), CUDA_SUCCESS);
    expect("read", cuMemcpyDtoH(back, big + 2 * MIB, MIB), CUDA_SUCCESS);
    expect("contents", memcmp(data, back, MIB), 0);
    expect("async_1m", cuMemAllocAsync(&pooled, MIB, stream), CUDA_SUCCESS);
    expect("free_async", cuMemFreeAsync(pooled, stream), CUDA_SUCCESS);
    expect("free", cuMemFree(big), CUDA_SUCCESS);
    expect("alloc_2m_again", cuMemAlloc(&more, 2 * MIB), CUDA_SUCCESS);
    expect("final_sync", cuCtxSynchronize(), CUDA_SUCCESS);
    printf("failures %d\n", failures);
    return failures != 0;
}
