// Async copies with page-locked memory: cudaMallocHost and cudaHostAlloc buffers copied on a
// stream, registered memory as a copy source and destination, pointer queries. (Kernels
// using host memory through device pointers: zero_copy.cu.)
#include "check.cuh"
#include <vector>

__global__ void increment(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] += 1;
}

int main()
{
    const int n = 2048;
    int *pinned, *result, *device;
    CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
    CHECK(cudaHostAlloc(&result, n * sizeof(int), cudaHostAllocDefault));
    CHECK(cudaMalloc(&device, n * sizeof(int)));
    for (int i = 0; i < n; ++i)
        pinned[i] = 3 * i;

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemcpyAsync(device, pinned, n * sizeof(int), cudaMemcpyHostToDevice, stream));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(device, n);
    CHECK(cudaMemcpyAsync(result, device, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(result[i] == 3 * i + 1);

    // A host-to-host copy on the stream comes after the queued device-to-host copy that
    // fills its source. With unified addressing the pointers decide where a copy reads:
    // a "host-to-host" copy from device memory copies it, as cudaMemcpyDefault would.
    int *copy;
    CHECK(cudaMallocHost(&copy, n * sizeof(int)));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(device, n);
    CHECK(cudaMemcpyAsync(result, device, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(copy, result, n * sizeof(int), cudaMemcpyHostToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(copy[i] == 3 * i + 2);
    for (int i = 0; i < n; ++i)
        copy[i] = 0;
    CHECK(cudaMemcpy(copy, device, n * sizeof(int), cudaMemcpyHostToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(copy[i] == 3 * i + 2);
    CHECK(cudaFreeHost(copy));

    // Registered pageable memory works as a copy source and destination.
    std::vector<int> registered(n, 5);
    CHECK(cudaHostRegister(registered.data(), n * sizeof(int), cudaHostRegisterDefault));
    CHECK(cudaMemcpyAsync(device, registered.data(), n * sizeof(int), cudaMemcpyHostToDevice,
                          stream));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(device, n);
    CHECK(cudaMemcpyAsync(registered.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost,
                          stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(registered[i] == 6);
    CHECK(cudaHostUnregister(registered.data()));
    EXPECT_ERROR(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(registered.data()));
    registered[0] = 8;  // plain memory again, contents kept
    EXPECT(registered[0] == 8 && registered[n - 1] == 6);
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, pinned));
    EXPECT(attributes.type == cudaMemoryTypeHost && attributes.hostPointer == pinned);
    CHECK(cudaPointerGetAttributes(&attributes, device + 10));
    EXPECT(attributes.type == cudaMemoryTypeDevice && attributes.devicePointer == device + 10);
    CHECK(cudaPointerGetAttributes(&attributes, registered.data() + n));
    EXPECT(attributes.type == cudaMemoryTypeUnregistered);

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(device));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFreeHost(result));
    printf("async_pinned: pinned and registered copies correct\n");
    return 0;
}
