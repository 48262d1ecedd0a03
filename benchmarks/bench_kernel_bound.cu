// A kernel-bound program (scripts/gpu-check runs it natively and under vgpu, on a GPU):
// ROUNDS launches of a compute-heavy kernel, a few milliseconds each on a GPU, after one
// warm-up launch. Prints the wall time of the timed launches and a checksum of the result,
// which must be the same natively and under vgpu (the same machine code runs).
//
//   bench_kernel_bound [ROUNDS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void work(float *x, int n, int steps) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int s = 0; s < steps; s++) v = v * 0.999f + 0.001f * __sinf(v + s);
    x[i] = v;
}

__global__ void start(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)(i % 1000) / 1000.0f;
}

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 400;
    const int n = 1 << 22, steps = 2000, threads = 256, blocks = (n + threads - 1) / threads;
    float *x;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    start<<<blocks, threads>>>(x, n);
    work<<<blocks, threads>>>(x, n, steps);  // warm-up: module load, first launch
    CHECK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; r++) work<<<blocks, threads>>>(x, n, steps);
    CHECK(cudaDeviceSynchronize());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float *host = (float *)malloc(n * sizeof(float));
    CHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += host[i];
    printf("kernel_bound_s %.6f\n", seconds);
    printf("checksum %.9e\n", sum);
    return 0;
}
