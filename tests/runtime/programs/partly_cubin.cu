// A program whose one file was built cubin-only (partly_cubin_sass.cu, never launched on
// the good path) beside kernels with PTX: the PTX kernels run, the cubin-only one is
// refused at its launch with cudaErrorNoKernelImageForDevice (not sticky), as CUDA loads a
// program's images. A library of cubins only (argv[1]) loads; its kernel is refused.
// Usage: partly_cubin KERNEL.cubin (with one kernel)
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

void launch_sass_only(int *v);

__global__ void twice(int *v)
{
    v[threadIdx.x] *= 2;
}

static std::vector<char> read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    EXPECT(f != nullptr);
    std::vector<char> data;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, f)) > 0)
        data.insert(data.end(), buffer, buffer + n);
    fclose(f);
    return data;
}

int main(int argc, char **argv)
{
    EXPECT(argc == 2);
    int *device, host[4] = {1, 2, 3, 4};
    CHECK(cudaMalloc(&device, sizeof(host)));
    CHECK(cudaMemcpy(device, host, sizeof(host), cudaMemcpyHostToDevice));
    twice<<<1, 4>>>(device);
    CHECK(cudaGetLastError());
    launch_sass_only(device);
    EXPECT_ERROR(cudaErrorNoKernelImageForDevice, cudaGetLastError());
    twice<<<1, 4>>>(device);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4; ++i)
        EXPECT(host[i] == 4 * (i + 1));

    std::vector<char> cubin = read_file(argv[1]);
    cudaLibrary_t library;
    CHECK(cudaLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr,
                              0));
    unsigned int count = 0;
    CHECK(cudaLibraryGetKernelCount(&count, library));
    EXPECT(count == 1);
    cudaKernel_t kernel;
    EXPECT_ERROR(cudaErrorNoKernelImageForDevice, cudaLibraryGetKernel(&kernel, library, "k"));
    CHECK(cudaLibraryUnload(library));
    CHECK(cudaFree(device));
    printf("partly_cubin: PTX kernels ran beside cubin-only ones, which were refused\n");
    return 0;
}
