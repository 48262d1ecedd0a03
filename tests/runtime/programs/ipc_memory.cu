// IPC between two processes of one server: the parent fills device memory and exports it
// (cudaIpcGetMemHandle); the child, forked before either touched CUDA, opens the handle, checks
// what it sees, and adds to it in place with a kernel; the parent then reads the sum. An
// interprocess event orders the two: the parent's kernel waits for a flag the child sets in
// shared memory, and the child's stream waits for the parent's event before reading what that
// kernel wrote. Results are checked against the host; misuse gets CUDA's errors.
#include "check.cuh"
#include "forked_child.h"
#include <cstring>

__global__ void fill(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = 3 * i + 1;
}

__global__ void check_and_add(int *v, int n, int *wrong)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        if (v[i] != 3 * i + 1)
            atomicAdd(wrong, 1);
        v[i] += 1000 * i;
    }
}

// control[0]: the flag; control[1]: written once it is set.
__global__ void wait_then_double(volatile int *control)
{
    while (control[0] == 0) {
    }
    control[1] = 2 * control[0];
}

__global__ void copy_one(const int *from, int *to)
{
    *to = *from;
}

struct Handles {
    cudaIpcMemHandle_t memory, control;
    cudaIpcEventHandle_t event;
};

static int child(int from_parent, int to_parent, int n)
{
    Handles handles;
    EXPECT(transfer(from_parent, &handles, sizeof handles, 0));
    cudaIpcMemHandle_t handle = handles.memory;
    // The parent's kernel waits for our flag; its event, recorded behind it, is not done.
    int *control;
    cudaEvent_t parents;
    CHECK(cudaIpcOpenMemHandle((void **)&control, handles.control,
                               cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenEventHandle(&parents, handles.event));
    EXPECT_ERROR(cudaErrorNotReady, cudaEventQuery(parents));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int flag = 21;
    CHECK(cudaMemcpyAsync(control, &flag, sizeof flag, cudaMemcpyHostToDevice, stream));
    CHECK(cudaStreamWaitEvent(stream, parents, 0));
    copy_one<<<1, 1, 0, stream>>>(control + 1, control + 2);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaEventSynchronize(parents));
    int doubled = 0;
    CHECK(cudaMemcpy(&doubled, control + 2, sizeof doubled, cudaMemcpyDeviceToHost));
    EXPECT(doubled == 42);
    CHECK(cudaIpcCloseMemHandle(control));
    CHECK(cudaEventDestroy(parents));
    CHECK(cudaStreamDestroy(stream));

    int *shared = nullptr, *again = nullptr;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcOpenMemHandle((void **)&shared, handle, 0));
    CHECK(cudaIpcOpenMemHandle((void **)&shared, handle, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&again, handle, cudaIpcMemLazyEnablePeerAccess));
    EXPECT(again == shared);  // opened twice: the same pointer, counted
    cudaIpcMemHandle_t forged = handle;
    forged.reserved[40] ^= 0x5a;
    int *nothing = nullptr;
    EXPECT_ERROR(cudaErrorInvalidResourceHandle,
                 cudaIpcOpenMemHandle((void **)&nothing, forged, cudaIpcMemLazyEnablePeerAccess));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaFree(shared));
    int *wrong;
    CHECK(cudaMalloc(&wrong, sizeof(int)));
    CHECK(cudaMemset(wrong, 0, sizeof(int)));
    check_and_add<<<(n + 127) / 128, 128>>>(shared, n, wrong);
    CHECK(cudaDeviceSynchronize());
    int wrong_count = -1, first = -1;
    CHECK(cudaMemcpy(&wrong_count, wrong, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&first, shared + 1, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(wrong_count == 0 && first == 3 * 1 + 1 + 1000);
    CHECK(cudaIpcCloseMemHandle(again));
    CHECK(cudaIpcCloseMemHandle(shared));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcCloseMemHandle(shared));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcCloseMemHandle(wrong));
    CHECK(cudaFree(wrong));
    char done = 'd';
    EXPECT(transfer(to_parent, &done, 1, 1));
    return 0;
}

int main()
{
    const int n = 5000;
    forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(other.in, other.out, n);

    int *memory;
    CHECK(cudaMalloc(&memory, n * sizeof(int)));
    fill<<<(n + 127) / 128, 128>>>(memory, n);
    CHECK(cudaDeviceSynchronize());
    int *control;
    CHECK(cudaMalloc(&control, 4 * sizeof(int)));
    CHECK(cudaMemset(control, 0, 4 * sizeof(int)));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t event, timed;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaEventCreateWithFlags(&event, cudaEventInterprocess));
    CHECK(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
    CHECK(cudaEventCreate(&timed));
    Handles handles;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcGetEventHandle(&handles.event, timed));
    wait_then_double<<<1, 1, 0, stream>>>(control);
    CHECK(cudaEventRecord(event, stream));
    CHECK(cudaIpcGetEventHandle(&handles.event, event));
    CHECK(cudaIpcGetMemHandle(&handles.control, control));
    cudaIpcMemHandle_t handle, same;
    CHECK(cudaIpcGetMemHandle(&handle, memory));
    handles.memory = handle;
    CHECK(cudaIpcGetMemHandle(&same, memory));
    EXPECT(memcmp(&handle, &same, sizeof handle) == 0);
    int *own = nullptr;
    EXPECT_ERROR(cudaErrorDeviceUninitialized,
                 cudaIpcOpenMemHandle((void **)&own, handle, cudaIpcMemLazyEnablePeerAccess));
    int on_host = 0;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaIpcGetMemHandle(&same, &on_host));
    EXPECT(transfer(other.out, &handles, sizeof handles, 1));
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0));
    EXPECT(child_succeeded(other.pid));
    int *result = new int[n];
    CHECK(cudaMemcpy(result, memory, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(result[i] == 3 * i + 1 + 1000 * i);
    int doubled = 0;
    CHECK(cudaMemcpy(&doubled, control + 1, sizeof doubled, cudaMemcpyDeviceToHost));
    EXPECT(doubled == 42);
    CHECK(cudaFree(memory));
    CHECK(cudaFree(control));
    CHECK(cudaEventDestroy(event));
    CHECK(cudaEventDestroy(timed));
    CHECK(cudaStreamDestroy(stream));
    delete[] result;
    printf("ipc_memory: the child process added to %d ints of the parent's memory\n", n);
    return 0;
}
