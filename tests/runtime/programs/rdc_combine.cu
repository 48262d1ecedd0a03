// The other half of the -rdc=true program (see rdc_main.cu).
#include "check.cuh"

__device__ int combined = 0;

__device__ float combine(float a, float b)
{
    return 2.0f * a + b;
}

__global__ void scale(float *v, int n, float factor)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] *= factor;
}

void scale_on_device(float *v, int n, float factor)
{
    scale<<<(n + 63) / 64, 64>>>(v, n, factor);
    CHECK(cudaGetLastError());
}
