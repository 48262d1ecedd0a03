// The runtime layer's cost per <<<>>> launch, against cuLaunchKernel of the same kernel in the
// same process (bench_runtime.py runs it under vgpu and reads its output), and per call of a
// runtime function that is not a launch (cudaMemsetAsync of 4 bytes, queued like a launch).
//
//   bench_runtime_launch LAUNCHES ROUNDS
//
// Each round times LAUNCHES back-to-back calls through each path, client side (the time
// until the calls return; the server does the work meanwhile), then synchronizes. The paths
// alternate so that all see the same machine; the output is one line per round.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void empty(float *a, const float *b, int n) {}

static double seconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int main(int argc, char **argv)
{
    int launches = argc > 1 ? atoi(argv[1]) : 10000, rounds = argc > 2 ? atoi(argv[2]) : 5;
    float *a, *b;
    int n = 1;
    if (cudaMalloc(&a, 4) != cudaSuccess || cudaMalloc(&b, 4) != cudaSuccess)
        return 1;
    cudaFunction_t function;
    if (cudaGetFuncBySymbol(&function, (const void *)empty) != cudaSuccess)
        return 1;
    void *params[] = {&a, &b, &n};
    for (int round = -1; round < rounds; ++round) {  // round -1 warms both paths up
        double start = seconds();
        for (int i = 0; i < launches; ++i)
            empty<<<1, 1>>>(a, b, n);
        double runtime = seconds() - start;
        if (cudaDeviceSynchronize() != cudaSuccess)
            return 1;
        start = seconds();
        for (int i = 0; i < launches; ++i)
            cuLaunchKernel((CUfunction)function, 1, 1, 1, 1, 1, 1, 0, 0, params, NULL);
        double driver = seconds() - start;
        if (cudaDeviceSynchronize() != cudaSuccess)
            return 1;
        start = seconds();
        for (int i = 0; i < launches; ++i)
            cudaMemsetAsync(a, 0, 4);
        double memset = seconds() - start;
        if (cudaDeviceSynchronize() != cudaSuccess)
            return 1;
        if (round >= 0)
            printf("round %d runtime_us %.4f driver_us %.4f memset_us %.4f\n", round,
                   1e6 * runtime / launches, 1e6 * driver / launches, 1e6 * memset / launches);
    }
    return 0;
}
