// Reads past the end of an allocation. `near`: one element past the end, inside the
// memory a GPU maps for the allocation (it runs there; a memory checker reports it), from
// two kernels, each launched twice. `far`: a megabyte past the end, where a GPU faults.
// Prints the allocation's address and what the synchronization returned; exits 0 only when
// the kernels ran without error.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

extern "C" __global__ void sum_next(const int *values, int n, int *sums)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        sums[i] = values[i] + values[i + 1];  // the last thread reads values[n]
}

extern "C" __global__ void read_at(const int *values, long offset, int *out)
{
    out[threadIdx.x] = values[offset + threadIdx.x];
}

int main(int argc, char **argv)
{
    const int n = 100;
    bool far = argc > 1 && strcmp(argv[1], "far") == 0;
    int *values, *sums;
    cudaMalloc(&values, n * sizeof(int));
    cudaMalloc(&sums, 1024 * sizeof(int));
    cudaMemset(values, 0, n * sizeof(int));
    printf("out_of_bounds: values at %p\n", (void *)values);
    if (far) {
        read_at<<<1, 4>>>(values, 1 << 18, sums);
    } else {
        for (int round = 0; round < 2; ++round) {
            sum_next<<<1, 128>>>(values, n, sums);
            read_at<<<1, 4>>>(values, n - 2, sums);
        }
    }
    cudaError_t err = cudaDeviceSynchronize();
    printf("out_of_bounds: synchronize returned %d\n", (int)err);
    printf("out_of_bounds: again %d\n", (int)cudaDeviceSynchronize());
    return err == cudaSuccess ? 0 : 3;
}
