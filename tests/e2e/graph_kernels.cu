// Kernels of driver_graphs.c's conditional nodes and device graph launches, compiled to PTX
// by the test: conditions are set and graphs launched on the device, as CUDA's programs do.
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

// Launches a graph instantiated for device launch, fire-and-forget; the code it returns.
extern "C" __global__ void launch_graph(cudaGraphExec_t graph, int *code) {
    *code = cudaGraphLaunch(graph, cudaStreamGraphFireAndForget);
}

// Where a kernel of a device graph finds its graph: 0 outside one.
extern "C" __global__ void record_current_graph(unsigned long long *out) {
    *out = (unsigned long long)cudaGetCurrentGraphExec();
}
