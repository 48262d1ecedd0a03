/* Loads each module file named on the command line with cuModuleLoad and prints
 * "<file> <CUresult>" per file; what vgpu says about a refusal goes to stderr. */
#include <cuda.h>
#include <stdio.h>

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "module_refusals: no device\n");
        return 1;
    }
    for (int i = 1; i < argc; ++i) {
        CUmodule mod;
        CUresult result = cuModuleLoad(&mod, argv[i]);
        printf("%s %d\n", argv[i], (int)result);
        if (result == CUDA_SUCCESS)
            cuModuleUnload(mod);
    }
    return 0;
}
