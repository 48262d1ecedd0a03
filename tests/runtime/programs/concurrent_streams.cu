// Streams that are streams: on the default stream alone (before other streams have work), an
// event behind a kernel that waits for the host, and the stream, stay not ready however often
// they are queried (and "not ready" is not the last error); a kernel that waits for a flag
// another stream's kernel sets, launched first, finishes; events order work across streams;
// host functions run in stream order on a thread of their own (one waits for what main() does
// after queuing it, and the kernel after it on the stream sees what it wrote); registered host
// memory is mapped for kernels; the device says it runs kernels concurrently. Results are
// checked against the host.
// With --unmapped (a recorded run, whose server maps no host memory) the parts that need host
// memory mapped for kernels are left out.
#include "check.cuh"
#include <atomic>
#include <cstring>
#include <thread>

__global__ void wait_for_flag(volatile int *flag, int *seen)
{
    while (*flag == 0) {
    }
    *seen = *flag + 1;
}

__global__ void set_flag(volatile int *flag, int value)
{
    *flag = value;
}

__global__ void fill(int *v, int n, int base)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = base + 3 * i;
}

__global__ void add_into(const int *a, const int *b, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a[i] + b[i];
}

struct Gate {
    std::atomic<int> go{0};
    std::atomic<int> order{0};
    int *pinned = nullptr;
    int ran_at = -1;
};

// Waits for main() to say go, which it does only after queuing this (and more) on the stream.
void CUDART_CB wait_then_write(void *user_data)
{
    Gate *gate = (Gate *)user_data;
    while (gate->go.load() == 0)
        std::this_thread::yield();
    gate->pinned[0] = 1000;
    gate->ran_at = gate->order.fetch_add(1);
}

struct Order {
    std::atomic<int> next{0};
    int at[3] = {-1, -1, -1};
    cudaError_t status = cudaErrorUnknown;
};

struct Step {
    Order *order;
    int index;
};

void CUDART_CB note_order(cudaStream_t, cudaError_t status, void *user_data)
{
    Step *step = (Step *)user_data;
    step->order->at[step->index] = step->order->next.fetch_add(1);
    step->order->status = status;
}

