// A tensor-core GEMM as CUDA samples write one: the program asks the device whether it has
// tensor cores (compute capability 7.0 or later; bf16 needs 8.0) and what
// cudaGetDeviceProperties says, then each block stages 32 x 32 tiles of A and B in shared
// memory with cp.async (double-buffered) and four warps multiply them with nvcuda::wmma,
// loading fragments from shared memory. C = A x B + C is checked against the host.
#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <vector>
#include "check.cuh"

using namespace nvcuda;

const int M = 64, N = 64, K = 96, TILE = 32;

// A is M x K row-major, B is K x N column-major (both bf16), C is M x N row-major float.
__global__ void gemm(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c)
{
    __shared__ __align__(32) __nv_bfloat16 tile_a[2][TILE][TILE];   // [row][k]
    __shared__ __align__(32) __nv_bfloat16 tile_b[2][TILE][TILE];   // [col][k]
    int warp = threadIdx.x / 32;
    int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    int wrow = (warp / 2) * 16, wcol = (warp % 2) * 16;
    // 32 rows of 64 bytes per tile: 128 chunks of 16 bytes, one per thread and tile.
    auto stage = [&](int buffer, int k) {
        int line = threadIdx.x / 4, part = (threadIdx.x % 4) * 8;
        __pipeline_memcpy_async(&tile_a[buffer][line][part], a + (row0 + line) * K + k + part, 16);
        __pipeline_memcpy_async(&tile_b[buffer][line][part], b + (col0 + line) * K + k + part, 16);
        __pipeline_commit();
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    float *out = c + (row0 + wrow) * N + col0 + wcol;
    wmma::load_matrix_sync(acc, out, N, wmma::mem_row_major);
    stage(0, 0);
    for (int k = 0, step = 0; k < K; k += TILE, ++step) {
        int buffer = step % 2;
        if (k + TILE < K) {
            stage(1 - buffer, k + TILE);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        for (int kk = 0; kk < TILE; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
            wmma::load_matrix_sync(fa, &tile_a[buffer][wrow][kk], TILE);
            wmma::load_matrix_sync(fb, &tile_b[buffer][wcol][kk], TILE);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        __syncthreads();   // everyone is done with this buffer before it is refilled
    }
    wmma::store_matrix_sync(out, acc, N, wmma::mem_row_major);
}

int main()
{
    int device = 0, major = 0, minor = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, device));
    EXPECT(prop.major == major && prop.minor == minor);
    if (major < 8) {
        printf("tensor_cores: compute capability %d.%d has no bf16 tensor cores, waived\n",
               major, minor);
        return 2;
    }
    printf("tensor_cores: compute capability %d.%d\n", major, minor);

    std::vector<__nv_bfloat16> a(M * K), b(K * N);
    std::vector<float> fa(M * K), fb(K * N), c(M * N), expected(M * N);
    for (int i = 0; i < M * K; i++) fa[i] = (float)((i * 7) % 9 - 4);
    for (int i = 0; i < K * N; i++) fb[i] = (float)((i * 5) % 7 - 3) * 0.5f;
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) a[r * K + k] = __float2bfloat16(fa[r * K + k]);
    for (int k = 0; k < K; k++)     // B column-major: element (k, n) at n * K + k
        for (int n = 0; n < N; n++) b[n * K + k] = __float2bfloat16(fb[k * N + n]);
    for (int i = 0; i < M * N; i++) c[i] = (float)(i % 13);
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) {
            double sum = c[r * N + n];
            for (int k = 0; k < K; k++) sum += (double)fa[r * K + k] * fb[k * N + n];
            expected[r * N + n] = (float)sum;   // small integers and halves: exact
        }

    __nv_bfloat16 *da, *db;
    float *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(a[0])));
    CHECK(cudaMalloc(&db, b.size() * sizeof(b[0])));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(c[0])));
    CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(a[0]), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * sizeof(b[0]), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, c.data(), c.size() * sizeof(c[0]), cudaMemcpyHostToDevice));
    gemm<<<dim3(N / TILE, M / TILE), 128>>>(da, db, dc);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(c.data(), dc, c.size() * sizeof(c[0]), cudaMemcpyDeviceToHost));
    for (int i = 0; i < M * N; i++) {
        if (c[i] != expected[i]) {
            fprintf(stderr, "C[%d][%d] = %g, expected %g\n", i / N, i % N, c[i], expected[i]);
            return 1;
        }
    }
    printf("tensor_cores: %dx%dx%d bf16 wmma GEMM through cp.async tiles correct\n", M, N, K);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return 0;
}
