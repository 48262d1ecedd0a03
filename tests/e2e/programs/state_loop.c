/* A driver-API program with state worth moving: COUNT allocations totalling TOTAL_KIB KiB,
 * updated by kernels for ITERATIONS iterations (every STRIDE-th word of each), then a checksum
 * of all of them computed on the host.
 *
 * Usage: state_loop KERNELS.ptx COUNT TOTAL_KIB ITERATIONS STRIDE [--only J]
 *                   [--pause-file PATH]
 * --only J: the iterations update allocation J alone.
 *
 * Prints, flushed line by line: "pid P"; "pointers A0 A1 ..." and "counter ADDR VALUE" (the
 * module's __device__ iterations_done) at the start and again at the end, both asked of the
 * device each time; "iteration K" once iteration K's kernels finished; "checksum HEX" last.
 * Pausing, so that a test can act at a chosen point: before iteration K (and once more after
 * the last, as K = ITERATIONS), while PATH exists and holds a number <= K (an empty file
 * counts as 0), the program waits with its device idle, having printed "paused K". */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "test_files.h"

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    const char *n_ = "?"; cuGetErrorName(r_, &n_); \
    fprintf(stderr, "state_loop: %s failed: %s (%d)\n", #call, n_, r_); \
    exit(1); } } while (0)

enum { MAX_COUNT = 64, THREADS = 256 };

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

/* Whether the pause file asks for a pause before iteration k. */
static int pause_requested(const char *pause_file, unsigned k) {
    if (pause_file == NULL) return 0;
    FILE *f = fopen(pause_file, "r");
    if (f == NULL) return 0;
    unsigned at = 0;
    if (fscanf(f, "%u", &at) != 1) at = 0;
    fclose(f);
    return at <= k;
}

static void wait_while_paused(const char *pause_file, unsigned k) {
    if (!pause_requested(pause_file, k)) return;
    CHECK(cuCtxSynchronize());
    printf("paused %u\n", k);
    fflush(stdout);
    struct timespec tick = {0, 5 * 1000 * 1000};
    while (pause_requested(pause_file, k)) nanosleep(&tick, NULL);
}

int main(int argc, char **argv) {
    const char *pause_file = NULL;
    int only = -1;
    if (argc >= 8 && argc % 2 == 0) {
        for (int a = 6; a < argc; a += 2) {
            if (strcmp(argv[a], "--pause-file") == 0) pause_file = argv[a + 1];
            else if (strcmp(argv[a], "--only") == 0) only = atoi(argv[a + 1]);
            else argc = 0;
        }
    }
    if (argc < 6 || argc % 2 != 0) {
        fprintf(stderr, "usage: state_loop KERNELS.ptx COUNT TOTAL_KIB ITERATIONS STRIDE "
                        "[--only J] [--pause-file PATH]\n");
        return 2;
    }
    char *ptx = read_file(argv[1]);
    unsigned count = (unsigned)atoi(argv[2]);
    unsigned long long total = strtoull(argv[3], NULL, 10) * 1024;
    unsigned iterations = (unsigned)atoi(argv[4]);
    unsigned stride = (unsigned)atoi(argv[5]);
    if (ptx == NULL || count == 0 || count > MAX_COUNT || stride == 0 || total < count * 4ull
        || only >= (int)count) {
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
            if (only >= 0 && j != (unsigned)only) continue;
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
