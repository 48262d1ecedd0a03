// __constant__ and __device__ variables: cudaMemcpyToSymbol (with an offset),
// cudaMemcpyFromSymbol, cudaGetSymbolAddress / Size, an initialized device array.
#include "check.cuh"

__constant__ float coefficients[4];
__constant__ int scale;
__device__ int evaluations;
__device__ float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};

__global__ void polynomial(const float *x, float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float value = 0.0f, power = 1.0f;
    for (int k = 0; k < 4; ++k) {
        value += coefficients[k] * power;
        power *= x[i];
    }
    y[i] = value * scale + table[i % 4];
    atomicAdd(&evaluations, 1);
}

int main()
{
    const int n = 64;
    float h_coefficients[4] = {1.0f, 2.0f, 0.0f, 0.0f};
    int h_scale = 3, zero = 0;
    CHECK(cudaMemcpyToSymbol(coefficients, h_coefficients, sizeof(h_coefficients)));
    float cubic = 1.0f;
    CHECK(cudaMemcpyToSymbol(coefficients, &cubic, sizeof(float), 3 * sizeof(float)));
    CHECK(cudaMemcpyToSymbol(scale, &h_scale, sizeof(int), 0, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(evaluations, &zero, sizeof(int)));
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemcpyToSymbol(coefficients, h_coefficients, sizeof(h_coefficients), 4));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGetLastError());  // the failure was recorded

    float x[n], y[n], *dx, *dy;
    for (int i = 0; i < n; ++i)
        x[i] = (float)(i % 5);
    CHECK(cudaMalloc(&dx, sizeof(x)));
    CHECK(cudaMalloc(&dy, sizeof(y)));
    CHECK(cudaMemcpy(dx, x, sizeof(x), cudaMemcpyHostToDevice));
    polynomial<<<2, 32>>>(dx, dy, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(y, dy, sizeof(y), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        float xi = x[i];
        EXPECT(y[i] == (1.0f + 2.0f * xi + xi * xi * xi) * 3.0f + (float)(i % 4 + 1));
    }

    int count = -1;
    CHECK(cudaMemcpyFromSymbol(&count, evaluations, sizeof(int)));
    EXPECT(count == n);
    float h_table[4];
    void *table_address;
    size_t table_size;
    CHECK(cudaGetSymbolAddress(&table_address, table));
    CHECK(cudaGetSymbolSize(&table_size, table));
    EXPECT(table_size == sizeof(h_table));
    CHECK(cudaMemcpy(h_table, table_address, sizeof(h_table), cudaMemcpyDeviceToHost));
    EXPECT(h_table[0] == 1.0f && h_table[3] == 4.0f);
    float back[4];
    CHECK(cudaMemcpyFromSymbol(back, coefficients, sizeof(back), 0, cudaMemcpyDeviceToHost));
    EXPECT(back[1] == 2.0f && back[3] == 1.0f);

    // The async forms, on a stream, device to device included.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    float four = 4.0f;
    CHECK(cudaMemcpyToSymbolAsync(coefficients, &four, sizeof(float), 0, cudaMemcpyHostToDevice,
                                  stream));
    CHECK(cudaMemcpyToSymbolAsync(coefficients, dx, sizeof(float), sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemcpyFromSymbolAsync(back, coefficients, sizeof(back), 0,
                                    cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    EXPECT(back[0] == 4.0f && back[1] == x[0] && back[3] == 1.0f);
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    printf("constant_memory: %d evaluations with constant coefficients correct\n", count);
    return 0;
}
