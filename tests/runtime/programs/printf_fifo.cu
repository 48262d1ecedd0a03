// CU_LIMIT_PRINTF_FIFO_SIZE bounds a launch's device printf output: what does not fit is
// dropped. As on CUDA, the size may be set until a kernel that calls printf has been
// launched; cudaDeviceReset restores the default FIFO of 1 MiB, and with it every line.
#include "check.cuh"

__global__ void count(int rounds)
{
    for (int r = 0; r < rounds; ++r)
        printf("line %d\n", r * blockDim.x + threadIdx.x);
}

__global__ void quiet(int *out)
{
    out[threadIdx.x] = threadIdx.x;
}

int main()
{
    size_t fifo = 0;
    int *out;
    CHECK(cudaMalloc(&out, 32 * sizeof(int)));
    quiet<<<1, 32>>>(out);  // no printf: the FIFO may still change
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4096));
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    printf("printf_fifo: small fifo %zu\n", fifo);
    count<<<1, 100>>>(10);
    CHECK(cudaDeviceSynchronize());
    EXPECT_ERROR(cudaErrorInvalidValue, cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 1 << 16));
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    EXPECT(fifo == 4096);
    CHECK(cudaDeviceReset());
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    printf("printf_fifo: after reset %zu\n", fifo);
    count<<<1, 100>>>(10);
    CHECK(cudaDeviceSynchronize());
    printf("printf_fifo: done\n");
    return 0;
}
