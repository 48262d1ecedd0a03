// Kernels of driver_streams.c, driver_ipc.c and driver_hints.c: one waits for a flag that
// another, launched after it on another stream, sets.
extern "C" __global__ void wait_for_flag(volatile int *flag, int *seen) {
    while (*flag == 0) {
    }
    *seen = *flag + 1;
}

extern "C" __global__ void set_flag(volatile int *flag, int value) { *flag = value; }

extern "C" __global__ void fill(int *v, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = base + 3 * i;
}

extern "C" __global__ void add_into(const int *a, const int *b, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// For hints_and_libraries.cu's library (loaded with cudaLibraryLoadData).
__device__ int offset = 0;

extern "C" __global__ void scale(int *v, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * k + offset;
}
