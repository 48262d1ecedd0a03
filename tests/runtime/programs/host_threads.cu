// Host threads: each thread adopts the runtime's context on its first call and launches on
// its own stream; launch configurations and last errors are per thread.
#include "check.cuh"
#include <thread>
#include <vector>

__global__ void fill(int *v, int n, int value)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = value;
}

static void worker(int id, int *result)
{
    const int n = 128;
    int *device, host[n];
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMalloc(&device, n * sizeof(int)));
    fill<<<2, 64, 0, stream>>>(device, n, id + 10);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(host, device, sizeof(host), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    int good = 0;
    for (int i = 0; i < n; ++i)
        good += host[i] == id + 10;
    if (id == 0)  // a failure in one thread is not another thread's last error
        EXPECT_ERROR(cudaErrorInvalidValue, cudaFree(host));
    CHECK(cudaFree(device));
    CHECK(cudaStreamDestroy(stream));
    *result = good;
}

int main()
{
    const int threads = 4;
    int results[threads];
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back(worker, t, &results[t]);
    for (auto &thread : pool)
        thread.join();
    for (int t = 0; t < threads; ++t)
        EXPECT(results[t] == 128);
    CHECK(cudaGetLastError());  // the main thread saw no failure
    printf("host_threads: %d threads launched and copied correctly\n", threads);
    return 0;
}
