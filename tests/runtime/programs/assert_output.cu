// A device assert after device printf: at the synchronization CUDA prints every line the
// launch printed (stdout), then one line per failing thread (stderr), and returns
// cudaErrorAssert. Exits 0 when it got that error.
#include "check.cuh"
#include <cassert>

__global__ void check(const int *values, int n)
{
    int i = threadIdx.x;
    if (i < n) {
        printf("thread %d checks %d\n", i, values[i]);
        assert(values[i] > 0);
    }
}

int main()
{
    const int n = 9;
    int values[n] = {1, 2, 3, -4, 5, 6, 7, -8, 9};
    int *device;
    CHECK(cudaMalloc(&device, sizeof(values)));
    CHECK(cudaMemcpy(device, values, sizeof(values), cudaMemcpyHostToDevice));
    check<<<1, 32>>>(device, n);
    EXPECT_ERROR(cudaErrorAssert, cudaDeviceSynchronize());
    printf("assert_output: error %d\n", (int)cudaErrorAssert);
    return 0;
}