int main(int argc, char **argv)
{
    bool mapped = !(argc > 1 && strcmp(argv[1], "--unmapped") == 0);
    int device_count = 0;
    CHECK(cudaGetDeviceCount(&device_count));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int concurrent = 0, engines = 0, map_host = 0;
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentKernels, 0));
    CHECK(cudaDeviceGetAttribute(&engines, cudaDevAttrAsyncEngineCount, 0));
    CHECK(cudaDeviceGetAttribute(&map_host, cudaDevAttrCanMapHostMemory, 0));
    EXPECT(concurrent == 1 && prop.concurrentKernels == 1);
    EXPECT(engines >= 1 && prop.asyncEngineCount == engines);
    EXPECT(map_host == 1 && prop.canMapHostMemory == 1);

    // 0. Each query of running work asks the device again, not the first one's answer.
    if (mapped) {
        volatile int *host_flag;
        int *mapped_flag, *host_seen, host_got = 0;
        CHECK(cudaHostAlloc((void **)&host_flag, sizeof(int), cudaHostAllocMapped));
        *host_flag = 0;
        CHECK(cudaHostGetDevicePointer((void **)&mapped_flag, (void *)host_flag, 0));
        CHECK(cudaMalloc(&host_seen, sizeof(int)));
        cudaEvent_t behind_host;
        CHECK(cudaEventCreateWithFlags(&behind_host, cudaEventDisableTiming));
        wait_for_flag<<<1, 1>>>(mapped_flag, host_seen);
        CHECK(cudaEventRecord(behind_host));
        for (int i = 0; i < 3; ++i) {
            EXPECT_ERROR(cudaErrorNotReady, cudaEventQuery(behind_host));
            EXPECT_ERROR(cudaErrorNotReady, cudaStreamQuery(0));
        }
        CHECK(cudaGetLastError());  // "not ready" is no error: it is not the last error
        *host_flag = 6;
        CHECK(cudaEventSynchronize(behind_host));
        CHECK(cudaEventQuery(behind_host));
        CHECK(cudaStreamQuery(0));
        CHECK(cudaMemcpy(&host_got, host_seen, sizeof host_got, cudaMemcpyDeviceToHost));
        EXPECT(host_got == 7);
        CHECK(cudaEventDestroy(behind_host));
        CHECK(cudaFree(host_seen));
        CHECK(cudaFreeHost((void *)host_flag));
    }

    cudaStream_t waiter, setter, consumer;
    CHECK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
    CHECK(cudaStreamCreate(&setter));
    CHECK(cudaStreamCreate(&consumer));

    // 1. A kernel waiting for another stream's kernel, launched before it, finishes.
    int *flag, *seen;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    wait_for_flag<<<1, 1, 0, waiter>>>(flag, seen);
    CHECK(cudaGetLastError());
    EXPECT_ERROR(cudaErrorNotReady, cudaStreamQuery(waiter));
    set_flag<<<1, 1, 0, setter>>>(flag, 41);
    CHECK(cudaStreamSynchronize(waiter));
    int got = 0;
    CHECK(cudaMemcpy(&got, seen, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(got == 42);

    // 2. Events order work across streams: the consumer waits for both producers.
    const int n = 1000;
    int *a, *b, *sum;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMalloc(&sum, n * sizeof(int)));
    cudaEvent_t a_done, b_done;
    CHECK(cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming));
    CHECK(cudaEventCreate(&b_done));
    fill<<<(n + 255) / 256, 256, 0, waiter>>>(a, n, 7);
    CHECK(cudaEventRecord(a_done, waiter));
    fill<<<(n + 255) / 256, 256, 0, setter>>>(b, n, -2);
    CHECK(cudaEventRecord(b_done, setter));
    CHECK(cudaStreamWaitEvent(consumer, a_done, 0));
    CHECK(cudaStreamWaitEvent(consumer, b_done, 0));
    add_into<<<(n + 255) / 256, 256, 0, consumer>>>(a, b, sum, n);
    int *host_sum = new int[n];
    CHECK(cudaMemcpyAsync(host_sum, sum, n * sizeof(int), cudaMemcpyDeviceToHost, consumer));
    CHECK(cudaStreamSynchronize(consumer));
    for (int i = 0; i < n; i++)
        EXPECT(host_sum[i] == (7 + 3 * i) + (-2 + 3 * i));
    CHECK(cudaEventSynchronize(b_done));
    CHECK(cudaEventQuery(b_done));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaStreamWaitEvent(consumer, a_done, 0x4));

    // 3. A host function waits for main() after it was queued; the stream holds until it
    //    returns, and the kernel after it reads what it wrote (through mapped pinned memory).
    Gate gate;
    CHECK(cudaHostAlloc(&gate.pinned, 2 * sizeof(int), cudaHostAllocMapped));
    gate.pinned[0] = 0;
    gate.pinned[1] = 0;
    int *pinned_on_device = a;  // (unmapped: the kernel adds what the consumer filled)
    if (mapped)
        CHECK(cudaHostGetDevicePointer(&pinned_on_device, gate.pinned, 0));
    int *copied;
    CHECK(cudaMalloc(&copied, sizeof(int)));
    CHECK(cudaLaunchHostFunc(consumer, wait_then_write, &gate));
    add_into<<<1, 1, 0, consumer>>>(pinned_on_device, pinned_on_device, copied, 1);
    EXPECT_ERROR(cudaErrorNotReady, cudaStreamQuery(consumer));
    gate.order.fetch_add(1);  // main() runs on while the host function waits
    gate.go.store(1);
    CHECK(cudaStreamSynchronize(consumer));
    EXPECT(gate.ran_at == 1);
    CHECK(cudaMemcpy(&got, copied, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(got == (mapped ? 2000 : 2 * 7));

    // 4. Callbacks run once each, in stream order, with the stream's status; on the legacy
    //    stream too.
    Order order;
    Step steps[3] = {{&order, 0}, {&order, 1}, {&order, 2}};
    CHECK(cudaStreamAddCallback(setter, note_order, &steps[0], 0));
    fill<<<1, 32, 0, setter>>>(a, 32, 0);
    CHECK(cudaStreamAddCallback(setter, note_order, &steps[1], 0));
    CHECK(cudaStreamAddCallback(0, note_order, &steps[2], 0));
    CHECK(cudaDeviceSynchronize());
    EXPECT(order.at[0] == 0 && order.at[1] == 1 && order.at[2] == 2);
    EXPECT(order.status == cudaSuccess);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaLaunchHostFunc(setter, nullptr, nullptr));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaStreamAddCallback(setter, note_order, &steps[0], 1));

    // 5. Registered host memory, device-mapped: a kernel writes it through its device pointer.
    const int m = mapped ? 4096 : 0;  // a page of ints and more
    int *registered = (int *)aligned_alloc(4096, m * sizeof(int));
    memset(registered, 0, m * sizeof(int));
    if (mapped) {
        CHECK(cudaHostRegister(registered, m * sizeof(int), cudaHostRegisterMapped));
        int *registered_on_device;
        CHECK(cudaHostGetDevicePointer(&registered_on_device, registered, 0));
        fill<<<(m + 255) / 256, 256, 0, waiter>>>(registered_on_device, m, 5);
        CHECK(cudaStreamSynchronize(waiter));
        for (int i = 0; i < m; i++)
            EXPECT(registered[i] == 5 + 3 * i);
        CHECK(cudaHostUnregister(registered));
        EXPECT_ERROR(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(registered));
    }
    free(registered);

    CHECK(cudaStreamDestroy(waiter));
    CHECK(cudaStreamDestroy(setter));
    CHECK(cudaStreamDestroy(consumer));
    CHECK(cudaEventDestroy(a_done));
    CHECK(cudaEventDestroy(b_done));
    CHECK(cudaFreeHost(gate.pinned));
    delete[] host_sum;
    printf("concurrent_streams: waiting kernel released, events joined %d sums, host "
           "functions in order\n", n);
    return 0;
}
