// Host callbacks: cudaLaunchHostFunc and cudaStreamAddCallback run after the work queued
// before them (the copied data is visible to them), once each, with the stream's status.
#include "check.cuh"

struct Seen {
    int calls;
    cudaError_t status;
    cudaStream_t stream;
    const int *data;
    int first_value;
};

__global__ void produce(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = 42 + i;
}

void CUDART_CB host_function(void *user_data)
{
    Seen *seen = (Seen *)user_data;
    seen->calls++;
    seen->first_value = seen->data[0];
}

void CUDART_CB stream_callback(cudaStream_t stream, cudaError_t status, void *user_data)
{
    Seen *seen = (Seen *)user_data;
    seen->calls++;
    seen->status = status;
    seen->stream = stream;
}

int main()
{
    const int n = 64;
    int *device, *host;
    CHECK(cudaMalloc(&device, n * sizeof(int)));
    CHECK(cudaMallocHost(&host, n * sizeof(int)));
    host[0] = -1;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    Seen by_function = {0, cudaErrorUnknown, 0, host, 0};
    Seen by_callback = {0, cudaErrorUnknown, 0, host, 0};
    produce<<<1, n, 0, stream>>>(device, n);
    CHECK(cudaMemcpyAsync(host, device, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaLaunchHostFunc(stream, host_function, &by_function));
    CHECK(cudaStreamAddCallback(stream, stream_callback, &by_callback, 0));
    CHECK(cudaStreamSynchronize(stream));
    EXPECT(by_function.calls == 1 && by_function.first_value == 42);
    EXPECT(by_callback.calls == 1 && by_callback.status == cudaSuccess);
    EXPECT(by_callback.stream == stream);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaStreamAddCallback(stream, stream_callback,
                                                              &by_callback, 1));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(device));
    CHECK(cudaFreeHost(host));
    printf("host_callback: host function and stream callback ran after the copy\n");
    return 0;
}
