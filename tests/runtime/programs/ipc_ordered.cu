// IPC through the runtime API between two processes of one server, in order: the parent
// fills device memory lying behind another allocation (not at the start of a device page),
// records an interprocess event behind the kernel and exports both; the child, forked before
// either touched CUDA, opens them, has its stream wait for the parent's event, copies what
// the parent wrote and doubles it in place with a kernel; the parent then reads the doubled
// values. Neither process waits on the device for work the other has not done yet.
#include "check.cuh"
#include "forked_child.h"

__global__ void fill(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = 7 * i + 3;
}

__global__ void twice(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] *= 2;
}

struct Handles {
    cudaIpcMemHandle_t memory;
    cudaIpcEventHandle_t event;
};

static int child(int from_parent, int to_parent, int n)
{
    Handles handles;
    EXPECT(transfer(from_parent, &handles, sizeof handles, 0));
    int *shared = nullptr;
    cudaEvent_t parents;
    CHECK(cudaIpcOpenMemHandle((void **)&shared, handles.memory,
                               cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenEventHandle(&parents, handles.event));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(stream, parents, 0));
    int *seen = new int[n];
    CHECK(cudaMemcpyAsync(seen, shared, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    twice<<<(n + 127) / 128, 128, 0, stream>>>(shared, n);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaEventSynchronize(parents));
    CHECK(cudaEventQuery(parents));
    for (int i = 0; i < n; i++)
        EXPECT(seen[i] == 7 * i + 3);
    delete[] seen;
    CHECK(cudaIpcCloseMemHandle(shared));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcCloseMemHandle(shared));
    CHECK(cudaEventDestroy(parents));
    CHECK(cudaStreamDestroy(stream));
    char done = 'd';
    EXPECT(transfer(to_parent, &done, 1, 1));
    return 0;
}

int main()
{
    const int n = 4000;
    forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(other.in, other.out, n);

    char *before;
    int *memory;
    CHECK(cudaMalloc(&before, 1000));
    CHECK(cudaMalloc(&memory, n * sizeof(int)));
    CHECK(cudaMemset(before, 0x5a, 1000));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t event;
    CHECK(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
    fill<<<(n + 127) / 128, 128, 0, stream>>>(memory, n);
    CHECK(cudaEventRecord(event, stream));
    Handles handles;
    CHECK(cudaIpcGetEventHandle(&handles.event, event));
    CHECK(cudaIpcGetMemHandle(&handles.memory, memory));
    EXPECT(transfer(other.out, &handles, sizeof handles, 1));
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0));
    EXPECT(child_succeeded(other.pid));
    int *result = new int[n];
    unsigned char untouched[1000];
    CHECK(cudaMemcpy(result, memory, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(untouched, before, sizeof untouched, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(result[i] == 2 * (7 * i + 3));
    for (unsigned char byte : untouched)
        EXPECT(byte == 0x5a);
    delete[] result;
    CHECK(cudaFree(memory));
    CHECK(cudaFree(before));
    CHECK(cudaEventDestroy(event));
    CHECK(cudaStreamDestroy(stream));
    printf("ipc_ordered: the child doubled %d ints of the parent's memory after its event\n", n);
    return 0;
}
