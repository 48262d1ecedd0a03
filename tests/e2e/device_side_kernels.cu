// Kernels of driver_device_side.c: device-side launches, the device heap, calls through
// function pointers, recursion and grid-wide synchronization. Compiled to PTX with
// -rdc=true; the program links it with libcudadevrt.a (cuLink*), as numba-cuda does.
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

extern "C" __global__ void square_child(int *out, int first)
{
    int i = first + threadIdx.x;
    out[i] = i * i;
}

extern "C" __global__ void launch_squares(int *out)
{
    if (threadIdx.x == 0) square_child<<<1, blockDim.x>>>(out, blockIdx.x * blockDim.x);
}

extern "C" __global__ void heap_copies(const int *in, long long *sums, int n)
{
    int *copy = (int *)malloc(n * sizeof(int));
    // Every thread holds its copy at once (a GPU's threads run together; an emulator may run
    // them one after the other), so a heap too small for all of them refuses some.
    __syncthreads();
    long long sum = 0;
    if (copy) {
        for (int i = 0; i < n; i++) copy[i] = in[i] * (int)(threadIdx.x + 1);
        for (int i = 0; i < n; i++) sum += copy[i];
        free(copy);
    }
    sums[threadIdx.x] = copy ? sum : -1;
}

typedef int (*step_fn)(int);
__device__ int halve(int x) { return x / 2; }
__device__ int triple_plus_one(int x) { return 3 * x + 1; }
__device__ step_fn steps[2] = {halve, triple_plus_one};

__device__ __noinline__ int collatz_steps(int x)  // recursive, through the table
{
    return x == 1 ? 0 : 1 + collatz_steps(steps[x & 1](x));
}

extern "C" __global__ void collatz(int *out)
{
    out[threadIdx.x] = collatz_steps(threadIdx.x + 1);
}

extern "C" __global__ void grid_max(const int *in, int *block_max, int *result, int n)
{
    cg::grid_group grid = cg::this_grid();
    int best = -2147483647;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) best = max(best, in[i]);
    atomicMax(&block_max[blockIdx.x], best);
    grid.sync();
    if (grid.thread_rank() == 0) {
        int all = block_max[0];
        for (int b = 1; b < gridDim.x; b++) all = max(all, block_max[b]);
        *result = all;
    }
}
