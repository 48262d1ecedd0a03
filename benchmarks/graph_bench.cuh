// What the graph benchmarks (bench_graph_launch.cu, bench_graph_conditional.cu) share: the
// clock they time with and the check of the THREADS counters their kernels add to.
#pragma once
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

enum { THREADS = 32 };

static double seconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Whether each of the THREADS counters at `values` (device memory) holds `expected`.
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
