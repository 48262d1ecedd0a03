// Kernels of driver_graphs.c's conditional nodes, compiled to PTX by the test: the condition
// is set on the device, as CUDA's programs set it (cudaGraphSetConditional).
#include <cuda_runtime.h>

extern "C" __global__ void set_condition(cudaGraphConditionalHandle handle, const int *value) {
    cudaGraphSetConditional(handle, *value);
}

// A WHILE body: one more step of a countdown; the loop goes on while steps are left.
extern "C" __global__ void count_down(cudaGraphConditionalHandle handle, int *left,
                                      int *steps) {
    *steps += 1;
    *left -= 1;
    cudaGraphSetConditional(handle, *left > 0);
}
