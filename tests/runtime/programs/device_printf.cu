// Device printf: the kernel's lines reach the program's stdout at the next synchronization,
// in order with the host's own output.
#include "check.cuh"

__global__ void greet(float base)
{
    printf("block %d thread %d says %.2f %s\n", blockIdx.x, threadIdx.x,
           base + threadIdx.x, threadIdx.x % 2 ? "odd" : "even");
}

int main()
{
    printf("host before\n");
    greet<<<2, 3>>>(1.5f);
    CHECK(cudaDeviceSynchronize());
    printf("host after\n");
    return 0;
}
