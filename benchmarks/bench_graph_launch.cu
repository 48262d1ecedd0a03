// A graph of 100 small kernel nodes against the same 100 kernels launched one by one, in the
// same process (bench_graphs.py runs it under vgpu and reads its output).
//
//   bench_graph_launch REPEATS ROUNDS
//
// Each round times REPEATS launches of the graph, then REPEATS x 100 launches of the kernels,
// each both client side (until the launch calls return) and end to end (until a
// synchronization returns). The two alternate so that both see the same machine; the output
// is one line per round, in microseconds per 100 kernels.
#include "graph_bench.cuh"
#include <cstdio>
#include <cstdlib>

enum { NODES = 100 };

__global__ void add_one(int *values) { values[threadIdx.x] += 1; }

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 20, rounds = argc > 2 ? atoi(argv[2]) : 5;
    int *values;
    cudaStream_t stream;
    if (cudaMalloc(&values, THREADS * sizeof(int)) != cudaSuccess ||
        cudaMemset(values, 0, THREADS * sizeof(int)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        return 1;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
        return 1;
    for (int i = 0; i < NODES; ++i)
        add_one<<<1, THREADS, 0, stream>>>(values);
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
        return 1;
    int expected = 0;
    for (int round = -1; round < rounds; ++round) {  // round -1 warms both paths up
        double start = seconds();
        for (int r = 0; r < repeats; ++r)
            cudaGraphLaunch(exec, stream);
        double graph_client = seconds() - start;
        if (cudaStreamSynchronize(stream) != cudaSuccess)
            return 1;
        double graph_total = seconds() - start;
        start = seconds();
        for (int r = 0; r < repeats; ++r)
            for (int i = 0; i < NODES; ++i)
                add_one<<<1, THREADS, 0, stream>>>(values);
        double kernels_client = seconds() - start;
        if (cudaStreamSynchronize(stream) != cudaSuccess)
            return 1;
        double kernels_total = seconds() - start;
        expected += 2 * repeats * NODES;
        if (!check(values, expected))
            return 1;
        if (round >= 0)
            printf("round %d graph_client_us %.2f graph_total_us %.2f kernels_client_us %.2f "
                   "kernels_total_us %.2f\n", round, 1e6 * graph_client / repeats,
                   1e6 * graph_total / repeats, 1e6 * kernels_client / repeats,
                   1e6 * kernels_total / repeats);
    }
    return 0;
}
