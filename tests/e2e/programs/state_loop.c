/* A driver-API program with state worth moving: COUNT allocations totalling TOTAL_KIB KiB,
 * updated by kernels for ITERATIONS iterations (every STRIDE-th word of each), then a checksum
 * of all of them computed on the host.
 *
 * Usage: state_loop KERNELS.ptx COUNT TOTAL_KIB ITERATIONS STRIDE [PAUSE_FILE]
 *
 * Prints, flushed line by line: "pid P"; "pointers A0 A1 ..." and "counter ADDR VALUE" (the
 * module's __device__ iterations_done) at the start and again at the end, both asked of the
 * device again at the end; "iteration K" once iteration K's kernels finished; "paused K" when
 * PAUSE_FILE exists before iteration K (the program then waits, its device idle, until the
 * file is removed); "checksum HEX" last. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char *n_ = "?"; cuGetErrorName(r_, &n_); \
    fprintf(stderr, "state_loop: %s failed: %s (%d)\n", #call, n_, r_); \
    exit(1); } } while (0)

enum { MAX_COUNT = 64, THREADS = 256 };

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(n + 1, 1);
    if (fread(buf, 1, n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    return buf;
}

static void print_state(CUmodule mod, CUdeviceptr *ptrs, unsigned count) {
    printf("pointers");
    for (unsigned j = 0; j < count; j++) {
        CUdeviceptr base; size_t size;
        CHECK(cuMemGetAddressRange(&base, &size, ptrs[j]));  /* the device's view */
        printf(" 0x%llx", (unsigned long long)base);
    }
    printf("\n");
    CUdeviceptr counter; size_t size; unsigned value;
    CHECK(cuModuleGetGlobal(&counter, &size, mod, "iterations_done"));
    CHECK(cuMemcpyDtoH(&value, counter, sizeof value));
    printf("counter 0x%llx %u\n", (unsigned long long)counter, value);
    fflush(stdout);
}

static void wait_while_paused(const char *pause_file, unsigned k) {
    if (pause_file == NULL || access(pause_file, F_OK) != 0) return;
    CHECK(cuCtxSynchronize());
    printf("paused %u\n", k);
    fflush(stdout);
    struct timespec tick = {0, 5 * 1000 * 1000};
    while (access(pause_file, F_OK) == 0) nanosleep(&tick, NULL);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: state_loop KERNELS.ptx COUNT TOTAL_KIB ITERATIONS STRIDE "
                        "[PAUSE_FILE]\n");
        return 2;
    }
    char *ptx = read_file(argv[1]);
    unsigned count = (unsigned)atoi(argv[2]);
    unsigned long long total = strtoull(argv[3], NULL, 10) * 1024;
    unsigned iterations = (unsigned)atoi(argv[4]);
    unsigned stride = (unsigned)atoi(argv[5]);
    const char *pause_file = argc > 6 ? argv[6] : NULL;
    if (ptx == NULL || count == 0 || count > MAX_COUNT || stride == 0 || total < count * 4ull) {
        fprintf(stderr, "state_loop: bad arguments\n");
        return 2;
    }
    unsigned long long words = total / count / 4;
    printf("pid %d\n", (int)getpid());

    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction step, count_iteration;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&step, mod, "step"));
    CHECK(cuModuleGetFunction(&count_iteration, mod, "count_iteration"));

    CUdeviceptr ptrs[MAX_COUNT], table;
    uint32_t *host = malloc(words * 4);
    for (unsigned j = 0; j < count; j++) {
        CHECK(cuMemAlloc(&ptrs[j], words * 4));
        for (unsigned long long i = 0; i < words; i++)
            host[i] = (uint32_t)(i * 2654435761u + j * 97u);
        CHECK(cuMemcpyHtoD(ptrs[j], host, words * 4));
    }
    CHECK(cuMemAlloc(&table, sizeof ptrs));
    CHECK(cuMemcpyHtoD(table, ptrs, sizeof ptrs));
    print_state(mod, ptrs, count);

    unsigned long long threads = (words + stride - 1) / stride;
    unsigned blocks = (unsigned)((threads + THREADS - 1) / THREADS);
    for (unsigned k = 0; k < iterations; k++) {
        wait_while_paused(pause_file, k);
        for (unsigned j = 0; j < count; j++) {
            void *args[] = {&table, &j, &words, &stride, &k};
            CHECK(cuLaunchKernel(step, blocks, 1, 1, THREADS, 1, 1, 0, NULL, args, NULL));
        }
        CHECK(cuLaunchKernel(count_iteration, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuCtxSynchronize());
        printf("iteration %u\n", k);
        fflush(stdout);
    }
    wait_while_paused(pause_file, iterations);

    /* checksum: sum over allocations j and words i of x * (2i + 1) * (j + 1), modulo 2^64 */
    uint64_t checksum = 0;
    for (unsigned j = 0; j < count; j++) {
        CHECK(cuMemcpyDtoH(host, ptrs[j], words * 4));
        uint64_t sum = 0;
        for (unsigned long long i = 0; i < words; i++) sum += (uint64_t)host[i] * (2 * i + 1);
        checksum += sum * (j + 1);
    }
    print_state(mod, ptrs, count);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    for (unsigned j = 0; j < count; j++) CHECK(cuMemFree(ptrs[j]));
    CHECK(cuMemFree(table));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(ctx));
    free(host);
    free(ptx);
    return 0;
}
