// cuda::barrier (PTX mbarrier objects in shared memory) with cuda::memcpy_async, as sm_80
// code stages tiles: several phases of one barrier, arrive tokens waited on later, a barrier
// that counts fewer threads than the block, and a thread dropping out of a barrier.
#include <cooperative_groups.h>
#include <cuda/barrier>
#include "check.cuh"

// A cuda::barrier in __shared__ memory is initialized by init(), not by its constructor.
#pragma nv_diag_suppress static_var_with_dynamic_init

namespace cg = cooperative_groups;
using block_barrier = cuda::barrier<cuda::thread_scope_block>;

const int TILE = 128, TILES = 6;

__global__ void staged_sums(const int *in, int *out)
{
    __shared__ int tile[TILE];
    __shared__ block_barrier copied, half_block;
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) {
        init(&copied, block.size());
        init(&half_block, block.size() / 2);
    }
    block.sync();
    int total = 0;
    for (int t = 0; t < TILES; ++t) {  // one phase of `copied` per tile
        cuda::memcpy_async(block, tile, in + t * TILE, sizeof(tile), copied);
        block_barrier::arrival_token token = copied.arrive();
        copied.wait(std::move(token));
        total += tile[(threadIdx.x + t) % TILE];
        copied.arrive_and_wait();  // everyone has read the tile before it is overwritten
    }
    out[threadIdx.x] = total;
    // Only the first half of the block counts for half_block.
    if (threadIdx.x < TILE / 2)
        half_block.arrive_and_wait();
    // The upper half drops out of `copied`; the lower half completes a phase without it.
    if (threadIdx.x >= TILE / 2) {
        copied.arrive_and_drop();
    } else {
        copied.arrive_and_wait();
        copied.arrive_and_wait();  // a phase of the lower half alone
        out[TILE + threadIdx.x] = 1;
    }
}

// The same in PTX, as hand-written pipelines use it: waits on a phase's parity. nvcc unrolls
// the loop, so the inline PTX's label is defined three times, in three { } blocks.
__global__ void parity_phases(int *out)
{
    __shared__ unsigned long long barrier;
    __shared__ int stage[2];
    unsigned address = (unsigned)__cvta_generic_to_shared(&barrier);
    if (threadIdx.x == 0)
        asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(address), "r"(blockDim.x));
    __syncthreads();
    for (unsigned phase = 0; phase < 3; ++phase) {
        if (threadIdx.x == 0)
            stage[phase % 2] = 10 * (phase + 1);
        asm volatile("mbarrier.arrive.shared.b64 _, [%0];" :: "r"(address) : "memory");
        asm volatile("{ .reg .pred done;\n"
                     "WAIT: mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
                     " @!done bra WAIT; }" :: "r"(address), "r"(phase % 2) : "memory");
        out[phase * blockDim.x + threadIdx.x] = stage[phase % 2];
    }
}

// Arrivals that count more than one: cuda::barrier::arrive(n) makes n - 1 of them one
// mbarrier.arrive.noComplete, which lowers the pending count but never completes a phase.
__global__ void weighted_arrivals(int *out)
{
    __shared__ block_barrier barrier;
    __shared__ unsigned long long raw;
    __shared__ int stage;
    unsigned address = (unsigned)__cvta_generic_to_shared(&raw);
    if (threadIdx.x == 0) {
        init(&barrier, blockDim.x + 1);       // thread 0 arrives twice over
        asm volatile("mbarrier.init.shared.b64 [%0], 3;" :: "r"(address));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // PTX: 2 arrivals that may not complete, then a third that completes the phase.
        unsigned long long state;
        int done_early, done;
        asm volatile("{ .reg .pred p;\n"
                     "mbarrier.arrive.noComplete.shared.b64 %0, [%2], 2;\n"
                     "mbarrier.test_wait.shared.b64 p, [%2], %0;\n"
                     "selp.s32 %1, 1, 0, p; }"
                     : "=l"(state), "=r"(done_early) : "r"(address) : "memory");
        asm volatile("{ .reg .pred p;\n"
                     "mbarrier.arrive.shared.b64 _, [%1];\n"
                     "mbarrier.test_wait.shared.b64 p, [%1], %2;\n"
                     "selp.s32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(address), "l"(state) : "memory");
        out[blockDim.x] = 10 * done_early + done;
        stage = 7;
    }
    block_barrier::arrival_token token =
        threadIdx.x == 0 ? barrier.arrive(2) : barrier.arrive();
    barrier.wait(std::move(token));
    out[threadIdx.x] = stage;
}

int main()
{
    static int values[TILE * TILES], out[2 * TILE];
    for (int i = 0; i < TILE * TILES; ++i)
        values[i] = (i * 37) % 101 - 50;
    int *din, *dout;
    CHECK(cudaMalloc(&din, sizeof(values)));
    CHECK(cudaMalloc(&dout, sizeof(out)));
    CHECK(cudaMemcpy(din, values, sizeof(values), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0, sizeof(out)));
    staged_sums<<<2, TILE>>>(din, dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    for (int i = 0; i < TILE; ++i) {
        int expected = 0;
        for (int t = 0; t < TILES; ++t)
            expected += values[t * TILE + (i + t) % TILE];
        EXPECT(out[i] == expected);
        EXPECT(out[TILE + i] == (i < TILE / 2));
    }
    static int phases[3 * 64];
    parity_phases<<<1, 64>>>(dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(phases, dout, sizeof(phases), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 3 * 64; ++i)
        EXPECT(phases[i] == 10 * (i / 64 + 1));
    printf("async_barriers: %d tiles staged through cuda::barrier, phases correct\n", TILES);
    weighted_arrivals<<<1, 64>>>(dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(phases, dout, 65 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i)
        EXPECT(phases[i] == 7);
    EXPECT(phases[64] == 1);   // not complete after the noComplete arrivals, then complete
    printf("async_barriers: arrivals counting several complete a phase once, not before\n");
    return 0;
}
