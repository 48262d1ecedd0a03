// Device management: count, selection, properties (the CUDA 13 struct) agreeing with the
// attributes, versions, limits, flags, memory info, the profiler switches, reset.
#include "check.cuh"
#include <cstring>
#include <cuda_profiler_api.h>

int main()
{
    int count = 0, device = -1;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count == 1);
    CHECK(cudaSetDevice(0));
    CHECK(cudaGetDevice(&device));
    EXPECT(device == 0);
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaSetDevice(count));

    cudaDeviceProp prop;
    memset(&prop, 0xff, sizeof(prop));
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(strlen(prop.name) > 0);
    EXPECT(prop.totalGlobalMem > 0);
    EXPECT(prop.warpSize == 32);
    EXPECT(prop.maxThreadsPerBlock == 1024);
    EXPECT(prop.maxThreadsDim[2] == 64 && prop.maxGridSize[1] == 65535);
    EXPECT(prop.luidDeviceNodeMask == 0);
    int value;
    CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, 0));
    EXPECT(value == prop.major);
    CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
    EXPECT(value == prop.multiProcessorCount && value > 0);
    CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    EXPECT((size_t)value == prop.sharedMemPerBlockOptin);
    CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrManagedMemory, 0));
    EXPECT(value == prop.managedMemory);
    printf("device: %s, compute capability %d.%d, %d multiprocessors\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount);

    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    EXPECT(runtime == CUDART_VERSION && driver >= runtime);

    // Limits: CUDA's defaults, settable, an unknown one an invalid value; the reset below restores
    // the defaults (a fresh primary context has them). The printf FIFO's default is the
    // driver's choice (the guide's 1 MiB is not what every device has), so only its being
    // there, settable before any printf kernel and restored by the reset is checked.
    size_t limit = 0, printf_fifo = 0;
    CHECK(cudaDeviceGetLimit(&printf_fifo, cudaLimitPrintfFifoSize));
    EXPECT(printf_fifo > 0);
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, printf_fifo + (4 << 20)));
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitPrintfFifoSize));
    EXPECT(limit == printf_fifo + (4 << 20));
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize));
    EXPECT(limit == 8 << 20);
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitStackSize));
    EXPECT(limit == 1024);
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16 << 20));
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitStackSize));
    EXPECT(limit == 4096);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaDeviceSetLimit((cudaLimit)0x1234, 1));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaDeviceGetLimit(&limit, (cudaLimit)0x1234));
    cudaGetLastError();

    CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
    unsigned flags = 0;
    CHECK(cudaGetDeviceFlags(&flags));
    EXPECT((flags & cudaDeviceScheduleMask) == cudaDeviceScheduleBlockingSync);

    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    EXPECT(total_bytes == prop.totalGlobalMem && free_bytes <= total_bytes);

    char bus_id[32];
    CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), 0));
    EXPECT(strlen(bus_id) > 0);
    int can_access = 1;
    CHECK(cudaDeviceCanAccessPeer(&can_access, 0, 0));
    EXPECT(can_access == 0);
    cudaFuncCache cache;
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferL1));
    CHECK(cudaDeviceGetCacheConfig(&cache));
    EXPECT(cache == cudaFuncCachePreferL1);
    CHECK(cudaProfilerStart());
    CHECK(cudaProfilerStop());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaDeviceReset());
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitStackSize));
    EXPECT(limit == 1024);
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize));
    EXPECT(limit == 8 << 20);
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitPrintfFifoSize));
    EXPECT(limit == printf_fifo);
    printf("device_management: queries consistent\n");
    return 0;
}
