// Reduction: dynamic shared memory (the third <<<>>> argument), a tree in shared memory, then
// warp shuffles for the last 32 values, one atomicAdd per block.
#include "check.cuh"

__inline__ __device__ int warp_sum(int value)
{
    for (int offset = warpSize / 2; offset > 0; offset /= 2)
        value += __shfl_down_sync(0xffffffffu, value, offset);
    return value;
}

__global__ void reduce_sum(const int *in, int *total, int n)
{
    extern __shared__ int partial[];
    int tid = threadIdx.x;
    int sum = 0;
    for (int i = blockIdx.x * blockDim.x + tid; i < n; i += blockDim.x * gridDim.x)
        sum += in[i];
    partial[tid] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 32; stride /= 2) {
        if (tid < stride)
            partial[tid] += partial[tid + stride];
        __syncthreads();
    }
    if (tid < 32) {
        int value = warp_sum(partial[tid]);
        if (tid == 0)
            atomicAdd(total, value);
    }
}

int main()
{
    const int n = 5000, threads = 128, blocks = 8;
    static int values[n];
    long long expected = 0;
    for (int i = 0; i < n; ++i) {
        values[i] = (i * 37) % 101 - 50;
        expected += values[i];
    }
    int *din, *dtotal, total = 0;
    CHECK(cudaMalloc(&din, sizeof(values)));
    CHECK(cudaMalloc(&dtotal, sizeof(int)));
    CHECK(cudaMemcpy(din, values, sizeof(values), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dtotal, 0, sizeof(int)));
    reduce_sum<<<blocks, threads, threads * sizeof(int)>>>(din, dtotal, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&total, dtotal, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(total == expected);
    CHECK(cudaFree(din));
    CHECK(cudaFree(dtotal));
    printf("reduction: sum %d correct\n", total);
    return 0;
}
