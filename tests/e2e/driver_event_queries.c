/* Queries of work still running, on the NULL stream alone: an event recorded behind a kernel
 * that waits for the host stays not ready however often it is asked (the second query must
 * ask the device again, not take the first one's "not ready" as the last word), and is done
 * once the host lets the kernel finish. The flag lives in device-mapped host memory.
 * Usage: driver_event_queries STREAM_KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include "driver_checks.h"
#include "test_files.h"

int main(int argc, char **argv)
{
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction wait_for_flag;
    char *ptx = read_file(argc > 1 ? argv[1] : "stream_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&wait_for_flag, mod, "wait_for_flag"));

    volatile int *flag;
    CUdeviceptr device_flag, seen;
    CHECK(cuMemHostAlloc((void **)&flag, sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP));
    *flag = 0;
    CHECK(cuMemHostGetDevicePointer(&device_flag, (void *)flag, 0));
    CHECK(cuMemAlloc(&seen, sizeof(int)));
    CUevent behind;
    CHECK(cuEventCreate(&behind, CU_EVENT_DISABLE_TIMING));
    void *params[] = {&device_flag, &seen};
    CHECK(cuLaunchKernel(wait_for_flag, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(cuEventRecord(behind, NULL));
    for (int i = 0; i < 3; i++) {
        EXPECT(cuEventQuery(behind) == CUDA_ERROR_NOT_READY);
        EXPECT(cuStreamQuery(NULL) == CUDA_ERROR_NOT_READY);
    }
    *flag = 6;
    CHECK(cuEventSynchronize(behind));
    CHECK(cuEventQuery(behind));
    CHECK(cuStreamQuery(NULL));
    int got = 0;
    CHECK(cuMemcpyDtoH(&got, seen, sizeof got));
    EXPECT(got == 7);
    printf("driver_event_queries: all checks passed\n");
    return 0;
}
