// Bad calls get CUDA's error codes: invalid pointers, invalid launch configurations, too
// many threads, unknown kernels and symbols; cudaGetLastError / cudaPeekAtLastError semantics.
#include "check.cuh"
#include <cstring>

__global__ void touch(int *v)
{
    v[threadIdx.x] = threadIdx.x;
}

__device__ int not_a_kernel;

int main()
{
    int *device, host[4];
    CHECK(cudaMalloc(&device, 64 * sizeof(int)));

    // Invalid pointers.
    int *bogus = (int *)0x1000;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemcpy(host, bogus, sizeof(host),
                                                   cudaMemcpyDeviceToHost));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemcpy(bogus, host, sizeof(host),
                                                   cudaMemcpyHostToDevice));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemcpy(device + 62, host, sizeof(host),
                                                   cudaMemcpyHostToDevice));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaFree(bogus));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaFree(device + 1));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemset(bogus, 0, 4));
    EXPECT_ERROR(cudaErrorInvalidMemcpyDirection,
                 cudaMemcpy(host, device, sizeof(host), (cudaMemcpyKind)7));
    // The last error is the last failure; reading it resets it, peeking does not.
    EXPECT_ERROR(cudaErrorInvalidMemcpyDirection, cudaPeekAtLastError());
    EXPECT_ERROR(cudaErrorInvalidMemcpyDirection, cudaGetLastError());
    CHECK(cudaGetLastError());

    // Launch configurations: <<<>>> drops the launch's result, cudaGetLastError has it. Too
    // many threads per block is an invalid value from CUDA 13's runtime on (CUDA 12's said
    // invalid configuration), the rest invalid configurations.
    int runtime = 0;
    CHECK(cudaRuntimeGetVersion(&runtime));
    const cudaError_t too_many_threads =
        runtime >= 13000 ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration;
    touch<<<1, 2048>>>(device);
    EXPECT_ERROR(too_many_threads, cudaGetLastError());
    touch<<<0, 32>>>(device);
    EXPECT_ERROR(cudaErrorInvalidConfiguration, cudaGetLastError());
    touch<<<1, dim3(1, 1, 65)>>>(device);
    EXPECT_ERROR(cudaErrorInvalidConfiguration, cudaGetLastError());
    touch<<<dim3(1, 65536), 1>>>(device);
    EXPECT_ERROR(cudaErrorInvalidConfiguration, cudaGetLastError());
    touch<<<1, 32, 200 * 1024>>>(device);
    EXPECT_ERROR(cudaErrorInvalidConfiguration, cudaGetLastError());
    void *args[] = {&device};
    EXPECT_ERROR(too_many_threads,
                 cudaLaunchKernel((const void *)touch, dim3(1), dim3(4096), args, 0, 0));
    EXPECT_ERROR(cudaErrorInvalidDeviceFunction,
                 cudaLaunchKernel((const void *)main, dim3(1), dim3(1), args, 0, 0));
    EXPECT_ERROR(cudaErrorInvalidDeviceFunction, cudaGetLastError());

    // Good launches after all that: by host stub, by cudaKernel_t, with a launch config.
    CHECK(cudaLaunchKernel((const void *)touch, dim3(1), dim3(4), args, 0, 0));
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(host[3] == 3);
    cudaKernel_t kernel;
    CHECK(cudaGetKernel(&kernel, touch));
    CHECK(cudaMemset(device, 0, sizeof(host)));
    CHECK(cudaLaunchKernel((const void *)kernel, dim3(1), dim3(4), args, 0, 0));
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(host[2] == 2);
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1);
    config.blockDim = dim3(4);
    CHECK(cudaMemset(device, 0, sizeof(host)));
    CHECK(cudaLaunchKernelEx(&config, touch, device));
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(host[1] == 1);
    cudaLaunchAttribute cooperative;
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    config.attrs = &cooperative;
    config.numAttrs = 1;
    CHECK(cudaMemset(device, 0, sizeof(host)));
    CHECK(cudaLaunchKernelEx(&config, touch, device));  // one cooperative block fits
    CHECK(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(host[3] == 3);
    config.gridDim = dim3(1 << 20);  // more blocks than the device keeps resident
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge, cudaLaunchKernelEx(&config, touch, device));
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge, cudaGetLastError());

    // Devices, handles, symbols, names.
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaSetDevice(7));
    int value;
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 3));
    EXPECT_ERROR(cudaErrorInvalidResourceHandle, cudaStreamDestroy((cudaStream_t)0x1234));
    EXPECT_ERROR(cudaErrorInvalidSymbol, cudaMemcpyToSymbol(host, host, 4));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemcpyToSymbol(not_a_kernel, host, 8));
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge,
                 cudaLaunchCooperativeKernel((const void *)touch, dim3(100000), dim3(1), args, 0,
                                             0));
    EXPECT(strcmp(cudaGetErrorName(cudaErrorInvalidConfiguration),
                  "cudaErrorInvalidConfiguration") == 0);
    EXPECT(strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress") == 0);
    EXPECT(strlen(cudaGetErrorString(cudaErrorMemoryAllocation)) > 10);
    EXPECT(strcmp(cudaGetErrorName((cudaError_t)12345), "unrecognized error code") == 0);
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge, cudaGetLastError());  // the last above
    CHECK(cudaGetLastError());
    CHECK(cudaFree(device));
    printf("error_checks: every bad call got CUDA's code\n");
    return 0;
}
