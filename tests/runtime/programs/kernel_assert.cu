// A failing assert in a kernel: cudaErrorAssert (710) at the next synchronization, sticky for
// every later call that uses the device. cudaGetLastError hands it out once, as any last
// error: it reads the thread's last error, which each of those failing calls sets again.
// Nothing after it is tried: CUDA documents the process as unusable for the device from here
// on (it must exit and be relaunched; NVIDIA's driver refuses the device even after
// cudaDeviceReset).
#include "check.cuh"
#include <cassert>

__global__ void check_positive(const int *values, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        assert(values[i] > 0);
}

int main()
{
    const int n = 32;
    int values[n];
    for (int i = 0; i < n; ++i)
        values[i] = i == 5 ? -1 : i + 1;
    int *device;
    CHECK(cudaMalloc(&device, sizeof(values)));
    CHECK(cudaMemcpy(device, values, sizeof(values), cudaMemcpyHostToDevice));
    check_positive<<<1, n>>>(device, n);
    EXPECT_ERROR(cudaErrorAssert, cudaDeviceSynchronize());
    EXPECT_ERROR(cudaErrorAssert, cudaPeekAtLastError());
    EXPECT_ERROR(cudaErrorAssert, cudaGetLastError());
    CHECK(cudaGetLastError());
    CHECK(cudaPeekAtLastError());
    void *more;
    EXPECT_ERROR(cudaErrorAssert, cudaMalloc(&more, 16));
    EXPECT_ERROR(cudaErrorAssert, cudaPeekAtLastError());
    EXPECT_ERROR(cudaErrorAssert, cudaGetLastError());
    EXPECT_ERROR(cudaErrorAssert, cudaMemcpy(values, device, sizeof(values),
                                             cudaMemcpyDeviceToHost));
    EXPECT_ERROR(cudaErrorAssert, cudaStreamSynchronize(nullptr));
    EXPECT_ERROR(cudaErrorAssert, cudaGetLastError());
    CHECK(cudaGetLastError());
    printf("kernel_assert: error %d reported and sticky\n", (int)cudaErrorAssert);
    return 0;
}
