/* Loads each module file named on the command line with cuModuleLoad and prints
 * "<file> <CUresult>" per file; what vgpu says about a refusal goes to stderr. With --data
 * first, loads each from a copy in the heap instead (cuModuleLoadData: no file behind it).
 * With --loading-mode alone, prints "loading mode <CUmoduleLoadingMode>".
 *
 * With --libraries first, loads each as a library instead (cuLibraryLoadData, as NVIDIA's
 * runtime loads a program's images) and asks for its kernel `k` both ways, printing
 * "<file> <load> <kernel count> <cuLibraryGetKernel> <cuModuleGetFunction>
 * <cuLibraryGetGlobal> <cuLibraryUnload>" (CUresults; -1 where the load failed). Each image
 * is handed over where the file is mapped, as a library (cuRAND's) hands over images it
 * carries, so a refusal can name the file. */
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void load_module(const char *path) {
    CUmodule mod;
    CUresult result = cuModuleLoad(&mod, path);
    printf("%s %d\n", path, (int)result);
    if (result == CUDA_SUCCESS)
        cuModuleUnload(mod);
}

/* The file's bytes in the heap, NUL-terminated (as PTX text must be). */
static int load_module_data(const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL || fseek(file, 0, SEEK_END) != 0) {
        fprintf(stderr, "module_refusals: cannot read %s\n", path);
        return 1;
    }
    long size = ftell(file);
    char *image = calloc(1, size + 1);
    rewind(file);
    size_t got = fread(image, 1, size, file);
    fclose(file);
    if (got != (size_t)size) {
        fprintf(stderr, "module_refusals: cannot read %s\n", path);
        return 1;
    }
    CUmodule mod;
    CUresult result = cuModuleLoadData(&mod, image);
    printf("%s %d\n", path, (int)result);
    if (result == CUDA_SUCCESS)
        cuModuleUnload(mod);
    free(image);
    return 0;
}

/* The file mapped whole; PTX text ends in the zeros that fill its last page (a file of a
 * whole number of pages is refused, having none). NULL if it cannot be mapped. */
static void *map_file(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size % sysconf(_SC_PAGESIZE) == 0)
        return NULL;
    void *image = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    *size = st.st_size;
    return image == MAP_FAILED ? NULL : image;
}

static int load_library(const char *path) {
    size_t size;
    void *image = map_file(path, &size);
    if (image == NULL) {
        fprintf(stderr, "module_refusals: cannot map %s\n", path);
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
        size_t bytes;
        count = cuLibraryGetKernelCount(&n, library) == CUDA_SUCCESS ? (int)n : -2;
        kernel = cuLibraryGetKernel(&k, library, "k");
        function = cuLibraryGetModule(&module, library) == CUDA_SUCCESS
            ? (int)cuModuleGetFunction(&f, module, "k") : -2;
        global = cuLibraryGetGlobal(&address, &bytes, library, "k_calls");
        unload = cuLibraryUnload(library);
    }
    printf("%s %d %d %d %d %d %d\n", path, (int)load, count, kernel, function, global, unload);
    munmap(image, size);
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "module_refusals: no device\n");
        return 1;
    }
    if (argc == 2 && strcmp(argv[1], "--loading-mode") == 0) {
        CUmoduleLoadingMode mode;
        if (cuModuleGetLoadingMode(&mode) != CUDA_SUCCESS)
            return 1;
        printf("loading mode %d\n", (int)mode);
        return 0;
    }
    int libraries = argc > 1 && strcmp(argv[1], "--libraries") == 0;
    int data = argc > 1 && strcmp(argv[1], "--data") == 0;
    for (int i = 1 + libraries + data; i < argc; ++i) {
        int failed = 0;
        if (libraries)
            failed = load_library(argv[i]);
        else if (data)
            failed = load_module_data(argv[i]);
        else
            load_module(argv[i]);
        if (failed)
            return 1;
    }
    return 0;
}
