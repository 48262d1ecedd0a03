// Tensor-core kernels for the driver-API program driver_tensor_cores.c (compiled for
// compute_80): an nvcuda::wmma f16 GEMM and one inline mma.sync on s8 fragments that each
// thread builds with the layout the PTX ISA gives for m16n8k32.
#include <mma.h>
#include <cuda_fp16.h>

using namespace nvcuda;

// C (n x n, row-major floats) = A x B, A and B row-major halves; one warp per 16 x 16 tile.
extern "C" __global__ void wmma_gemm(const half *a, const half *b, float *c, int n)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tile_m = warp / (n / 16), tile_n = warp % (n / 16);
    if (tile_m >= n / 16) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < n; k += 16) {
        wmma::load_matrix_sync(fa, a + tile_m * 16 * n + k, n);
        wmma::load_matrix_sync(fb, b + k * n + tile_n * 16, n);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + tile_m * 16 * n + tile_n * 16, acc, n, wmma::mem_row_major);
}

__device__ unsigned pack4(const signed char *p)
{
    return (unsigned char)p[0] | (unsigned char)p[1] << 8 | (unsigned char)p[2] << 16 |
           (unsigned)(unsigned char)p[3] << 24;
}

// C (16 x 8, row-major) = A (16 x 32, row-major) x B (32 x 8, stored column-major) + C.
extern "C" __global__ void mma_s8(const signed char *a, const signed char *b, int *c)
{
    int lane = threadIdx.x, group = lane / 4, thread = lane % 4;
    unsigned fa[4], fb[2];
    for (int r = 0; r < 4; r++)   // a0..a15: rows group (+8 for odd registers), k + 16 for r >= 2
        fa[r] = pack4(a + (group + 8 * (r % 2)) * 32 + 4 * thread + 16 * (r / 2));
    for (int r = 0; r < 2; r++)   // b0..b7: column group, k = 4 * thread + 16 * r + j
        fb[r] = pack4(b + group * 32 + 4 * thread + 16 * r);
    int *row0 = c + group * 8 + 2 * thread, *row8 = c + (group + 8) * 8 + 2 * thread;
    int d[4] = {row0[0], row0[1], row8[0], row8[1]};
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
    row0[0] = d[0]; row0[1] = d[1]; row8[0] = d[2]; row8[1] = d[3];
}
