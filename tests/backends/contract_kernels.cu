// Kernels of the backend contract suite (test_backend_contract.py): one of each thing a
// backend must run. Built to PTX and to a fatbin by the suite itself.
#include <cassert>
#include <cstdio>

__device__ int counter = 1000;
__constant__ float scale[2] = {2.0f, 0.5f};

// Parameters of four sizes and alignments: the layout the backend must describe.
extern "C" __global__ void axpb(float *y, const float *x, float a, int n, double b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + (float)b;
}

extern "C" __global__ void count_up(int times) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter += times;
}

extern "C" __global__ void scaled(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale[0] + scale[1];
}

// Reads through pointers that device memory holds: valid only where addresses are stable.
extern "C" __global__ void follow(long long *out, long long *const *pointers, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = *pointers[i];
}

extern "C" __global__ void store_at(int *where, int value) { *where = value; }

extern "C" __global__ void say(int value) {
    printf("block %d thread %d value %d\n", (int)blockIdx.x, (int)threadIdx.x, value);
}

extern "C" __global__ void insist(int value) {
    printf("before the assert %d\n", value);
    assert(value == 0);
}

// Spins until the host sets *flag (a host buffer the device reaches), then stores behind it.
extern "C" __global__ void store_after_flag(volatile int *flag, int *where, int value) {
    while (*flag == 0) {
    }
    *where = value + *flag;
}

extern "C" __global__ void copy_int(const int *from, int *to) { *to = *from; }
