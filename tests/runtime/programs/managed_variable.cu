// A __managed__ variable: vgpu has no managed memory, says so when the program starts, and
// refuses the launch of a kernel of that image with cudaErrorNotSupported.
#include "check.cuh"

__managed__ int hits;

__global__ void count()
{
    atomicAdd(&hits, 1);
}

int main()
{
    count<<<1, 4>>>();
    EXPECT_ERROR(cudaErrorNotSupported, cudaGetLastError());
    printf("managed_variable: launch refused\n");
    return 0;
}
