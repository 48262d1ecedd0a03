/* The smaller driver calls: the occupancy calculator's block size (checked against the
 * occupancy of every other block size, computed on the host from
 * cuOccupancyMaxActiveBlocksPerMultiprocessor), stream attributes and persisting-L2 limits
 * accepted as hints with CUDA's checks, kernel attributes, the profiler's start and stop.
 * Usage: driver_hints KERNELS.ptx (stream_kernels.cu) */
#include <cuda.h>
#include <cudaProfiler.h>
#include <stdio.h>
#include <stdlib.h>
#include "driver_checks.h"
#include "test_files.h"

enum { N = 5000 };

/* 8 bytes of dynamic shared memory per thread */
static size_t CUDA_CB shared_for(int block_size) { return (size_t)block_size * 8; }

static int best_block_size(CUfunction f, CUoccupancyB2DSize to_shared, size_t shared,
                           int limit, int sms, int *grid, int *block)
{
    CHECK(cuOccupancyMaxPotentialBlockSize(grid, block, f, to_shared, shared, limit));
    EXPECT(*block > 0 && *block <= (limit ? limit : 1024));
    int best = 0, at_best = 0;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&at_best, f, *block,
                                                      to_shared ? to_shared(*block) : shared));
    EXPECT(*grid == at_best * sms);
    for (int b = 32; b <= (limit ? limit : 1024); b += 32) {
        int active = 0;
        CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&active, f, b,
                                                          to_shared ? to_shared(b) : shared));
        if (active * b > best) best = active * b;
    }
    EXPECT(at_best * *block == best);  /* no block size fills a multiprocessor better */
    return 0;
}

int main(int argc, char **argv)
{
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fill;
    char *ptx = read_file(argc > 1 ? argv[1] : "stream_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fill, mod, "fill"));
    int sms = 0, max_window = 0, max_persisting = 0;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuDeviceGetAttribute(&max_window, CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
                               dev));
    CHECK(cuDeviceGetAttribute(&max_persisting, CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
                               dev));
    EXPECT(max_window > 0 && max_persisting > 0);

    /* 1. The occupancy calculator, with fixed and per-block-size shared memory, limited. */
    int grid = 0, block = 0;
    if (best_block_size(fill, NULL, 0, 0, sms, &grid, &block)) return 1;
    if (best_block_size(fill, shared_for, 0, 0, sms, &grid, &block)) return 1;
    if (best_block_size(fill, NULL, 40000, 256, sms, &grid, &block)) return 1;
    CHECK(cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &block, fill, NULL, 0, 0,
                                                    CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE));
    EXPECT(cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &block, fill, NULL, 0, 0, 8) ==
           CUDA_ERROR_INVALID_VALUE);

    /* 2. Stream attributes: a window, a synchronization policy, a priority; kept as set. */
    CUdeviceptr v;
    CHECK(cuMemAlloc(&v, N * sizeof(int)));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, (size_t)max_persisting));
    size_t limit = 0;
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_PERSISTING_L2_CACHE_SIZE));
    EXPECT(limit == (size_t)max_persisting);
    CUstreamAttrValue value = {0}, seen = {0};
    value.accessPolicyWindow.base_ptr = (void *)v;
    value.accessPolicyWindow.num_bytes = N * sizeof(int);
    value.accessPolicyWindow.hitRatio = 1.0f;
    value.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    value.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_NORMAL;
    CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value));
    CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &seen));
    EXPECT(seen.accessPolicyWindow.num_bytes == N * sizeof(int));
    EXPECT(seen.accessPolicyWindow.hitProp == CU_ACCESS_PROPERTY_PERSISTING);
    value.accessPolicyWindow.missProp = (CUaccessProperty)7;
    EXPECT(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value) ==
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &seen));
    EXPECT(seen.syncPolicy == CU_SYNC_POLICY_AUTO);
    value.syncPolicy = CU_SYNC_POLICY_BLOCKING_SYNC;
    CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &value));
    CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &seen));
    EXPECT(seen.syncPolicy == CU_SYNC_POLICY_BLOCKING_SYNC);
    value.priority = -3;
    CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_PRIORITY, &value));
    int priority = 0;
    CHECK(cuStreamGetPriority(stream, &priority));
    EXPECT(priority == -3);
    EXPECT(cuStreamSetAttribute(stream, (CUstreamAttrID)2, &value) == CUDA_ERROR_INVALID_VALUE);
    CUstream other;
    CHECK(cuStreamCreate(&other, CU_STREAM_DEFAULT));
    CHECK(cuStreamCopyAttributes(other, stream));
    CHECK(cuStreamGetAttribute(other, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &seen));
    EXPECT(seen.syncPolicy == CU_SYNC_POLICY_BLOCKING_SYNC);

    /* 3. A kernel under the hints computes what it always does. */
    CHECK(cuKernelSetCacheConfig((CUkernel)fill, CU_FUNC_CACHE_PREFER_L1, dev));
    EXPECT(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0,
                                (CUkernel)fill, 3) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cuProfilerStart());
    int n = N, base = -7;
    void *params[] = {&v, &n, &base};
    CHECK(cuLaunchKernel(fill, (N + block - 1) / block, 1, 1, block, 1, 1, 0, stream, params,
                         NULL));
    CHECK(cuProfilerStop());
    int *host = malloc(N * sizeof(int));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(host, v, N * sizeof(int)));
    for (int i = 0; i < N; i++)
        EXPECT(host[i] == base + 3 * i);
    CHECK(cuCtxResetPersistingL2Cache());
    free(host);
    free(ptx);
    CHECK(cuCtxDestroy(ctx));
    printf("driver_hints: all checks passed\n");
    return 0;
}
