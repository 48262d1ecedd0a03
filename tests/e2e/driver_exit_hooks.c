/* CUDA works in exit hooks until the process ends: a hook registered before CUDA started
 * frees memory and synchronizes. Prints "hook <free rc> <sync rc>" from the hook. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static CUdeviceptr allocation;

static void at_exit(void)
{
    CUresult freed = cuMemFree(allocation);
    CUresult synchronized = cuCtxSynchronize();
    printf("hook %d %d\n", (int)freed, (int)synchronized);
    fflush(stdout);
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;

    atexit(at_exit);
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuMemAlloc(&allocation, 1 << 20))
        return 1;
    printf("allocated\n");
    return 0;
}
