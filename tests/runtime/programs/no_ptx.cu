// Built with cubin only (no PTX): memory calls work, the launch fails with
// cudaErrorNoKernelImageForDevice and vgpu names the kernel on stderr.
#include "check.cuh"

__global__ void cubin_only(int *v)
{
    v[threadIdx.x] = 1;
}

int main()
{
    int *device, host[4] = {1, 2, 3, 4};
    CHECK(cudaMalloc(&device, sizeof(host)));
    CHECK(cudaMemcpy(device, host, sizeof(host), cudaMemcpyHostToDevice));
    cubin_only<<<1, 4>>>(device);
    EXPECT_ERROR(cudaErrorNoKernelImageForDevice, cudaGetLastError());
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(host[3] == 4);
    CHECK(cudaFree(device));
    printf("no_ptx: launch refused, memory calls fine\n");
    return 0;
}
