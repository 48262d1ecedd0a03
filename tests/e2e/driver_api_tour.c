/* The rest of the driver API an application may use, each checked for CUDA's results:
 * context stack, device queries, function attributes, pointer attributes, registered memory,
 * stream-ordered allocation and pools, the PTX linker, libraries and kernels,
 * cuLaunchKernelEx, cuModuleLoad from a file, unified cuMemcpy, async DtoD and memset (zero
 * copy: driver_zero_copy.c). Usage: driver_api_tour KERNELS.ptx. Exits 0 iff all hold. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_files.h"

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, r_); return 1; } \
    } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); return 1; } } while (0)

int main(int argc, char **argv) {
    enum { N = 1000 };
    char *ptx = read_file(argv[1]);
    EXPECT(ptx != NULL);
    size_t ptx_size = strlen(ptx) + 1;  /* PTX is text: its size with the NUL, as linkers take it */
    CUdevice dev; CUcontext primary, mine, current; CUmodule mod; CUfunction scale;
    int value, n = N;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    size_t total; CHECK(cuDeviceTotalMem(&total, dev));
    EXPECT(total >= ((size_t)1 << 30));
    CUuuid uuid; CHECK(cuDeviceGetUuid(&uuid, dev));
    int driver; CHECK(cuDriverGetVersion(&driver));
    EXPECT(driver >= 13000);

    /* the context stack */
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuCtxCreate(&mine, NULL, 0, dev));  /* pushes mine */
    CHECK(cuCtxGetCurrent(&current));
    EXPECT(current == mine);
    CHECK(cuCtxPopCurrent(&current));
    EXPECT(current == mine);
    CHECK(cuCtxGetCurrent(&current));
    EXPECT(current == primary);
    CHECK(cuCtxPushCurrent(mine));
    CUdevice ctx_dev; CHECK(cuCtxGetDevice(&ctx_dev));
    EXPECT(ctx_dev == dev);
    CHECK(cuCtxPopCurrent(NULL));
    /* Destroying a context not current leaves the stack alone. Its handle is dead from
     * here on: passing it to any call is undefined behaviour (cuCtxDestroy's reference). */
    CHECK(cuCtxDestroy(mine));
    CHECK(cuCtxGetCurrent(&current));
    EXPECT(current == primary);

    /* cuModuleLoad from a file; function attributes */
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));
    CHECK(cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale));
    EXPECT(value == 1024);
    CHECK(cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, scale));
    EXPECT(value > 0);
    CHECK(cuFuncSetAttribute(scale, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
    CHECK(cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, scale));
    EXPECT(value == 64 * 1024);

    /* pointer attributes */
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, N * sizeof(float)));
    unsigned int memtype = 0;
    CHECK(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 40));
    EXPECT(memtype == CU_MEMORYTYPE_DEVICE);
    CUdeviceptr start; size_t range;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 40));
    CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 40));
    EXPECT(start == d && range == N * sizeof(float));
    CHECK(cuMemGetAddressRange(&start, &range, d + 8));
    EXPECT(start == d);
    char stack_var[8];
    EXPECT(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 (CUdeviceptr)stack_var) == CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned int type_out = 99, managed = 99;
    void *outs[] = {&type_out, &managed};
    CHECK(cuPointerGetAttributes(2, attrs, outs, (CUdeviceptr)stack_var));
    EXPECT(type_out == 0 && managed == 0);  /* not CUDA memory: reported, not an error */

    /* registered memory: usable for copies, refused a second time, then unregistered */
    float *plain = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) plain[i] = -1.0f * i;
    CHECK(cuMemHostRegister(plain, N * sizeof(float), 0));
    EXPECT(cuMemHostRegister(plain, N * sizeof(float), 0) ==
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CHECK(cuMemcpyHtoD(d, plain, N * sizeof(float)));
    CHECK(cuMemHostUnregister(plain));
    EXPECT(cuMemHostUnregister(plain) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

    /* unified cuMemcpy, async DtoD and memset on a stream */
    CUstream s; CHECK(cuStreamCreate(&s, 0));
    CUstreamCaptureStatus capture; CHECK(cuStreamIsCapturing(s, &capture));
    EXPECT(capture == CU_STREAM_CAPTURE_STATUS_NONE);
    CUdeviceptr d2; CHECK(cuMemAlloc(&d2, N * sizeof(float)));
    CHECK(cuMemcpyDtoDAsync(d2, d, N * sizeof(float), s));
    CHECK(cuMemsetD32Async(d, 0, N, s));
    float back[N];
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpy((CUdeviceptr)back, d2, N * sizeof(float)));  /* device -> host */
    for (int i = 0; i < N; i++) EXPECT(back[i] == -1.0f * i);
    CHECK(cuMemcpy((CUdeviceptr)back, d, N * sizeof(float)));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 0.0f);

    /* stream-ordered allocation from the default pool */
    CUmemoryPool pool; CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CUdeviceptr pooled; CHECK(cuMemAllocAsync(&pooled, 4096, s));
    cuuint64_t used = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used == 4096);
    CHECK(cuMemsetD8Async(pooled, 0x5a, 4096, s));
    CHECK(cuMemFreeAsync(pooled, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used == 0);

    /* the PTX linker, then a library and its kernel launched with cuLaunchKernelEx */
    CUlinkState link; void *image; size_t image_size;
    CHECK(cuLinkCreate(0, NULL, NULL, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx, ptx_size, "kernels", 0, NULL, NULL));
    CHECK(cuLinkComplete(link, &image, &image_size));
    EXPECT(image_size > 0);
    CUmodule linked; CHECK(cuModuleLoadData(&linked, image));
    CHECK(cuLinkDestroy(link));
    CUfunction linked_scale; CHECK(cuModuleGetFunction(&linked_scale, linked, "scale"));

    CUlibrary lib; CUkernel kernel; CUfunction from_kernel;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, "scale"));
    CHECK(cuKernelGetFunction(&from_kernel, kernel));
    CHECK(cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, dev));
    EXPECT(value == 1024);
    for (int i = 0; i < N; i++) back[i] = 1.0f;
    CHECK(cuMemcpyHtoD(d, back, N * sizeof(float)));
    float two = 2.0f;
    void *args[] = {&d, &two, &n};
    CUlaunchConfig config = {0};
    config.gridDimX = (N + 127) / 128; config.gridDimY = 1; config.gridDimZ = 1;
    config.blockDimX = 128; config.blockDimY = 1; config.blockDimZ = 1;
    config.hStream = s;
    CHECK(cuLaunchKernelEx(&config, from_kernel, args, NULL));
    CHECK(cuLaunchKernel(linked_scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CHECK(cuMemcpyDtoHAsync(back, d, N * sizeof(float), s));
    CHECK(cuStreamSynchronize(s));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 4.0f);

    /* cuGetProcAddress gives the versioned entry points */
    void *fn = NULL; CUdriverProcAddressQueryResult found;
    CHECK(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    EXPECT(found == CU_GET_PROC_ADDRESS_SUCCESS && fn == (void *)cuMemAlloc_v2);

    CHECK(cuLibraryUnload(lib));
    CHECK(cuModuleUnload(linked));
    CHECK(cuModuleUnload(mod));
    CHECK(cuStreamDestroy(s));
    CHECK(cuMemFree(d));
    CHECK(cuMemFree(d2));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("driver_api_tour: all checks passed\n");
    return 0;
}
