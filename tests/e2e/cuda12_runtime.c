/* NVIDIA's CUDA 12 runtime (libcudart.so.12, opened by the path given) on the libcuda.so.1 the
 * loader finds: what a program built with a CUDA 12 toolkit asks of the driver through it
 * (its private tables, then device queries, memory, a memset, copies, a stream and an event,
 * a library loaded from PTX and a launch of its kernel). Checks each result on the host; prints one
 * line and exits 0 when all are right. No CUDA 12 headers: the functions are looked up by
 * name and called with the runtime's ABI. */
#include <dlfcn.h>
#include <stdio.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*get_int_t)(int *);
typedef int (*malloc_t)(void **, size_t);
typedef int (*memcpy_async_t)(void *, const void *, size_t, int, void *);
typedef int (*memset_t)(void *, int, size_t);
typedef int (*one_ptr_t)(void *);
typedef int (*out_ptr_t)(void **);
typedef int (*record_t)(void *, void *);
typedef int (*library_load_t)(void **, const void *, void *, void *, unsigned, void *, void *,
                              unsigned);
typedef int (*get_kernel_t)(void **, void *, const char *);
typedef int (*launch_t)(const void *, dim3, dim3, void **, size_t, void *);
typedef const char *(*error_name_t)(int);

#define CUDA_MEMCPY_HOST_TO_DEVICE 1
#define CUDA_MEMCPY_DEVICE_TO_HOST 2
#define N 64

/* adds its thread index to each int */
static const char *PTX =
    ".version 8.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry add_index(.param .u64 p)\n{\n .reg .b32 %r<4>;\n .reg .b64 %rd<5>;\n"
    " ld.param.u64 %rd1, [p];\n cvta.to.global.u64 %rd2, %rd1;\n mov.u32 %r1, %tid.x;\n"
    " mul.wide.u32 %rd3, %r1, 4;\n add.s64 %rd4, %rd2, %rd3;\n ld.global.u32 %r2, [%rd4];\n"
    " add.s32 %r3, %r2, %r1;\n st.global.u32 [%rd4], %r3;\n ret;\n}\n";

static void *runtime;
static error_name_t error_name;

#define CALL(type, name, ...) check(((type)symbol(#name))(__VA_ARGS__), #name)
#define EXPECT(cond) do { if (!(cond)) { \
    fprintf(stderr, "cuda12_runtime: expected %s\n", #cond); return 1; } } while (0)

static void *symbol(const char *name) {
    void *f = dlsym(runtime, name);
    if (f == NULL) fprintf(stderr, "cuda12_runtime: no %s in the runtime\n", name);
    return f;
}

static int failed;

static void check(int result, const char *call) {
    if (result != 0) {
        fprintf(stderr, "cuda12_runtime: %s failed: %s\n", call, error_name(result));
        failed = 1;
    }
}

int main(int argc, char **argv) {
    runtime = argc == 2 ? dlopen(argv[1], RTLD_NOW) : NULL;
    if (runtime == NULL) {
        fprintf(stderr, "cuda12_runtime: usage: cuda12_runtime PATH/libcudart.so.12 (%s)\n",
                dlerror());
        return 2;
    }
    error_name = (error_name_t)symbol("cudaGetErrorName");
    int version = 0, devices = 0, host[N], back[N];
    CALL(get_int_t, cudaRuntimeGetVersion, &version);
    CALL(get_int_t, cudaGetDeviceCount, &devices);
    EXPECT(version / 1000 == 12 && devices >= 1);
    for (int i = 0; i < N; ++i) host[i] = 3 * i;
    int *device = NULL;
    void *stream = NULL, *done = NULL, *library = NULL, *kernel = NULL;
    CALL(malloc_t, cudaMalloc, (void **)&device, sizeof host);
    CALL(memset_t, cudaMemset, device, 0, sizeof host);
    CALL(out_ptr_t, cudaStreamCreate, &stream);
    CALL(out_ptr_t, cudaEventCreate, &done);
    CALL(memcpy_async_t, cudaMemcpyAsync, device, host, sizeof host / 2,  /* the first half */
         CUDA_MEMCPY_HOST_TO_DEVICE, stream);
    CALL(library_load_t, cudaLibraryLoadData, &library, PTX, NULL, NULL, 0, NULL, NULL, 0);
    CALL(get_kernel_t, cudaLibraryGetKernel, &kernel, library, "add_index");
    void *args[] = {&device};
    dim3 grid = {1, 1, 1}, block = {N, 1, 1};
    CALL(launch_t, cudaLaunchKernel, kernel, grid, block, args, 0, stream);
    CALL(memcpy_async_t, cudaMemcpyAsync, back, device, sizeof back,
         CUDA_MEMCPY_DEVICE_TO_HOST, stream);
    CALL(record_t, cudaEventRecord, done, stream);
    CALL(one_ptr_t, cudaEventSynchronize, done);
    if (failed) return 1;
    for (int i = 0; i < N; ++i) EXPECT(back[i] == (i < N / 2 ? host[i] : 0) + i);
    CALL(one_ptr_t, cudaLibraryUnload, library);
    CALL(one_ptr_t, cudaEventDestroy, done);
    CALL(one_ptr_t, cudaStreamDestroy, stream);
    CALL(one_ptr_t, cudaFree, device);
    if (failed) return 1;
    printf("cuda12_runtime: runtime %d: a memset, copies and %d sums of a library kernel on a "
           "stream correct\n", version, N);
    return 0;
}
