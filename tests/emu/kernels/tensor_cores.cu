// Tensor-core kernels as CUDA C++ writes them (compute_80): nvcuda::wmma for every type,
// inline mma.sync fed by ldmatrix from shared memory staged with cp.async, and cp.async
// pipelines. The tests compare every result with a matrix product computed on the host.
#include <mma.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda/pipeline>
#include <cooperative_groups.h>

// A cuda::pipeline_shared_state in __shared__ memory is set up by make_pipeline, not by its
// constructor.
#pragma nv_diag_suppress static_var_with_dynamic_init

using namespace nvcuda;
namespace exp_ = nvcuda::wmma::experimental;

// C (M x N, row-major, ldc) = A (M x K) x B (K x N) + C, one warp per M x N tile of the
// result; A is row-major (lda) or column-major, B likewise: the template picks.
template <int M, int N, int K, typename In, typename Acc, typename LayoutA, typename LayoutB>
__device__ void wmma_gemm(const In *a, const In *b, Acc *c, int rows, int cols, int depth)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tiles_n = cols / N;
    int tile_m = warp / tiles_n, tile_n = warp % tiles_n;
    if (tile_m * M >= rows) return;
    const bool a_row = std::is_same<LayoutA, wmma::row_major>::value;
    const bool b_row = std::is_same<LayoutB, wmma::row_major>::value;
    wmma::fragment<wmma::matrix_a, M, N, K, In, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, M, N, K, In, LayoutB> fb;
    wmma::fragment<wmma::accumulator, M, N, K, Acc> fc;
    Acc *tile_c = c + tile_m * M * cols + tile_n * N;
    wmma::load_matrix_sync(fc, tile_c, cols, wmma::mem_row_major);
    for (int k = 0; k < depth; k += K) {
        const In *tile_a = a_row ? a + tile_m * M * depth + k : a + k * rows + tile_m * M;
        const In *tile_b = b_row ? b + k * cols + tile_n * N : b + tile_n * N * depth + k;
        wmma::load_matrix_sync(fa, tile_a, a_row ? depth : rows);
        wmma::load_matrix_sync(fb, tile_b, b_row ? cols : depth);
        wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(tile_c, fc, cols, wmma::mem_row_major);
}

#define GEMM(name, M, N, K, In, Acc, LA, LB)                                               \
    extern "C" __global__ void name(const In *a, const In *b, Acc *c, int r, int n, int k) \
    { wmma_gemm<M, N, K, In, Acc, wmma::LA, wmma::LB>(a, b, c, r, n, k); }

GEMM(gemm_f16_f32_rc, 16, 16, 16, half, float, row_major, col_major)
GEMM(gemm_f16_f32_cr, 16, 16, 16, half, float, col_major, row_major)
GEMM(gemm_f16_f16_rr, 16, 16, 16, half, half, row_major, row_major)
GEMM(gemm_f16_f32_m8n32, 8, 32, 16, half, float, row_major, col_major)
GEMM(gemm_f16_f16_m32n8, 32, 8, 16, half, half, col_major, col_major)
GEMM(gemm_bf16_f32, 16, 16, 16, __nv_bfloat16, float, row_major, col_major)
GEMM(gemm_bf16_f32_m32n8, 32, 8, 16, __nv_bfloat16, float, row_major, row_major)
GEMM(gemm_s8_s32, 16, 16, 16, signed char, int, row_major, col_major)
GEMM(gemm_u8_s32_m8n32, 8, 32, 16, unsigned char, int, col_major, row_major)
GEMM(gemm_f64, 8, 8, 4, double, double, row_major, col_major)

// tf32: fragments are loaded from f32 and rounded element by element (__float_to_tf32),
// as CUDA's programming guide shows.
extern "C" __global__ void gemm_tf32(const float *a, const float *b, float *c, int rows,
                                     int cols, int depth)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int tile_m = warp / (cols / 16), tile_n = warp % (cols / 16);
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    for (int k = 0; k < depth; k += 8) {
        wmma::load_matrix_sync(fa, a + tile_m * 16 * depth + k, depth);
        wmma::load_matrix_sync(fb, b + tile_n * 16 * depth + k, depth);
        for (int i = 0; i < fa.num_elements; i++) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
        for (int i = 0; i < fb.num_elements; i++) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
        wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(c + tile_m * 16 * cols + tile_n * 16, fc, cols,
                            wmma::mem_row_major);
}

// Element-wise work on fragments: alpha * A x B + beta * C, with alpha applied to A's
// elements (each held twice in an f16 A fragment) and beta to C's; the result is stored
// column-major.
extern "C" __global__ void scaled_f16(const half *a, const half *b, const float *c, float *d,
                                      float alpha, float beta)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc, fd;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    for (int i = 0; i < fa.num_elements; i++) fa.x[i] = __hmul(fa.x[i], __float2half(alpha));
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= beta;
    wmma::fill_fragment(fd, 0.0f);
    wmma::mma_sync(fd, fa, fb, fc);
    wmma::store_matrix_sync(d, fd, 16, wmma::mem_col_major);
}

