/* Tensor cores through the driver API: the device's compute capability (8.0, what the
 * emulator runs), then a wmma f16 GEMM and an inline mma.sync s8 product launched with
 * cuLaunchKernel, both checked against products computed here.
 * Usage: driver_tensor_cores TENSOR_KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"

/* IEEE half bits of a small integer (|v| < 2048: exact). */
static unsigned short half_of(int v) {
    if (v == 0) return 0;
    unsigned short sign = v < 0 ? 0x8000 : 0;
    unsigned magnitude = (unsigned)(v < 0 ? -v : v);
    int exponent = 0;
    while ((magnitude >> exponent) > 1) exponent++;
    unsigned fraction = (magnitude << 10 >> exponent) & 0x3ff;
    return (unsigned short)(sign | (exponent + 15) << 10 | fraction);
}

/* A device copy of `bytes` of host memory. */
static CUresult upload(CUdeviceptr *device, const void *host, size_t bytes) {
    CUresult result = cuMemAlloc(device, bytes);
    return result != CUDA_SUCCESS ? result : cuMemcpyHtoD(*device, host, bytes);
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction gemm, mma;
    char *ptx = read_file(argc > 1 ? argv[1] : "tensor_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    int major = 0, minor = 0;
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("driver_tensor_cores: compute capability %d.%d\n", major, minor);
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&gemm, mod, "wmma_gemm"));
    CHECK(cuModuleGetFunction(&mma, mod, "mma_s8"));

    enum { N = 32 };
    static unsigned short a[N * N], b[N * N];
    static int ia[N * N], ib[N * N];
    static float c[N * N];
    for (int i = 0; i < N * N; i++) {
        ia[i] = (i * 7) % 11 - 5;
        ib[i] = (i * 3) % 5 - 2;
        a[i] = half_of(ia[i]);
        b[i] = half_of(ib[i]);
    }
    CUdeviceptr da, db, dc;
    CHECK(upload(&da, a, sizeof a));
    CHECK(upload(&db, b, sizeof b));
    CHECK(cuMemAlloc(&dc, sizeof c));
    int n = N;
    void *gemm_args[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(gemm, 1, 1, 1, 128, 1, 1, 0, NULL, gemm_args, NULL));
    CHECK(cuMemcpyDtoH(c, dc, sizeof c));
    for (int r = 0; r < N; r++)
        for (int col = 0; col < N; col++) {
            int sum = 0;
            for (int k = 0; k < N; k++) sum += ia[r * N + k] * ib[k * N + col];
            EXPECT(c[r * N + col] == (float)sum);
        }
    printf("driver_tensor_cores: wmma f16 GEMM correct\n");

    static signed char sa[16 * 32], sb[8 * 32];
    static int sc[16 * 8], expected[16 * 8];
    for (int i = 0; i < 16 * 32; i++) sa[i] = (signed char)((i * 37) % 256 - 128);
    for (int i = 0; i < 8 * 32; i++) sb[i] = (signed char)((i * 101) % 256 - 128);
    for (int i = 0; i < 16 * 8; i++) sc[i] = i * 1000 - 50000;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 8; col++) {
            int sum = sc[r * 8 + col];
            for (int k = 0; k < 32; k++) sum += sa[r * 32 + k] * sb[col * 32 + k];
            expected[r * 8 + col] = sum;
        }
    CUdeviceptr dsa, dsb, dsc;
    CHECK(upload(&dsa, sa, sizeof sa));
    CHECK(upload(&dsb, sb, sizeof sb));
    CHECK(upload(&dsc, sc, sizeof sc));
    void *mma_args[] = {&dsa, &dsb, &dsc};
    CHECK(cuLaunchKernel(mma, 1, 1, 1, 32, 1, 1, 0, NULL, mma_args, NULL));
    CHECK(cuMemcpyDtoH(sc, dsc, sizeof sc));
    EXPECT(memcmp(sc, expected, sizeof sc) == 0);
    printf("driver_tensor_cores: mma.sync s8 product correct\n");
    CHECK(cuCtxDestroy(ctx));
    free(ptx);
    return 0;
}
