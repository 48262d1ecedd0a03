// cudaFuncGetAttributes as CUB reads it: ptxVersion is the virtual architecture the PTX was
// written for (what __CUDA_ARCH__ says while compiling it), binaryVersion the architecture of
// the code that runs (PTX is compiled for the device: its compute capability).
#include "check.cuh"

__global__ void report_arch(int *arch)
{
#ifdef __CUDA_ARCH__
    *arch = __CUDA_ARCH__ / 10;
#endif
}

int main()
{
    int *darch, arch = 0;
    CHECK(cudaMalloc(&darch, sizeof(int)));
    report_arch<<<1, 1>>>(darch);
    CHECK(cudaMemcpy(&arch, darch, sizeof(int), cudaMemcpyDeviceToHost));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, report_arch));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(arch >= 75);
    EXPECT(attributes.ptxVersion == arch);
    EXPECT(attributes.binaryVersion == prop.major * 10 + prop.minor);
    printf("function_attributes: ptxVersion %d, binaryVersion %d\n", attributes.ptxVersion,
           attributes.binaryVersion);
    return 0;
}
