/* Managed memory through the driver API, checked against the host: one pointer written by
 * the host, scaled by a kernel and read back after each kind of synchronization; a linked
 * list built by the host and walked on the device; a __managed__ variable of the module;
 * synchronous copies and memsets; pointer and range attributes; misuse.
 * Usage: driver_managed MANAGED_KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"

struct Node {
    int value;
    struct Node *next;
};

static CUresult launch(CUfunction f, unsigned blocks, unsigned threads, CUstream stream,
                       void **params) {
    return cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, params, NULL);
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUstream stream;
    CUfunction scale, walk, bump;
    char *ptx = read_file(argc > 1 ? argv[1] : "managed_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    int managed = -1, concurrent = -1;
    CHECK(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev));
    CHECK(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev));
    EXPECT(managed == 1 && concurrent == 0);
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));
    CHECK(cuModuleGetFunction(&walk, mod, "walk"));
    CHECK(cuModuleGetFunction(&bump, mod, "bump"));
    CHECK(cuStreamCreate(&stream, 0));

    /* Host writes, kernel, context synchronization; then a stream's, then a query's. */
    int n = 777;
    CUdeviceptr p;
    CHECK(cuMemAllocManaged(&p, n * sizeof(int), CU_MEM_ATTACH_GLOBAL));
    int *data = (int *)(uintptr_t)p;
    for (int i = 0; i < n; i++) data[i] = i;
    void *params[] = {&p, &n};
    CHECK(launch(scale, (n + 127) / 128, 128, NULL, params));
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < n; i++) EXPECT(data[i] == 3 * i - 1);
    data[0] = 1000;
    CHECK(launch(scale, (n + 127) / 128, 128, stream, params));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(data[0] == 2999 && data[5] == 3 * 14 - 1);
    CHECK(launch(scale, (n + 127) / 128, 128, stream, params));
    CUresult query;
    while ((query = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {}
    CHECK(query);
    EXPECT(data[0] == 8996);
    printf("driver_managed: host and kernel writes seen after each synchronization\n");

    /* A list of managed nodes, linked by the host, walked by a kernel. */
    CUdeviceptr list, sum;
    CHECK(cuMemAllocManaged(&list, 8 * sizeof(struct Node), CU_MEM_ATTACH_GLOBAL));
    CHECK(cuMemAllocManaged(&sum, sizeof(int), CU_MEM_ATTACH_HOST));
    struct Node *nodes = (struct Node *)(uintptr_t)list;
    for (int i = 0; i < 8; i++) {
        nodes[i].value = 1 << i;
        nodes[i].next = i + 1 < 8 ? &nodes[i + 1] : NULL;
    }
    CHECK(cuStreamAttachMemAsync(stream, sum, 0, CU_MEM_ATTACH_SINGLE));
    void *walk_params[] = {&list, &sum};
    CHECK(launch(walk, 1, 1, stream, walk_params));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(*(int *)(uintptr_t)sum == 255);
    printf("driver_managed: a list linked by the host walked by the device\n");

    /* The module's __managed__ variable: its initializer, host writes, kernel atomics. */
    CUdeviceptr tally_address; size_t tally_size;
    CHECK(cuModuleGetGlobal(&tally_address, &tally_size, mod, "tally"));
    int *tally = (int *)(uintptr_t)tally_address;
    EXPECT(tally_size == sizeof(int) && *tally == 3);
    *tally = 10;
    CHECK(launch(bump, 2, 16, NULL, NULL));
    CHECK(cuCtxSynchronize());
    EXPECT(*tally == 42);
    printf("driver_managed: the module's __managed__ variable shared\n");

    /* Synchronous copies and memsets reach the host view before they return. */
    int values[4] = {7, 8, 9, 10};
    CHECK(cuMemcpyHtoD(p + 4 * sizeof(int), values, sizeof values));
    EXPECT(data[4] == 7 && data[7] == 10 && data[8] == 3 * (3 * (3 * 8 - 1) - 1) - 1);
    CHECK(cuMemsetD32(p, 0xabcd, 2));
    EXPECT(data[0] == 0xabcd && data[1] == 0xabcd && data[2] != 0xabcd);
    data[100] = -5;
    int back = 0;
    CHECK(cuMemcpyDtoH(&back, p + 100 * sizeof(int), sizeof back));
    EXPECT(back == -5);
    printf("driver_managed: copies and memsets agree with the host view\n");

    /* Attributes and misuse. */
    unsigned int is_managed = 9, memory_type = 0;
    CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p + 8));
    CHECK(cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
    EXPECT(is_managed == 1 && memory_type == CU_MEMORYTYPE_DEVICE);
    CUdeviceptr plain;
    CHECK(cuMemAlloc(&plain, 64));
    CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
    EXPECT(is_managed == 0);
    CUmemLocation device0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemLocation device7 = {CU_MEM_LOCATION_TYPE_DEVICE, 7};
    CHECK(cuMemAdvise(p, n * sizeof(int), CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device0));
    int preferred = -5;
    CHECK(cuMemRangeGetAttribute(&preferred, sizeof preferred,
                                 CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, n * sizeof(int)));
    EXPECT(preferred == 0);
    CUdeviceptr none;
    EXPECT(cuMemAllocManaged(&none, 0, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocManaged(&none, 64, 0) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPrefetchAsync(p, 64, device0, 0, stream) == CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemAdvise(plain, 64, CU_MEM_ADVISE_SET_READ_MOSTLY, device0)
           == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAdvise(p, 64, CU_MEM_ADVISE_SET_ACCESSED_BY, device7) == CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuStreamAttachMemAsync(NULL, sum, 0, CU_MEM_ATTACH_SINGLE) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(tally_address) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(p));
    EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p)
           == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(list));
    CHECK(cuMemFree(sum));
    CHECK(cuMemFree(plain));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_managed: misuse refused with CUDA's errors\n");
    return 0;
}
