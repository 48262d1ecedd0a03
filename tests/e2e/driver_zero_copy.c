/* Zero copy through the driver API: a kernel scales page-locked host memory allocated with
 * CU_MEMHOSTALLOC_DEVICEMAP in place, through the device pointer cuMemHostGetDevicePointer
 * gives; the host sees the result, and the pointer and its flags are reported as CUDA does.
 * Usage: driver_zero_copy KERNELS.ptx (with `scale(float *x, float factor, int n)`). */
#include <cuda.h>
#include <stdio.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, r_); return 1; } \
    } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); return 1; } } while (0)

int main(int argc, char **argv) {
    enum { N = 1000 };
    int n = N;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction scale;
    EXPECT(argc == 2);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));

    float *mapped;
    CHECK(cuMemHostAlloc((void **)&mapped, N * sizeof(float), CU_MEMHOSTALLOC_DEVICEMAP));
    for (int i = 0; i < N; i++) mapped[i] = (float)i;
    CUdeviceptr mapped_dev;
    CHECK(cuMemHostGetDevicePointer(&mapped_dev, mapped, 0));
    unsigned int memtype = 0;
    CHECK(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, mapped_dev));
    EXPECT(memtype == CU_MEMORYTYPE_HOST);
    float three = 3.0f;
    void *scale_args[] = {&mapped_dev, &three, &n};
    CHECK(cuLaunchKernel(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, scale_args, NULL));
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < N; i++) EXPECT(mapped[i] == 3.0f * i);
    unsigned int flags;
    CHECK(cuMemHostGetFlags(&flags, mapped));
    EXPECT(flags == CU_MEMHOSTALLOC_DEVICEMAP);
    CHECK(cuMemFreeHost(mapped));

    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("driver_zero_copy: a kernel scaled mapped host memory in place\n");
    return 0;
}
