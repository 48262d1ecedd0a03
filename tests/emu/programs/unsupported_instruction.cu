// A module where one device function uses an instruction the emulator does not implement
// (vadd, a video instruction). Only the kernels that can reach it fail, when launched,
// with cudaErrorNotSupported; the module's other kernels and __device__ variables (a table
// of function pointers, called through, included) work, and the error is not sticky.
#include <cstring>
#include "check.cuh"

__device__ int counter = 5;

__device__ __noinline__ unsigned saturated_sum(const unsigned short *tile)
{
    unsigned fragment;
    asm volatile("vadd.s32.s32.s32.sat %0, %1, %2;"
                 : "=r"(fragment) : "r"((unsigned)tile[threadIdx.x]), "r"(threadIdx.x));
    return fragment;
}

__global__ void uses_a_video_instruction(unsigned *out)
{
    __shared__ unsigned short tile[64];
    for (int i = threadIdx.x; i < 64; i += blockDim.x)
        tile[i] = (unsigned short)i;
    __syncwarp();
    out[threadIdx.x] = saturated_sum(tile);
}

typedef int (*operation)(int);
__device__ int increment(int x) { return x + 1; }
__device__ int twice(int x) { return 2 * x; }
__device__ operation operations[2] = {increment, twice};

__global__ void apply(int *values, int k)
{
    values[threadIdx.x] = operations[k](values[threadIdx.x]);
}

__global__ void add_to_counter(int *out, int amount)
{
    int old = atomicAdd(&counter, amount);
    out[threadIdx.x] = old;
}

int main()
{
    unsigned *dfragments;
    int *dout;
    CHECK(cudaMalloc(&dfragments, 32 * sizeof(unsigned)));
    CHECK(cudaMalloc(&dout, sizeof(int)));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, uses_a_video_instruction));

    uses_a_video_instruction<<<1, 32>>>(dfragments);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t failure = launch != cudaSuccess ? launch : sync;
    EXPECT(failure == cudaErrorNotSupported);
    printf("unsupported_instruction: launch failed with %s\n", cudaGetErrorName(failure));
    cudaGetLastError();  // a failed call also sets the last error: clear it

    int value = 20;
    CHECK(cudaMemcpy(dout, &value, sizeof(int), cudaMemcpyHostToDevice));
    apply<<<1, 1>>>(dout, 0);
    apply<<<1, 1>>>(dout, 1);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&value, dout, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(value == 42);
    operation table[2] = {nullptr, nullptr};
    CHECK(cudaMemcpyFromSymbol(table, operations, sizeof(table)));
    EXPECT(table[0] != nullptr && table[1] != nullptr && table[0] != table[1]);
    printf("unsupported_instruction: indirect calls work, the function table is readable\n");

    add_to_counter<<<1, 1>>>(dout, 3);
    CHECK(cudaGetLastError());
    int old = 0, now = 0;
    CHECK(cudaMemcpy(&old, dout, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(&now, counter, sizeof(int)));
    EXPECT(old == 5 && now == 8);
    int reset = 40;
    CHECK(cudaMemcpyToSymbol(counter, &reset, sizeof(int)));
    add_to_counter<<<1, 1>>>(dout, 2);
    CHECK(cudaMemcpyFromSymbol(&now, counter, sizeof(int)));
    EXPECT(now == 42);
    printf("unsupported_instruction: other kernels and __device__ variables work\n");
    return 0;
}
