/* Loads each module file named on the command line as a library (cuLibraryLoadData, as
 * NVIDIA's runtime loads a program's images) and asks for its kernel `k` both ways, printing
 * "<file> <load> <kernel count> <cuLibraryGetKernel> <cuModuleGetFunction> <cuLibraryGetGlobal>
 * <cuLibraryUnload>" (CUresults; -1 where the load failed). A library holding no code the
 * device runs loads, as on CUDA, and its kernel is refused when asked for. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_files.h"

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "library_refusals: no device\n");
        return 1;
    }
    for (int i = 1; i < argc; ++i) {
        char *image = read_file(argv[i]);
        if (image == NULL) {
            fprintf(stderr, "library_refusals: cannot read %s\n", argv[i]);
            return 1;
        }
        CUlibrary library;
        CUresult load = cuLibraryLoadData(&library, image, NULL, NULL, 0, NULL, NULL, 0);
        int count = -1, kernel = -1, function = -1, global = -1, unload = -1;
        if (load == CUDA_SUCCESS) {
            unsigned int n = 0;
            CUkernel k;
            CUmodule module;
            CUfunction f;
            CUdeviceptr address;
            size_t size;
            count = cuLibraryGetKernelCount(&n, library) == CUDA_SUCCESS ? (int)n : -2;
            kernel = cuLibraryGetKernel(&k, library, "k");
            function = cuLibraryGetModule(&module, library) == CUDA_SUCCESS
                ? (int)cuModuleGetFunction(&f, module, "k") : -2;
            global = cuLibraryGetGlobal(&address, &size, library, "k_calls");
            unload = cuLibraryUnload(library);
        }
        printf("%s %d %d %d %d %d %d\n", argv[i], (int)load, count, kernel, function, global,
               unload);
        free(image);
    }
    return 0;
}
