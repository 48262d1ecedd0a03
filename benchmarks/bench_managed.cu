// Managed memory's cost on the client (benchmarks/bench_managed.py runs this): launches of a
// kernel touching one word, on a cudaMalloc buffer and on a cudaMallocManaged one of the same
// size, then rounds of "host writes a word, launch, synchronize, host reads a word" on managed
// memory against the same with explicit cudaMemcpy of the whole buffer each way.
// Usage: bench_managed MIB LAUNCHES; prints one line of microseconds per operation.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void touch(int *p, int k)
{
    if (threadIdx.x == 0) p[k] += 1;
}

static double seconds_since(std::chrono::steady_clock::time_point start)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

static double launches(int *p, int n)
{
    auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < n; k++) touch<<<1, 32>>>(p, k);
    cudaDeviceSynchronize();
    return seconds_since(start) / n;
}

int main(int argc, char **argv)
{
    size_t bytes = (size_t)atoi(argv[1]) << 20;
    int n = atoi(argv[2]);
    int *plain, *managed, *host = (int *)calloc(bytes, 1);
    cudaMalloc(&plain, bytes);
    cudaMemset(plain, 0, bytes);
    launches(plain, 5);
    double plain_launch = launches(plain, n);
    // Explicit copies each round: what a program without managed memory does.
    auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < n; k++) {
        host[k] = k;
        cudaMemcpy(plain, host, bytes, cudaMemcpyHostToDevice);
        touch<<<1, 32>>>(plain, k);
        cudaMemcpy(host, plain, bytes, cudaMemcpyDeviceToHost);
        if (host[k] != k + 1) return 1;
    }
    double plain_round = seconds_since(start) / n;
    cudaMallocManaged(&managed, bytes);  // from here on every call compares managed memory
    launches(managed, 5);
    double managed_launch = launches(managed, n);
    start = std::chrono::steady_clock::now();
    for (int k = 0; k < n; k++) {
        managed[k] = k;
        touch<<<1, 32>>>(managed, k);
        cudaDeviceSynchronize();
        if (managed[k] != k + 1) return 1;
    }
    double managed_round = seconds_since(start) / n;
    printf("%.1f %.1f %.1f %.1f\n", plain_launch * 1e6, managed_launch * 1e6, plain_round * 1e6,
           managed_round * 1e6);
    return 0;
}
