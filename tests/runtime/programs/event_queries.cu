// Queries of work still running, on the default stream alone: an event recorded behind a
// kernel that waits for the host stays not ready however often it is asked, and so does the
// stream; both are done once the host lets the kernel finish. The flag lives in mapped host
// memory.
#include "check.cuh"

__global__ void wait_for_flag(volatile int *flag, int *seen)
{
    while (*flag == 0) {
    }
    *seen = *flag + 1;
}

int main()
{
    volatile int *flag;
    int *device_flag, *seen;
    CHECK(cudaHostAlloc((void **)&flag, sizeof(int), cudaHostAllocMapped));
    *flag = 0;
    CHECK(cudaHostGetDevicePointer((void **)&device_flag, (void *)flag, 0));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    cudaEvent_t behind;
    CHECK(cudaEventCreateWithFlags(&behind, cudaEventDisableTiming));
    wait_for_flag<<<1, 1>>>(device_flag, seen);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(behind));
    for (int i = 0; i < 3; ++i) {
        EXPECT_ERROR(cudaErrorNotReady, cudaEventQuery(behind));
        EXPECT_ERROR(cudaErrorNotReady, cudaStreamQuery(0));
    }
    *flag = 6;
    CHECK(cudaEventSynchronize(behind));
    CHECK(cudaEventQuery(behind));
    CHECK(cudaStreamQuery(0));
    int got = 0;
    CHECK(cudaMemcpy(&got, seen, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == 7);
    CHECK(cudaEventDestroy(behind));
    CHECK(cudaFree(seen));
    CHECK(cudaFreeHost((void *)flag));
    printf("event_queries: running work not ready at each query, done after\n");
    return 0;
}
