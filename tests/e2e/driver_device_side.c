/* The device side through the driver API, checked against the host: a module linked with
 * libcudadevrt.a by cuLink* (CU_JIT_INPUT_LIBRARY), device-side launches, malloc/free on a heap
 * sized by cuCtxSetLimit (fixed once used), recursion through a function pointer table, and
 * cooperative launches (cuLaunchCooperativeKernel, cuLaunchKernelEx's cooperative attribute)
 * whose grid meets at grid.sync(), too large ones refused; grid.sync() in a plain launch traps.
 * Usage: driver_device_side DEVICE_SIDE_KERNELS.ptx LIBCUDADEVRT.a */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"

#define EXPECT_RESULT(expected, call) do { CUresult r_ = (call); if (r_ != (expected)) { \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, r_, \
            (int)(expected)); return 1; } } while (0)

static int collatz_host(int x) { return x == 1 ? 0 : 1 + collatz_host(x % 2 ? 3 * x + 1 : x / 2); }

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s KERNELS.ptx LIBCUDADEVRT.a\n", argv[0]); return 2; }
    char *ptx = read_file(argv[1]);
    EXPECT(ptx != NULL);
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    int cooperative = 0;
    CHECK(cuDeviceGetAttribute(&cooperative, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev));
    EXPECT(cooperative == 1);

    CUlinkState link;
    void *image;
    size_t image_size;
    CUmodule module;
    CHECK(cuLinkCreate(0, NULL, NULL, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx, strlen(ptx) + 1, "kernels", 0, NULL, NULL));
    CHECK(cuLinkAddFile(link, CU_JIT_INPUT_LIBRARY, argv[2], 0, NULL, NULL));
    CHECK(cuLinkComplete(link, &image, &image_size));
    CHECK(cuModuleLoadData(&module, image));
    CHECK(cuLinkDestroy(link));
    CUfunction launch_squares, heap_copies, collatz, grid_max;
    CHECK(cuModuleGetFunction(&launch_squares, module, "launch_squares"));
    CHECK(cuModuleGetFunction(&heap_copies, module, "heap_copies"));
    CHECK(cuModuleGetFunction(&collatz, module, "collatz"));
    CHECK(cuModuleGetFunction(&grid_max, module, "grid_max"));

    /* Device-side launches: each block's first thread launches a child over its part. */
    enum { N = 256 };
    CUdeviceptr out, in, sums, block_max, result;
    CHECK(cuMemAlloc(&out, N * sizeof(int)));
    void *square_args[] = {&out};
    CHECK(cuLaunchKernel(launch_squares, 4, 1, 1, 64, 1, 1, 0, 0, square_args, NULL));
    int host[N];
    CHECK(cuMemcpyDtoH(host, out, sizeof(host)));
    for (int i = 0; i < N; i++) EXPECT(host[i] == i * i);
    printf("driver_device_side: children launched by 4 blocks computed 256 squares\n");

    /* The heap: 64 KiB, then fixed. 16 threads copy 200 ints each: they fit. */
    size_t heap = 0;
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 64 << 10));
    CHECK(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
    EXPECT(heap == 64 << 10);
    int values[N];
    long long expected = 0, expected_all = 0, got[64];
    for (int i = 0; i < N; i++) values[i] = (i * 7919) % 1000 - 300;
    for (int i = 0; i < N; i++) {
        if (i < 200) expected += values[i];
        expected_all += values[i];
    }
    CHECK(cuMemAlloc(&in, sizeof(values)));
    CHECK(cuMemAlloc(&sums, sizeof(got)));
    CHECK(cuMemcpyHtoD(in, values, sizeof(values)));
    int count = 200;
    void *heap_args[] = {&in, &sums, &count};
    CHECK(cuLaunchKernel(heap_copies, 1, 1, 1, 16, 1, 1, 0, 0, heap_args, NULL));
    CHECK(cuMemcpyDtoH(got, sums, 16 * sizeof(long long)));
    for (int t = 0; t < 16; t++) EXPECT(got[t] == expected * (t + 1));
    EXPECT_RESULT(CUDA_ERROR_INVALID_VALUE, cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 20));
    /* 64 threads copying 256 ints at once need 64 KiB and more: some get NULL. */
    count = N;
    CHECK(cuLaunchKernel(heap_copies, 1, 1, 1, 64, 1, 1, 0, 0, heap_args, NULL));
    CHECK(cuMemcpyDtoH(got, sums, sizeof(got)));
    int refused = 0;
    for (int t = 0; t < 64; t++) {
        if (got[t] == -1) refused++;
        else EXPECT(got[t] == expected_all * (t + 1));
    }
    EXPECT(refused > 0 && refused < 64);
    printf("driver_device_side: malloc and free on a 64 KiB heap\n");

    /* Recursion through a table of function pointers. */
    void *collatz_args[] = {&out};
    CHECK(cuLaunchKernel(collatz, 1, 1, 1, 32, 1, 1, 0, 0, collatz_args, NULL));
    CHECK(cuMemcpyDtoH(host, out, 32 * sizeof(int)));
    for (int t = 0; t < 32; t++) EXPECT(host[t] == collatz_host(t + 1));
    printf("driver_device_side: recursive Collatz through function pointers correct\n");

    /* Cooperative launches, sized by the occupancy calculator. */
    int sms = 0, per_sm = 0, best = -1000000;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_max, 64, 0));
    for (int i = 0; i < N; i++) best = values[i] > best ? values[i] : best;
    int blocks = 4, n = N, zeros[8] = {0}, max_found = 0;
    EXPECT(blocks <= per_sm * sms);
    CHECK(cuMemAlloc(&block_max, sizeof(zeros)));
    CHECK(cuMemAlloc(&result, sizeof(int)));
    void *max_args[] = {&in, &block_max, &result, &n};
    for (int i = 0; i < 8; i++) zeros[i] = -2147483647;
    CHECK(cuMemcpyHtoD(block_max, zeros, sizeof(zeros)));
    CHECK(cuLaunchCooperativeKernel(grid_max, blocks, 1, 1, 64, 1, 1, 0, 0, max_args));
    CHECK(cuMemcpyDtoH(&max_found, result, sizeof(int)));
    EXPECT(max_found == best);
    CUlaunchAttribute attribute;
    memset(&attribute, 0, sizeof attribute);
    attribute.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attribute.value.cooperative = 1;
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    config.gridDimX = 8; config.gridDimY = 1; config.gridDimZ = 1;
    config.blockDimX = 64; config.blockDimY = 1; config.blockDimZ = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    CHECK(cuMemcpyHtoD(block_max, zeros, sizeof(zeros)));
    CHECK(cuMemsetD32(result, 0, 1));
    CHECK(cuLaunchKernelEx(&config, grid_max, max_args, NULL));
    CHECK(cuMemcpyDtoH(&max_found, result, sizeof(int)));
    EXPECT(max_found == best);
    EXPECT_RESULT(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                  cuLaunchCooperativeKernel(grid_max, per_sm * sms + 1, 1, 1, 64, 1, 1, 0, 0,
                                            max_args));
    printf("driver_device_side: cooperative grids of 4 and 8 blocks met at grid.sync()\n");

    /* grid.sync() in a launch that is not cooperative traps, as on a GPU. */
    CHECK(cuLaunchKernel(grid_max, 2, 1, 1, 64, 1, 1, 0, 0, max_args, NULL));
    EXPECT_RESULT(CUDA_ERROR_LAUNCH_FAILED, cuCtxSynchronize());
    CHECK(cuDevicePrimaryCtxReset(dev));
    printf("driver_device_side: all checks passed\n");
    free(ptx);
    return 0;
}
