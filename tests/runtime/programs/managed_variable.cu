// A __managed__ variable: written by the host, counted on by a kernel, read back by the host
// after synchronizing, through the same name on both sides.
#include "check.cuh"

__managed__ int hits;

__global__ void count()
{
    atomicAdd(&hits, 1);
}

int main()
{
    hits = 10;
    count<<<2, 4>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    EXPECT(hits == 18);
    printf("managed_variable: 8 hits counted on top of the host's 10\n");
    return 0;
}
