// Tiled matrix multiply: shared-memory tiles, __syncthreads, 2D grids and blocks, edges that
// are not multiples of the tile.
#include "check.cuh"

#define TILE 16

__global__ void matmul(const float *a, const float *b, float *c, int m, int k, int n)
{
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;
    for (int t = 0; t < (k + TILE - 1) / TILE; ++t) {
        int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? a[row * k + ka] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? b[kb * n + col] : 0.0f;
        __syncthreads();
        for (int i = 0; i < TILE; ++i)
            sum += ta[threadIdx.y][i] * tb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n)
        c[row * n + col] = sum;
}

int main()
{
    const int m = 40, k = 24, n = 36;
    static float a[m * k], b[k * n], c[m * n];
    for (int i = 0; i < m * k; ++i)
        a[i] = (float)(i % 7 - 3);
    for (int i = 0; i < k * n; ++i)
        b[i] = (float)(i % 5 - 2);
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, sizeof(a)));
    CHECK(cudaMalloc(&db, sizeof(b)));
    CHECK(cudaMalloc(&dc, sizeof(c)));
    CHECK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
    dim3 block(TILE, TILE);
    dim3 grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
    matmul<<<grid, block>>>(da, db, dc, m, k, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost));
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            float expected = 0.0f;
            for (int x = 0; x < k; ++x)
                expected += a[i * k + x] * b[x * n + j];
            EXPECT(c[i * n + j] == expected);
        }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    printf("matmul_tiled: %dx%d product correct\n", m, n);
    return 0;
}
