// Zero copy: kernels use host memory through device pointers. Mapped page-locked memory
// (cudaHostAllocMapped) written by a kernel, registered pageable memory read and written in
// place through its device pointer, and memory registered with cudaHostRegisterMapped
// filled by a kernel; each checked on the host.
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
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));

    int *mapped, *mapped_device;
    unsigned flags;
    CHECK(cudaHostAlloc(&mapped, n * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&mapped_device, mapped, 0));
    CHECK(cudaHostGetFlags(&flags, mapped));
    EXPECT(flags & cudaHostAllocMapped);
    fill<<<(n + 255) / 256, 256, 0, stream>>>(mapped_device, n, 100);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(mapped[i] == 100 + i);

    std::vector<int> registered(n, 6);
    CHECK(cudaHostRegister(registered.data(), n * sizeof(int), cudaHostRegisterDefault));
    int *registered_device;
    CHECK(cudaHostGetDevicePointer((void **)&registered_device, registered.data(), 0));
    // A device that says it can use the host pointer gives it back as the device's.
    int same_pointer = 0;
    CHECK(cudaDeviceGetAttribute(&same_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                 0));
    EXPECT(same_pointer == (registered_device == registered.data()));
    increment<<<(n + 255) / 256, 256, 0, stream>>>(registered_device, n);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(registered[i] == 7);
    CHECK(cudaHostUnregister(registered.data()));
    registered[0] = 8;  // plain memory again, contents kept
    EXPECT(registered[0] == 8 && registered[n - 1] == 7);

    std::vector<int> filled(n, 0);
    CHECK(cudaHostRegister(filled.data(), n * sizeof(int), cudaHostRegisterMapped));
    int *filled_device;
    CHECK(cudaHostGetDevicePointer((void **)&filled_device, filled.data(), 0));
    fill<<<(n + 255) / 256, 256, 0, stream>>>(filled_device, n, 40);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        EXPECT(filled[i] == 40 + i);
    CHECK(cudaHostUnregister(filled.data()));

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(mapped));
    printf("zero_copy: mapped and registered host memory used by kernels correctly\n");
    return 0;
}