// Sub-byte types (nvcuda::wmma::experimental): s4 (8x8x32) and b1 (8x8x128, XOR + popc),
// A row-major and B column-major, packed 32 bits to an int.
template <int K, typename Precision>
__device__ void sub_byte_product(const void *a, const void *b, int *c)
{
    wmma::fragment<wmma::matrix_a, 8, 8, K, Precision, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 8, 8, K, Precision, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 8, 8, K, int> fc;
    wmma::fill_fragment(fc, 0);
    wmma::load_matrix_sync(fa, a, K);
    wmma::load_matrix_sync(fb, b, K);
    if constexpr (K == 128)
        wmma::bmma_sync(fc, fa, fb, fc, exp_::bmmaBitOpXOR, exp_::bmmaAccumulateOpPOPC);
    else
        wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 8, wmma::mem_row_major);
}

extern "C" __global__ void gemm_s4(const int *a, const int *b, int *c)
{
    sub_byte_product<32, exp_::precision::s4>(a, b, c);
}

extern "C" __global__ void gemm_b1(const unsigned *a, const unsigned *b, int *c)
{
    sub_byte_product<128, exp_::precision::b1>(a, b, c);
}

// The Ampere GEMM pattern: tiles staged in shared memory with cp.async (double-buffered,
// __pipeline_* commit/wait), fragments loaded with ldmatrix (B with .trans), products with
// mma.sync.m16n8k16. One warp per block computes a 16 x 8 tile of C = A x B (A row-major
// M x K, B row-major K x N), K a multiple of 16.
__device__ unsigned shared_address(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

extern "C" __global__ void mma_ldmatrix_gemm(const half *a, const half *b, float *c, int n,
                                             int depth)
{
    __shared__ __align__(16) half tile_a[2][16][16];
    __shared__ __align__(16) half tile_b[2][16][8];
    int lane = threadIdx.x, row0 = blockIdx.y * 16, col0 = blockIdx.x * 8;
    auto stage = [&](int buffer, int k) {
        // A: 16 rows of 32 bytes = 32 chunks of 16 bytes; B: 16 rows of 16 bytes.
        __pipeline_memcpy_async(&tile_a[buffer][lane / 2][(lane % 2) * 8],
                                a + (row0 + lane / 2) * depth + k + (lane % 2) * 8, 16);
        if (lane < 16)
            __pipeline_memcpy_async(&tile_b[buffer][lane][0], b + (k + lane) * n + col0, 16);
        __pipeline_commit();
    };
    float acc[4] = {0, 0, 0, 0};
    stage(0, 0);
    for (int k = 0, step = 0; k < depth; k += 16, ++step) {
        int buffer = step % 2;
        if (k + 16 < depth) {
            stage(1 - buffer, k + 16);
            __pipeline_wait_prior(1);    // this step's tile is in, the next one may not be
        } else {
            __pipeline_wait_prior(0);
        }
        __syncwarp();
        unsigned fa[4], fb[2];
        // ldmatrix.x4: threads 0-15 name rows 0-15 of columns 0-7, threads 16-31 of 8-15.
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(fa[0]), "=r"(fa[1]), "=r"(fa[2]), "=r"(fa[3])
                     : "r"(shared_address(&tile_a[buffer][lane % 16][(lane / 16) * 8])));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(fb[0]), "=r"(fb[1])
                     : "r"(shared_address(&tile_b[buffer][lane % 16][0])));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]));
        __syncwarp();
    }
    int group = lane / 4, pair = (lane % 4) * 2;
    c[(row0 + group) * n + col0 + pair] = acc[0];
    c[(row0 + group) * n + col0 + pair + 1] = acc[1];
    c[(row0 + group + 8) * n + col0 + pair] = acc[2];
    c[(row0 + group + 8) * n + col0 + pair + 1] = acc[3];
}

// cuda::pipeline with cuda::memcpy_async: a block-wide producer/consumer pipeline of
// `STAGES` stages summing a long array tile by tile.
extern "C" __global__ void pipeline_sums(const int *in, int *out, int tiles)
{
    constexpr int STAGES = 3, TILE = 64;
    __shared__ int buffers[STAGES][TILE];
    auto block = cooperative_groups::this_thread_block();
    __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, STAGES> state;
    auto pipe = cuda::make_pipeline(block, &state);
    int total = 0;
    int fetched = 0;
    for (int t = 0; t < tiles; ++t) {
        for (; fetched < tiles && fetched < t + STAGES; ++fetched) {
            pipe.producer_acquire();
            cuda::memcpy_async(block, buffers[fetched % STAGES], in + fetched * TILE,
                               sizeof(int) * TILE, pipe);
            pipe.producer_commit();
        }
        pipe.consumer_wait();
        total += buffers[t % STAGES][(threadIdx.x * 7 + t) % TILE];
        pipe.consumer_release();
    }
    out[threadIdx.x] = total;
}

// cp.async with a source size below the copy size zero-fills (what __pipeline_memcpy_async's
// zfill argument compiles to), one thread per 16-byte chunk.
extern "C" __global__ void zero_filled_copies(const int *in, int *out, int valid_bytes)
{
    __shared__ __align__(16) int staged[4 * 32];
    __pipeline_memcpy_async(&staged[4 * threadIdx.x], in + 4 * threadIdx.x, 16,
                            16 - min(16, valid_bytes));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int i = 0; i < 4; i++) out[4 * threadIdx.x + i] = staged[4 * threadIdx.x + i];
}
