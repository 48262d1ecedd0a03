// Atomics on global memory: a histogram (atomicAdd), min/max, exchange, compare-and-swap,
// float addition.
#include "check.cuh"

#define BINS 16

__global__ void atomics(const int *values, int n, int *histogram, int *extremes, float *fsum,
                        int *cas_counter, int *last)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int v = values[i];
    atomicAdd(&histogram[v % BINS], 1);
    atomicMin(&extremes[0], v);
    atomicMax(&extremes[1], v);
    atomicAdd(fsum, 0.5f);
    int seen = *cas_counter, assumed;
    do {
        assumed = seen;
        seen = atomicCAS(cas_counter, assumed, assumed + 2);
    } while (seen != assumed);
    atomicExch(last, 7);
}

int main()
{
    const int n = 600;
    static int values[n];
    int expected[BINS] = {0};
    for (int i = 0; i < n; ++i) {
        values[i] = (i * 13 + 5) % 97;
        expected[values[i] % BINS]++;
    }
    int *dvalues, *dhist, *dext, *dcas, *dlast;
    float *dfsum;
    int init_ext[2] = {1 << 30, -(1 << 30)};
    CHECK(cudaMalloc(&dvalues, sizeof(values)));
    CHECK(cudaMalloc(&dhist, BINS * sizeof(int)));
    CHECK(cudaMalloc(&dext, 2 * sizeof(int)));
    CHECK(cudaMalloc(&dfsum, sizeof(float)));
    CHECK(cudaMalloc(&dcas, sizeof(int)));
    CHECK(cudaMalloc(&dlast, sizeof(int)));
    CHECK(cudaMemcpy(dvalues, values, sizeof(values), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dhist, 0, BINS * sizeof(int)));
    CHECK(cudaMemcpy(dext, init_ext, sizeof(init_ext), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dfsum, 0, sizeof(float)));
    CHECK(cudaMemset(dcas, 0, sizeof(int)));
    CHECK(cudaMemset(dlast, 0, sizeof(int)));
    atomics<<<(n + 127) / 128, 128>>>(dvalues, n, dhist, dext, dfsum, dcas, dlast);
    CHECK(cudaGetLastError());
    int histogram[BINS], ext[2], cas, last;
    float fsum;
    CHECK(cudaMemcpy(histogram, dhist, sizeof(histogram), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ext, dext, sizeof(ext), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&fsum, dfsum, sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&cas, dcas, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&last, dlast, sizeof(int), cudaMemcpyDeviceToHost));
    for (int b = 0; b < BINS; ++b)
        EXPECT(histogram[b] == expected[b]);
    EXPECT(ext[0] == 0 && ext[1] == 96);
    EXPECT(fsum == 0.5f * n);
    EXPECT(cas == 2 * n);
    EXPECT(last == 7);
    CHECK(cudaFree(dvalues));
    CHECK(cudaFree(dhist));
    CHECK(cudaFree(dext));
    CHECK(cudaFree(dfsum));
    CHECK(cudaFree(dcas));
    CHECK(cudaFree(dlast));
    printf("atomics: histogram, min/max, float add, CAS and exchange correct\n");
    return 0;
}
