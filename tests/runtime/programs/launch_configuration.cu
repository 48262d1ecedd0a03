// The configuration stack <<<>>> uses (nvcc's generated code pushes before the host stub and
// pops inside it): last pushed, first popped, per thread, and an unpaired pop is refused.
// Launches nest their pushes and pops correctly around it.
#include "check.cuh"
#include <thread>

extern "C" unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                                cudaStream_t stream);
extern "C" cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                  void *stream);

__global__ void fill(int *out, int value)
{
    out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

static bool pops_as(dim3 grid, dim3 block, size_t shared, cudaStream_t stream)
{
    dim3 g, b;
    size_t s = 0;
    cudaStream_t st = nullptr;
    if (__cudaPopCallConfiguration(&g, &b, &s, &st) != cudaSuccess)
        return false;
    return g.x == grid.x && g.y == grid.y && g.z == grid.z && b.x == block.x &&
           b.y == block.y && b.z == block.z && s == shared && st == stream;
}

int main()
{
    dim3 g, b;
    size_t s;
    cudaStream_t st, stream;
    CHECK(cudaStreamCreate(&stream));
    EXPECT_ERROR(cudaErrorMissingConfiguration, __cudaPopCallConfiguration(&g, &b, &s, &st));

    EXPECT(__cudaPushCallConfiguration(dim3(1, 2, 3), dim3(4, 5, 6), 7, nullptr) == 0);
    EXPECT(__cudaPushCallConfiguration(dim3(8), dim3(9), 10, stream) == 0);
    bool other_thread_empty = false;
    std::thread([&] {
        other_thread_empty = __cudaPopCallConfiguration(&g, &b, &s, &st) ==
                             cudaErrorMissingConfiguration;
    }).join();
    EXPECT(other_thread_empty);
    EXPECT(pops_as(dim3(8), dim3(9), 10, stream));
    EXPECT(pops_as(dim3(1, 2, 3), dim3(4, 5, 6), 7, nullptr));
    EXPECT_ERROR(cudaErrorMissingConfiguration, __cudaPopCallConfiguration(&g, &b, &s, &st));

    int *out, host[96];
    CHECK(cudaMalloc(&out, sizeof(host)));
    for (int i = 0; i < 50; i++)
        fill<<<3, 32, 0, i % 2 ? stream : nullptr>>>(out, i);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 96; i++)
        EXPECT(host[i] == 49);
    EXPECT_ERROR(cudaErrorMissingConfiguration, __cudaPopCallConfiguration(&g, &b, &s, &st));
    printf("launch_configuration: pushes and pops paired, per thread\n");
    return 0;
}
