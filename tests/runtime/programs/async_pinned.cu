// Async copies with page-locked memory: cudaMallocHost and cudaHostAlloc buffers copied on a
// stream, mapped (zero-copy) memory written by a kernel, registered memory as a copy source
// and destination and through its device pointer in kernels, pointer queries.
#include "check.cuh"
#include <vector>

__global__ void increment(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] += 1;
}

__global__ void fill(int *v, int n, int value)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = value + i;
}

int main()
{
    const int n = 2048;
    int *pinned, *result, *mapped, *device;
    CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
    CHECK(cudaHostAlloc(&result, n * sizeof(int), cudaHostAllocDefault));
    CHECK(cudaHostAlloc(&mapped, n * sizeof(int), cudaHostAllocMapped));
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
    // fills its source; a device pointer is not host memory.
    int *copy;
    CHECK(cudaMallocHost(&copy, n * sizeof(int)));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(device, n);
    CHECK(cudaMemcpyAsync(result, device, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(copy, result, n * sizeof(int), cudaMemcpyHostToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(copy[i] == 3 * i + 2);
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemcpy(copy, device, n * sizeof(int), cudaMemcpyHostToHost));
    cudaGetLastError();
    CHECK(cudaFreeHost(copy));

    // Zero-copy: the kernel writes the host buffer through its device pointer.
    int *mapped_device;
    unsigned flags;
    CHECK(cudaHostGetDevicePointer((void **)&mapped_device, mapped, 0));
    CHECK(cudaHostGetFlags(&flags, mapped));
    EXPECT(flags & cudaHostAllocMapped);
    fill<<<(n + 255) / 256, 256, 0, stream>>>(mapped_device, n, 100);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(mapped[i] == 100 + i);

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
    // Through its device pointer, a kernel reads and writes registered memory in place.
    int *registered_device;
    CHECK(cudaHostGetDevicePointer((void **)&registered_device, registered.data(), 0));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(registered_device, n);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(registered[i] == 7);
    CHECK(cudaHostUnregister(registered.data()));
    EXPECT_ERROR(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(registered.data()));
    registered[0] = 8;  // plain memory again, contents kept
    EXPECT(registered[0] == 8 && registered[n - 1] == 7);
    // Registered with cudaHostRegisterMapped: a kernel fills it.
    std::vector<int> filled(n, 0);
    CHECK(cudaHostRegister(filled.data(), n * sizeof(int), cudaHostRegisterMapped));
    int *filled_device;
    CHECK(cudaHostGetDevicePointer((void **)&filled_device, filled.data(), 0));
    fill<<<(n + 255) / 256, 256, 0, stream>>>(filled_device, n, 40);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(filled[i] == 40 + i);
    CHECK(cudaHostUnregister(filled.data()));

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
    CHECK(cudaFreeHost(mapped));
    printf("async_pinned: pinned, mapped and registered copies correct\n");
    return 0;
}
