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
    __shared__ float tile[12 * 1024];  // 48 KiB, the most a block's static shared memory takes
    tile[threadIdx.x] = v[threadIdx.x];
    __syncthreads();
    v[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

__global__ void __launch_bounds__(128) bounded(float *v)
{
    v[threadIdx.x] *= 2.0f;
}

// Blocks of `threads` threads and `shared` bytes of shared memory that one multiprocessor
// holds when registers do not limit them: its threads, its blocks and its shared memory do,
// each block also taking the system's reserved shared memory (1 KiB from compute capability
// 8.0 on), in 128-byte units.
static int blocks_held(const cudaDeviceProp &prop, int threads, size_t shared)
{
    size_t per_block = (shared + prop.reservedSharedMemPerBlock + 127) / 128 * 128;
    int by_shared = (int)(prop.sharedMemPerMultiprocessor / per_block);
    int by_threads = prop.maxThreadsPerMultiProcessor / threads;
    int most = by_shared < by_threads ? by_shared : by_threads;
    return most < prop.maxBlocksPerMultiProcessor ? most : prop.maxBlocksPerMultiProcessor;
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
    cudaFuncAttributes heavy;
    CHECK(cudaFuncGetAttributes(&heavy, heavy_shared));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, heavy_shared, 64, 0));
    EXPECT(blocks >= 1 && blocks == blocks_held(prop, 64, heavy.sharedSizeBytes));
    printf("occupancy: 48 KiB of static shared memory: %d blocks\n", blocks);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, light, 256, 40 * 1024));
    EXPECT(blocks >= 1 && blocks == blocks_held(prop, 256, 40 * 1024));
    printf("occupancy: 40 KiB of dynamic shared memory: %d blocks\n", blocks);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, light, 256, 0,
                                                                 cudaOccupancyDefault));
    EXPECT(blocks >= 1);
    // __launch_bounds__ bounds launches, not this query: CUDA's calculator takes any block
    // the device allows, so 256 threads of `bounded` get the blocks the multiprocessor's
    // threads hold, its few registers limiting nothing.
    cudaFuncAttributes few;
    CHECK(cudaFuncGetAttributes(&few, bounded));
    EXPECT(few.numRegs * prop.maxThreadsPerMultiProcessor <= prop.regsPerMultiprocessor);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bounded, 256, 0));
    EXPECT(blocks == blocks_held(prop, 256, few.sharedSizeBytes));
    printf("occupancy: 256 threads of a kernel bounded to 128: %d blocks\n", blocks);

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
