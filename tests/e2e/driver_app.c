/* An unmodified driver-API program: vector add, a kernel loop on two streams with events,
 * memsets, a module global, async copies from pinned memory. Exits 0 only if every result
 * is right. Usage: driver_app KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"


int main(int argc, char **argv) {
    enum { N = 10000, STEPS = 8 };
    CUdevice dev; CUcontext ctx; CUmodule mod;
    CUfunction vadd, scale, add_bias;
    char name[128];
    int count = 0, major = 0;
    char *ptx = read_file(argc > 1 ? argv[1] : "kernels.ptx");
    EXPECT(ptx != NULL);

    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    EXPECT(count == 1);
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    EXPECT(major >= 7);
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&vadd, mod, "vadd"));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));
    CHECK(cuModuleGetFunction(&add_bias, mod, "add_bias"));

    /* vector add */
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    float *c = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) { a[i] = i * 0.5f; b[i] = 1000.0f - i; }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, N * sizeof(float)));
    CHECK(cuMemAlloc(&db, N * sizeof(float)));
    CHECK(cuMemAlloc(&dc, N * sizeof(float)));
    CHECK(cuMemcpyHtoD(da, a, N * sizeof(float)));
    CHECK(cuMemcpyHtoD(db, b, N * sizeof(float)));
    int n = N;
    void *args[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(vadd, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(c, dc, N * sizeof(float)));
    for (int i = 0; i < N; i++) EXPECT(c[i] == a[i] + b[i]);

    /* memsets: D32 float bit pattern, D8 and D16 checked byte-wise */
    CHECK(cuMemsetD32(da, 0x3f800000u, N));  /* 1.0f */
    CHECK(cuMemcpyDtoH(a, da, N * sizeof(float)));
    for (int i = 0; i < N; i++) EXPECT(a[i] == 1.0f);
    CHECK(cuMemsetD8(db, 0xab, 7));
    CHECK(cuMemsetD16(db + 8, 0x1234, 2));
    unsigned char bytes[12];
    CHECK(cuMemcpyDtoH(bytes, db, sizeof bytes));
    for (int i = 0; i < 7; i++) EXPECT(bytes[i] == 0xab);
    EXPECT(bytes[8] == 0x34 && bytes[9] == 0x12 && bytes[10] == 0x34 && bytes[11] == 0x12);

    /* module global: read the initializer, overwrite it, kernels see the new value */
    CUdeviceptr bias_ptr; size_t bias_size; float bias;
    CHECK(cuModuleGetGlobal(&bias_ptr, &bias_size, mod, "bias"));
    EXPECT(bias_size == sizeof(float));
    CHECK(cuMemcpyDtoH(&bias, bias_ptr, sizeof bias));
    EXPECT(bias == 0.25f);
    bias = 3.0f;
    CHECK(cuMemcpyHtoD(bias_ptr, &bias, sizeof bias));

    /* a kernel loop on two streams, ordered by events; async copies from pinned memory */
    CUstream s1, s2; CUevent start, done1, end;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, -1));
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&done1, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    float *pinned;
    CHECK(cuMemAllocHost((void **)&pinned, N * sizeof(float)));
    for (int i = 0; i < N; i++) pinned[i] = (float)(i % 17);
    CHECK(cuEventRecord(start, s1));
    CHECK(cuMemcpyHtoDAsync(dc, pinned, N * sizeof(float), s1));
    float factor = 2.0f;
    void *scale_args[] = {&dc, &factor, &n};
    for (int step = 0; step < STEPS; step++)
        CHECK(cuLaunchKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, s1, scale_args, NULL));
    CHECK(cuEventRecord(done1, s1));
    CHECK(cuStreamWaitEvent(s2, done1, 0));
    void *bias_args[] = {&dc, &n};
    CHECK(cuLaunchKernel(add_bias, (N + 127) / 128, 1, 1, 128, 1, 1, 0, s2, bias_args, NULL));
    CHECK(cuMemcpyDtoHAsync(pinned, dc, N * sizeof(float), s2));
    CHECK(cuEventRecord(end, s2));
    CHECK(cuEventSynchronize(end));
    CHECK(cuStreamSynchronize(s1));
    for (int i = 0; i < N; i++) EXPECT(pinned[i] == (float)(i % 17) * 256.0f + 3.0f);
    float ms = -1.0f;
    CHECK(cuEventElapsedTime(&ms, start, end));
    EXPECT(ms >= 0.0f);
    EXPECT(cuEventElapsedTime(&ms, start, done1) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamQuery(s2));

    size_t free_mem, total_mem;
    CHECK(cuMemGetInfo(&free_mem, &total_mem));
    EXPECT(free_mem < total_mem);

    CHECK(cuMemFreeHost(pinned));
    CHECK(cuStreamDestroy(s1));
    CHECK(cuStreamDestroy(s2));
    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(done1));
    CHECK(cuEventDestroy(end));
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_app: all results correct on %s\n", name);
    return 0;
}
