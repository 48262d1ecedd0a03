// A loop that runs until the device says it is done: a graph's WHILE node (the condition set
// by the body's kernel) against the host loop a program writes without conditional nodes
// (launch the kernel, copy its flag back, decide), in the same process
// (bench_graph_conditional.py runs it under vgpu and reads its output).
//
//   bench_graph_conditional ITERATIONS ROUNDS
//
// Each round times one launch of the graph, whose WHILE body runs ITERATIONS times, then the
// host loop of ITERATIONS launches and copies; both end to end (until the answer is on the
// host). They alternate so that both see the same machine; the output is one line per
// round, in microseconds per iteration.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

enum { THREADS = 32 };

// One step: every thread adds 1 to its value; thread 0 counts down and says whether to go on.
__global__ void step(int *values, int *left, int *more, cudaGraphConditionalHandle handle)
{
    values[threadIdx.x] += 1;
    if (threadIdx.x == 0) {
        *left -= 1;
        *more = *left > 0;
        if (handle) cudaGraphSetConditional(handle, *more);
    }
}

static double seconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static bool check(int *values, int expected)
{
    int host[THREADS];
    if (cudaMemcpy(host, values, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess)
        return false;
    for (int i = 0; i < THREADS; ++i)
        if (host[i] != expected) {
            fprintf(stderr, "values[%d] = %d, expected %d\n", i, host[i], expected);
            return false;
        }
    return true;
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 50, rounds = argc > 2 ? atoi(argv[2]) : 5;
    int *values, *left, *more;
    cudaStream_t stream;
    if (cudaMalloc(&values, THREADS * sizeof(int)) != cudaSuccess ||
        cudaMalloc(&left, sizeof(int)) != cudaSuccess ||
        cudaMalloc(&more, sizeof(int)) != cudaSuccess ||
        cudaMemset(values, 0, THREADS * sizeof(int)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        return 1;
    cudaGraph_t graph, body;
    cudaGraphExec_t exec;
    cudaGraphConditionalHandle handle;
    if (cudaGraphCreate(&graph, 0) != cudaSuccess ||
        cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault) !=
            cudaSuccess)
        return 1;
    cudaGraphNodeParams loop = {};
    loop.type = cudaGraphNodeTypeConditional;
    loop.conditional.handle = handle;
    loop.conditional.type = cudaGraphCondTypeWhile;
    loop.conditional.size = 1;
    loop.conditional.phGraph_out = &body;
    cudaGraphNode_t node;
    if (cudaGraphAddNode(&node, graph, nullptr, nullptr, 0, &loop) != cudaSuccess)
        return 1;
    void *args[] = {&values, &left, &more, &handle};
    cudaKernelNodeParams kernel = {};
    kernel.func = (void *)step;
    kernel.gridDim = dim3(1);
    kernel.blockDim = dim3(THREADS);
    kernel.kernelParams = args;
    if (cudaGraphAddKernelNode(&node, body, nullptr, 0, &kernel) != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
        return 1;
    cudaGraphConditionalHandle none = 0;
    int expected = 0;
    for (int round = -1; round < rounds; ++round) {  // round -1 warms both paths up
        double start = seconds();
        if (cudaMemcpyAsync(left, &iterations, sizeof(int), cudaMemcpyHostToDevice, stream) !=
                cudaSuccess ||
            cudaGraphLaunch(exec, stream) != cudaSuccess ||
            cudaStreamSynchronize(stream) != cudaSuccess)
            return 1;
        double graph_us = 1e6 * (seconds() - start) / iterations;
        start = seconds();
        if (cudaMemcpyAsync(left, &iterations, sizeof(int), cudaMemcpyHostToDevice, stream) !=
                cudaSuccess)
            return 1;
        for (int go_on = 1; go_on;) {
            step<<<1, THREADS, 0, stream>>>(values, left, more, none);
            if (cudaMemcpyAsync(&go_on, more, sizeof(int), cudaMemcpyDeviceToHost, stream) !=
                    cudaSuccess ||
                cudaStreamSynchronize(stream) != cudaSuccess)
                return 1;
        }
        double host_us = 1e6 * (seconds() - start) / iterations;
        expected += 2 * iterations;
        if (!check(values, expected))
            return 1;
        if (round >= 0)
            printf("round %d while_node_us %.2f host_loop_us %.2f\n", round, graph_us, host_us);
    }
    return 0;
}
