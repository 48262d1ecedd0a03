// Warp- and block-level synchronization as cooperative groups, __syncwarp and the PTX
// barrier forms produce them: tile reductions (bar.warp.sync between shuffles), a block
// sum through shared memory, and barrier.cta.{sync,arrive,red} written as inline PTX.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "check.cuh"

namespace cg = cooperative_groups;

__global__ void tile_sums(const int *in, int *tile_out, int *block_out)
{
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<16> tile = cg::tiled_partition<16>(block);
    __shared__ int partial[256];
    int value = in[blockIdx.x * blockDim.x + threadIdx.x];
    // A tile reduction by hand: each step synchronizes the tile (bar.warp.sync).
    int sum = value;
    for (int offset = tile.size() / 2; offset > 0; offset /= 2) {
        tile.sync();
        sum += tile.shfl_down(sum, offset);
    }
    int reduced = cg::reduce(tile, value, cg::plus<int>());
    if (tile.thread_rank() == 0)
        tile_out[(blockIdx.x * blockDim.x + threadIdx.x) / 16] = sum == reduced ? sum : -1;
    partial[threadIdx.x] = value;
    __syncwarp();
    block.sync();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        block.sync();
    }
    if (block.thread_rank() == 0)
        block_out[blockIdx.x] = partial[0];
}

// barrier.cta.sync, barrier.cta.arrive and barrier.cta.red as the PTX ISA spells them.
__global__ void cta_barriers(const int *in, int *out)
{
    __shared__ int staged[128];
    staged[threadIdx.x] = in[threadIdx.x];
    asm volatile("barrier.cta.sync 0;" ::: "memory");
    int neighbour = staged[(threadIdx.x + 1) % blockDim.x];
    asm volatile("barrier.cta.sync.aligned 1, %0;" :: "r"(blockDim.x) : "memory");
    asm volatile("bar.cta.sync 2;" ::: "memory");
    if (threadIdx.x >= 64)
        asm volatile("barrier.cta.arrive 3, 128;" ::: "memory");
    else
        asm volatile("barrier.cta.sync 3, 128;" ::: "memory");
    asm volatile("bar.arrive 4, 128;" ::: "memory");
    unsigned count;
    asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0;\n"
                 " barrier.cta.red.popc.u32 %0, 5, p; }"
                 : "=r"(count) : "r"((unsigned)(in[threadIdx.x] > 0)) : "memory");
    unsigned any, all;
    asm volatile("{ .reg .pred p, q, r; setp.ne.u32 p, %2, 0;\n"
                 " barrier.cta.red.or.pred q, 6, p;\n"
                 " barrier.cta.red.and.aligned.pred r, 7, %3, p;\n"
                 " selp.u32 %0, 1, 0, q; selp.u32 %1, 1, 0, r; }"
                 : "=r"(any), "=r"(all)
                 : "r"((unsigned)(in[threadIdx.x] > 0)), "r"(blockDim.x) : "memory");
    unsigned mask = __activemask();
    asm volatile("bar.warp.sync %0;" :: "r"(mask) : "memory");
    out[threadIdx.x] = neighbour;
    out[blockDim.x + threadIdx.x] = count;
    out[2 * blockDim.x + threadIdx.x] = any * 2 + all;
}

int main()
{
    const int blocks = 4, threads = 256, n = blocks * threads;
    static int values[n];
    for (int i = 0; i < n; ++i)
        values[i] = (i * 7919) % 23 - 11;
    int *din, *dtiles, *dblocks, *dout;
    CHECK(cudaMalloc(&din, sizeof(values)));
    CHECK(cudaMalloc(&dtiles, n / 16 * sizeof(int)));
    CHECK(cudaMalloc(&dblocks, blocks * sizeof(int)));
    CHECK(cudaMalloc(&dout, 3 * 128 * sizeof(int)));
    CHECK(cudaMemcpy(din, values, sizeof(values), cudaMemcpyHostToDevice));
    tile_sums<<<blocks, threads>>>(din, dtiles, dblocks);
    CHECK(cudaGetLastError());
    static int tiles[n / 16], block_sums[blocks];
    CHECK(cudaMemcpy(tiles, dtiles, sizeof(tiles), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(block_sums, dblocks, sizeof(block_sums), cudaMemcpyDeviceToHost));
    for (int t = 0; t < n / 16; ++t) {
        int expected = 0;
        for (int i = 0; i < 16; ++i)
            expected += values[t * 16 + i];
        EXPECT(tiles[t] == expected);
    }
    for (int b = 0; b < blocks; ++b) {
        int expected = 0;
        for (int i = 0; i < threads; ++i)
            expected += values[b * threads + i];
        EXPECT(block_sums[b] == expected);
    }
    cta_barriers<<<1, 128>>>(din, dout);
    CHECK(cudaGetLastError());
    static int out[3 * 128];
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    int positive = 0;
    for (int i = 0; i < 128; ++i)
        positive += values[i] > 0;
    int expected_flags = (positive > 0) * 2 + (positive == 128);
    for (int i = 0; i < 128; ++i) {
        EXPECT(out[i] == values[(i + 1) % 128]);
        EXPECT(out[128 + i] == positive);
        EXPECT(out[256 + i] == expected_flags);
    }
    printf("cooperative_groups: %d tile sums, %d block sums, cta barriers correct\n",
           n / 16, blocks);
    return 0;
}
