// Occupancy queries: active blocks per multiprocessor against the device's limits, the
// potential block size (cuda_runtime.h's template over these calls), function attributes.
#include "check.cuh"
#include <cstring>

__global__ void light(float *v)
{
    v[blockIdx.x * blockDim.x + threadIdx.x] += 1.0f;
}

__global__ void heavy_shared(float *v)
{
    __shared__ float tile[12 * 1024];  // 48 KiB: at most 3 such blocks fit in 164 KiB
    tile[threadIdx.x] = v[threadIdx.x];
    __syncthreads();
    v[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

__global__ void __launch_bounds__(128) bounded(float *v)
{
    v[threadIdx.x] *= 2.0f;
}

int main()
{
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int blocks = 0;
    for (int block_size = 32; block_size <= 1024; block_size *= 2) {
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, light, block_size, 0));
        EXPECT(blocks >= 1);
        EXPECT(blocks <= prop.maxBlocksPerMultiProcessor);
        EXPECT(blocks * block_size <= prop.maxThreadsPerMultiProcessor);
        printf("occupancy: light, %d threads: %d blocks\n", block_size, blocks);
    }
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, heavy_shared, 64, 0));
    EXPECT(blocks >= 1 && blocks <= 3);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, light, 256, 40 * 1024));
    EXPECT(blocks >= 1 && blocks <= 4);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, light, 256, 0,
                                                                 cudaOccupancyDefault));
    EXPECT(blocks >= 1);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bounded, 256, 0));
    EXPECT(blocks == 0);  // more threads than __launch_bounds__ allows

    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, light, 0, 0));
    EXPECT(block >= 32 && block <= 1024 && block % 32 == 0);
    EXPECT(min_grid >= prop.multiProcessorCount);
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, bounded, 0, 0));
    EXPECT(block >= 32 && block <= 128);
    printf("occupancy: potential block size %d, minimum grid %d\n", block, min_grid);

    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, heavy_shared));
    EXPECT(attributes.sharedSizeBytes == 48 * 1024);
    EXPECT(attributes.maxThreadsPerBlock == 1024);
    CHECK(cudaFuncGetAttributes(&attributes, bounded));
    EXPECT(attributes.maxThreadsPerBlock == 128);
    CHECK(cudaFuncSetAttribute(light, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    CHECK(cudaFuncGetAttributes(&attributes, light));
    EXPECT(attributes.maxDynamicSharedSizeBytes == 64 * 1024);
    CHECK(cudaFuncSetCacheConfig(light, cudaFuncCachePreferShared));
    const char *name = NULL;
    CHECK(cudaFuncGetName(&name, light));
    EXPECT(name != NULL && strcmp(name, "_Z5lightPf") == 0);
    size_t available = 0;
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&available, light, 2, 128));
    EXPECT(available > 0 && available <= (size_t)prop.sharedMemPerMultiprocessor / 2);
    printf("occupancy: queries consistent with the device's limits\n");
    return 0;
}
