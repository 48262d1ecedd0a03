// Relocatable device code (-rdc=true): the kernel calls a device function and updates a
// device variable that rdc_combine.cu defines; that file launches a kernel of its own.
#include "check.cuh"

extern __device__ float combine(float a, float b);
extern __device__ int combined;
void scale_on_device(float *v, int n, float factor);

__global__ void apply(const float *a, const float *b, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = combine(a[i], b[i]);
        atomicAdd(&combined, 1);
    }
}

int main()
{
    const int n = 100;
    float a[n], b[n], out[n], *da, *db, *dout;
    for (int i = 0; i < n; ++i) {
        a[i] = (float)i;
        b[i] = 1.0f;
    }
    CHECK(cudaMalloc(&da, sizeof(a)));
    CHECK(cudaMalloc(&db, sizeof(b)));
    CHECK(cudaMalloc(&dout, sizeof(out)));
    CHECK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
    apply<<<(n + 63) / 64, 64>>>(da, db, dout, n);
    CHECK(cudaGetLastError());
    scale_on_device(dout, n, 0.5f);
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(out[i] == (2.0f * i + 1.0f) * 0.5f);
    int calls = 0;
    CHECK(cudaMemcpyFromSymbol(&calls, combined, sizeof(int)));
    EXPECT(calls == n);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dout));
    printf("rdc: cross-file device function called %d times\n", calls);
    return 0;
}
