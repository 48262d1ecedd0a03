// The smaller calls real programs make: access-policy windows and the persisting-L2 limit
// (accepted as the hints they are, checked as CUDA checks them), cudaFuncSetAttribute,
// cudaOccupancyMaxPotentialBlockSize, and a library loaded from PTX at run time
// (cudaLibraryLoadData, as cuRAND's host library loads its kernels) whose kernel is launched
// with cudaLaunchKernel. Results are checked against the host.
// Usage: hints_and_libraries LIBRARY.ptx (with `scale(int *v, int n, int k)` and `int offset`)
#include "check.cuh"
#include <vector>

__global__ void shifted_copy(const int *in, int *out, int n)
{
    extern __shared__ int staged[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    staged[threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();
    if (i < n)
        out[i] = staged[blockDim.x - 1 - threadIdx.x] + 1;
}

__global__ void square(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = v[i] * v[i];
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    EXPECT(f != nullptr);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = (char *)calloc(size + 1, 1);
    EXPECT(fread(text, 1, size, f) == (size_t)size);
    fclose(f);
    return text;
}

int main(int argc, char **argv)
{
    EXPECT(argc > 1);
    const int n = 4096;
    std::vector<int> host(n), back(n);
    for (int i = 0; i < n; i++)
        host[i] = i % 97 - 40;
    int *a, *b;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMemcpy(a, host.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    // 1. An access-policy window on a stream and a persisting set-aside: hints.
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(prop.persistingL2CacheMaxSize > 0 && prop.accessPolicyMaxWindowSize > 0);
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize));
    size_t set_aside = 0;
    CHECK(cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize));
    EXPECT(set_aside == (size_t)prop.persistingL2CacheMaxSize);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cudaStreamAttrValue window = {};
    window.accessPolicyWindow.base_ptr = a;
    window.accessPolicyWindow.num_bytes = n * sizeof(int);
    window.accessPolicyWindow.hitRatio = 0.6f;
    window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &window));
    cudaStreamAttrValue seen = {};
    CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &seen));
    EXPECT(seen.accessPolicyWindow.base_ptr == a && seen.accessPolicyWindow.hitRatio == 0.6f);
    EXPECT(seen.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting);
    cudaStreamAttrValue too_big = window;
    too_big.accessPolicyWindow.num_bytes = (size_t)prop.accessPolicyMaxWindowSize + 1;
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &too_big));
    too_big = window;
    too_big.accessPolicyWindow.hitRatio = 1.5f;
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &too_big));

    // 2. cudaFuncSetAttribute: 64 KiB of dynamic shared memory once asked for.
    const int block = 16384;  // ints of shared memory: a 64 KiB block's worth
    const int threads = 1024;
    shifted_copy<<<n / threads, threads, block * sizeof(int), stream>>>(a, b, n);
    EXPECT(cudaGetLastError() != cudaSuccess);  // more than 48 KiB, not asked for
    CHECK(cudaFuncSetAttribute(shifted_copy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               block * sizeof(int)));
    CHECK(cudaFuncSetAttribute(shifted_copy, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared));
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaFuncSetAttribute(shifted_copy, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      101));
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);  // the failure above, reported once
    shifted_copy<<<n / threads, threads, block * sizeof(int), stream>>>(a, b, n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        int first = i / threads * threads;
        EXPECT(back[i] == host[first + threads - 1 - (i - first)] + 1);
    }
    CHECK(cudaCtxResetPersistingL2Cache());

    // 3. The occupancy calculator's block size runs the kernel correctly.
    int min_grid = 0, best_block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &best_block, square));
    EXPECT(best_block > 0 && best_block % 32 == 0 && best_block <= 1024);
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, square, best_block, 0));
    EXPECT(min_grid == per_sm * prop.multiProcessorCount);
    square<<<(n + best_block - 1) / best_block, best_block, 0, stream>>>(b, n);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        int first = i / threads * threads;
        int v = host[first + threads - 1 - (i - first)] + 1;
        EXPECT(back[i] == v * v);
    }

    // 4. A library loaded from PTX; its kernel launched as any other, its variable read.
    char *ptx = read_text(argv[1]);
    cudaLibrary_t library;
    CHECK(cudaLibraryLoadData(&library, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t scale;
    CHECK(cudaLibraryGetKernel(&scale, library, "scale"));
    EXPECT_ERROR(cudaErrorSymbolNotFound, cudaLibraryGetKernel(&scale, library, "missing"));
    CHECK(cudaLibraryGetKernel(&scale, library, "scale"));
    unsigned kernel_count = 0;
    CHECK(cudaLibraryGetKernelCount(&kernel_count, library));
    EXPECT(kernel_count == 5);  // the __global__ functions of tests/e2e/stream_kernels.cu
    cudaKernel_t enumerated[5] = {};
    CHECK(cudaLibraryEnumerateKernels(enumerated, kernel_count, library));
    int found = 0;
    for (unsigned i = 0; i < kernel_count; i++) found += enumerated[i] == scale;
    EXPECT(found == 1);  // each kernel once, as the handle cudaLibraryGetKernel gives
    CHECK(cudaKernelSetAttributeForDevice(scale, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          1024, 0));
    EXPECT_ERROR(cudaErrorInvalidDevice,
                 cudaKernelSetAttributeForDevice(
                     scale, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024, 1));
    int *offset = nullptr;
    size_t offset_size = 0;
    CHECK(cudaLibraryGetGlobal((void **)&offset, &offset_size, library, "offset"));
    EXPECT(offset != nullptr && offset_size == sizeof(int));
    int new_offset = 7;
    CHECK(cudaMemcpy(offset, &new_offset, sizeof(int), cudaMemcpyHostToDevice));
    int count = n, factor = -3;
    void *args[] = {&a, &count, &factor};
    CHECK(cudaLaunchKernel((const void *)scale, dim3(n / 256), dim3(256), args, 0, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(back.data(), a, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(back[i] == host[i] * factor + new_offset);
    CHECK(cudaLibraryUnload(library));
    free(ptx);
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    printf("hints_and_libraries: hints accepted, library kernel and occupancy correct\n");
    return 0;
}
