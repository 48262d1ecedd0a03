// A host loop of 1M-thread saxpy launches, timed by the program itself: asynchronous
// launches (one synchronization at the end), then a synchronization after every launch.
// Prints the microseconds per iteration of each.
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

static double per_iteration_us(float* x, float* y, int n, int iterations, bool sync_each) {
    auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < iterations; ++k) {
        saxpy<<<n / 256, 256>>>(2.0f, x, y, n);
        if (sync_each) cudaDeviceSynchronize();
    }
    cudaDeviceSynchronize();
    auto elapsed = std::chrono::steady_clock::now() - start;
    return std::chrono::duration<double, std::micro>(elapsed).count() / iterations;
}

int main(int argc, char** argv) {
    int n = 1 << 20, iterations = argc > 1 ? atoi(argv[1]) : 300;
    float *x, *y;
    if (cudaMalloc(&x, n * 4) != cudaSuccess || cudaMalloc(&y, n * 4) != cudaSuccess) return 1;
    cudaMemset(x, 0, n * 4);
    cudaMemset(y, 0, n * 4);
    per_iteration_us(x, y, n, 20, false);   // the kernel compiled, pages touched
    double async = per_iteration_us(x, y, n, iterations, false);
    double synced = per_iteration_us(x, y, n, iterations, true);
    if (cudaGetLastError() != cudaSuccess) return 1;
    printf("%.2f %.2f\n", async, synced);
    return 0;
}
