/* Streams that are streams, through the driver API: on the NULL stream alone (before any
 * other stream has work), an event behind a kernel that waits for the host, and the stream,
 * stay not ready however often they are queried; a kernel waiting for a flag that a kernel
 * launched after it on another stream sets finishes; events order streams (and an event whose
 * work is still running is not ready); host functions run in stream order on a thread of
 * their own, one waiting for what main() does after queuing it; registered host memory is
 * device-mapped. Results are checked against the host. Usage: driver_streams KERNELS.ptx */
#include <cuda.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"

enum { N = 1000, PAGE_INTS = 1024, BLOCK = 256 };

struct gate {
    atomic_int go;
    atomic_int order;
    int *pinned;
    int ran_at;
};

/* Waits until main() says go, which it does after queuing more work behind it. */
static void CUDA_CB wait_then_write(void *user_data)
{
    struct gate *gate = user_data;
    while (atomic_load(&gate->go) == 0)
        sched_yield();
    gate->pinned[0] = 500;
    gate->ran_at = atomic_fetch_add(&gate->order, 1);
}

struct step {
    atomic_int *next;
    int at;
    CUresult status;
};

static void CUDA_CB note_order(CUstream stream, CUresult status, void *user_data)
{
    (void)stream;
    struct step *step = user_data;
    step->at = atomic_fetch_add(step->next, 1);
    step->status = status;
}

static CUresult launch(CUfunction f, int threads, CUstream stream, void **params)
{
    return cuLaunchKernel(f, (threads + BLOCK - 1) / BLOCK, 1, 1, threads < BLOCK ? threads : BLOCK,
                          1, 1, 0, stream, params, NULL);
}

