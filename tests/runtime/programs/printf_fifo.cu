// CU_LIMIT_PRINTF_FIFO_SIZE bounds a launch's device printf output: what does not fit is
// dropped. cudaDeviceReset restores the default FIFO of 1 MiB, and with it every line.
#include "check.cuh"

__global__ void count(int rounds)
{
    for (int r = 0; r < rounds; ++r)
        printf("line %d\n", r * blockDim.x + threadIdx.x);
}

int main()
{
    size_t fifo = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4096));
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    printf("printf_fifo: small fifo %zu\n", fifo);
    count<<<1, 100>>>(10);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaDeviceReset());
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    printf("printf_fifo: after reset %zu\n", fifo);
    count<<<1, 100>>>(10);
    CHECK(cudaDeviceSynchronize());
    printf("printf_fifo: done\n");
    return 0;
}