int main(int argc, char **argv)
{
    CUdevice dev; CUcontext ctx; CUmodule mod;
    CUfunction wait_for_flag, set_flag, fill, add_into;
    char *ptx = read_file(argc > 1 ? argv[1] : "stream_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    int concurrent = 0;
    CHECK(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, dev));
    EXPECT(concurrent == 1);
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&wait_for_flag, mod, "wait_for_flag"));
    CHECK(cuModuleGetFunction(&set_flag, mod, "set_flag"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill"));
    CHECK(cuModuleGetFunction(&add_into, mod, "add_into"));

    /* 0. Each query of running work asks the device again, not the first one's answer. */
    volatile int *host_flag;
    CUdeviceptr mapped_flag, host_seen;
    CHECK(cuMemHostAlloc((void **)&host_flag, sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP));
    *host_flag = 0;
    CHECK(cuMemHostGetDevicePointer(&mapped_flag, (void *)host_flag, 0));
    CHECK(cuMemAlloc(&host_seen, sizeof(int)));
    CUevent behind_host;
    CHECK(cuEventCreate(&behind_host, CU_EVENT_DISABLE_TIMING));
    void *host_wait_params[] = {&mapped_flag, &host_seen};
    CHECK(launch(wait_for_flag, 1, NULL, host_wait_params));
    CHECK(cuEventRecord(behind_host, NULL));
    for (int i = 0; i < 3; i++) {
        EXPECT(cuEventQuery(behind_host) == CUDA_ERROR_NOT_READY);
        EXPECT(cuStreamQuery(NULL) == CUDA_ERROR_NOT_READY);
    }
    *host_flag = 6;
    CHECK(cuEventSynchronize(behind_host));
    CHECK(cuEventQuery(behind_host));
    CHECK(cuStreamQuery(NULL));
    int host_got = 0;
    CHECK(cuMemcpyDtoH(&host_got, host_seen, sizeof host_got));
    EXPECT(host_got == 7);

    CUstream waiter, setter, consumer;
    CHECK(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&setter, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&consumer, CU_STREAM_DEFAULT));

    /* 1. The waiting kernel, launched first, finishes once the other stream's sets its flag;
     *    until then its stream, and an event recorded behind it, are not ready. */
    CUdeviceptr flag, seen;
    CHECK(cuMemAlloc(&flag, sizeof(int)));
    CHECK(cuMemAlloc(&seen, sizeof(int)));
    CHECK(cuMemsetD32(flag, 0, 1));
    CUevent start, behind_waiter;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&behind_waiter, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(start, waiter));
    void *wait_params[] = {&flag, &seen};
    CHECK(launch(wait_for_flag, 1, waiter, wait_params));
    CHECK(cuEventRecord(behind_waiter, waiter));
    EXPECT(cuStreamQuery(waiter) == CUDA_ERROR_NOT_READY);
    EXPECT(cuEventQuery(behind_waiter) == CUDA_ERROR_NOT_READY);
    float ms = -1;
    EXPECT(cuEventElapsedTime(&ms, start, behind_waiter) == CUDA_ERROR_NOT_READY);
    int value = 41;
    void *set_params[] = {&flag, &value};
    CHECK(launch(set_flag, 1, setter, set_params));
    CHECK(cuEventSynchronize(behind_waiter));
    CHECK(cuEventElapsedTime(&ms, start, behind_waiter));
    EXPECT(ms >= 0);
    int got = 0;
    CHECK(cuMemcpyDtoH(&got, seen, sizeof got));
    EXPECT(got == 42);

    /* 2. Events join streams: the consumer adds what two producers filled. */
    CUdeviceptr a, b, sum;
    CHECK(cuMemAlloc(&a, N * sizeof(int)));
    CHECK(cuMemAlloc(&b, N * sizeof(int)));
    CHECK(cuMemAlloc(&sum, N * sizeof(int)));
    CUevent a_done, b_done;
    CHECK(cuEventCreate(&a_done, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&b_done, CU_EVENT_DISABLE_TIMING));
    int n = N, base_a = 7, base_b = -2;
    void *fill_a[] = {&a, &n, &base_a};
    void *fill_b[] = {&b, &n, &base_b};
    void *add_params[] = {&a, &b, &sum, &n};
    CHECK(launch(fill, N, waiter, fill_a));
    CHECK(cuEventRecord(a_done, waiter));
    CHECK(launch(fill, N, setter, fill_b));
    CHECK(cuEventRecordWithFlags(b_done, setter, CU_EVENT_RECORD_DEFAULT));
    CHECK(cuStreamWaitEvent(consumer, a_done, 0));
    CHECK(cuStreamWaitEvent(consumer, b_done, CU_EVENT_WAIT_DEFAULT));
    CHECK(launch(add_into, N, consumer, add_params));
    int *host_sum;
    CHECK(cuMemAllocHost((void **)&host_sum, N * sizeof(int)));
    CHECK(cuMemcpyDtoHAsync(host_sum, sum, N * sizeof(int), consumer));
    CHECK(cuStreamSynchronize(consumer));
    for (int i = 0; i < N; i++)
        EXPECT(host_sum[i] == (base_a + 3 * i) + (base_b + 3 * i));
    EXPECT(cuStreamWaitEvent(consumer, a_done, 4) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuEventRecordWithFlags(a_done, consumer, 2) == CUDA_ERROR_INVALID_VALUE);

    /* 3. A host function waits for main(); the stream holds until it returns, and the copy
     *    and kernel behind it see what it wrote to pinned memory. */
    struct gate gate = {0};
    CHECK(cuMemHostAlloc((void **)&gate.pinned, sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP));
    gate.pinned[0] = 0;
    CUdeviceptr copied;
    CHECK(cuMemAlloc(&copied, sizeof(int)));
    CHECK(cuLaunchHostFunc(consumer, wait_then_write, &gate));
    CHECK(cuMemcpyHtoDAsync(copied, gate.pinned, sizeof(int), consumer));
    void *double_params[] = {&copied, &copied, &copied, &(int){1}};
    CHECK(launch(add_into, 1, consumer, double_params));
    EXPECT(cuStreamQuery(consumer) == CUDA_ERROR_NOT_READY);
    atomic_fetch_add(&gate.order, 1);  /* main() goes on while the function waits */
    atomic_store(&gate.go, 1);
    CHECK(cuStreamSynchronize(consumer));
    EXPECT(gate.ran_at == 1);
    CHECK(cuMemcpyDtoH(&got, copied, sizeof got));
    EXPECT(got == 1000);

    /* 4. Callbacks run once each, in stream order, with the stream's status, on the legacy
     *    stream too; a NULL function or nonzero flags are refused. */
    atomic_int next = 0;
    struct step steps[3] = {{&next, -1, CUDA_ERROR_UNKNOWN}, {&next, -1, CUDA_ERROR_UNKNOWN},
                            {&next, -1, CUDA_ERROR_UNKNOWN}};
    CHECK(cuStreamAddCallback(setter, note_order, &steps[0], 0));
    CHECK(launch(fill, N, setter, fill_b));
    CHECK(cuStreamAddCallback(setter, note_order, &steps[1], 0));
    CHECK(cuStreamAddCallback(NULL, note_order, &steps[2], 0));
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < 3; i++)
        EXPECT(steps[i].at == i && steps[i].status == CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(setter, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamAddCallback(setter, note_order, &steps[0], 1) == CUDA_ERROR_INVALID_VALUE);

    /* 5. Registered host memory, device-mapped: a kernel fills it through its device address. */
    int *registered = aligned_alloc(4096, PAGE_INTS * sizeof(int));
    memset(registered, 0, PAGE_INTS * sizeof(int));
    CHECK(cuMemHostRegister(registered, PAGE_INTS * sizeof(int), CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr registered_on_device;
    CHECK(cuMemHostGetDevicePointer(&registered_on_device, registered, 0));
    int pages = PAGE_INTS, base_r = 9;
    void *fill_r[] = {&registered_on_device, &pages, &base_r};
    CHECK(launch(fill, PAGE_INTS, waiter, fill_r));
    CHECK(cuStreamSynchronize(waiter));
    for (int i = 0; i < PAGE_INTS; i++)
        EXPECT(registered[i] == base_r + 3 * i);
    CHECK(cuMemHostUnregister(registered));
    free(registered);

    CHECK(cuStreamDestroy(waiter));
    CHECK(cuStreamDestroy(setter));
    CHECK(cuStreamDestroy(consumer));
    CHECK(cuMemFreeHost(host_sum));
    CHECK(cuMemFreeHost(gate.pinned));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_streams: all checks passed\n");
    free(ptx);
    return 0;
}
