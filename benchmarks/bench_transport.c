/* The client side of bench_transport.py: a driver-API program timed from inside.
 * Prints one "name value" line per figure (seconds or counts). Built against cuda.h. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *ptx =
    ".version 9.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry empty()\n{\n ret;\n}\n";

static long rss_kib(void) {
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (status && fgets(line, sizeof line, status))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (status) fclose(status);
    return kib;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s failed: %d\n", #call, r_); exit(1); } } while (0)

int main(int argc, char **argv) {
    int syncs = argc > 1 ? atoi(argv[1]) : 2000;
    int launches = argc > 2 ? atoi(argv[2]) : 20000;
    size_t bytes = (size_t)(argc > 3 ? atoi(argv[3]) : 64) << 20;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUdeviceptr d;
    printf("rss_before_init_kib %ld\n", rss_kib());
    CHECK(cuInit(0));
    printf("rss_after_init_kib %ld\n", rss_kib());
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fn, mod, "empty"));
    CHECK(cuCtxSynchronize());

    double t = now();
    for (int i = 0; i < syncs; i++) CHECK(cuCtxSynchronize());
    printf("idle_sync_s %.9f\n", (now() - t) / syncs);
    size_t free_mem, total_mem;
    t = now();
    for (int i = 0; i < syncs; i++) CHECK(cuMemGetInfo(&free_mem, &total_mem));
    printf("query_round_trip_s %.9f\n", (now() - t) / syncs);

    t = now();
    for (int i = 0; i < launches; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL));
    double queued = now() - t;
    CHECK(cuCtxSynchronize());
    double total = now() - t;
    printf("launch_rate_client_per_s %.1f\n", launches / queued);
    printf("launch_rate_end_to_end_per_s %.1f\n", launches / total);
    /* CLOCK_MONOTONIC is the machine's: bench_sessions.py compares these across clients. */
    printf("launches_started_s %.6f\nlaunches_done_s %.6f\n", t, t + total);

    char *host = malloc(bytes), *back = malloc(bytes);
    memset(host, 7, bytes); memset(back, 0, bytes);
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemcpyHtoD(d, host, bytes));  /* warm: fault in pages on both sides */
    CHECK(cuMemcpyDtoH(back, d, bytes));
    int reps = 5;
    t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyHtoD(d, host, bytes));
    CHECK(cuCtxSynchronize());
    printf("htod_bytes_per_s %.1f\n", reps * (double)bytes / (now() - t));
    t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyDtoH(back, d, bytes));
    printf("dtoh_bytes_per_s %.1f\n", reps * (double)bytes / (now() - t));
    if (memcmp(host, back, bytes) != 0) { fprintf(stderr, "copy mismatch\n"); return 1; }

    void *pinned;
    CHECK(cuMemAllocHost(&pinned, bytes));
    memset(pinned, 3, bytes);
    CHECK(cuMemcpyHtoD(d, pinned, bytes));
    t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyHtoD(d, pinned, bytes));
    printf("htod_pinned_bytes_per_s %.1f\n", reps * (double)bytes / (now() - t));
    t = now();
    for (int i = 0; i < reps; i++) CHECK(cuMemcpyDtoH(pinned, d, bytes));
    printf("dtoh_pinned_bytes_per_s %.1f\n", reps * (double)bytes / (now() - t));

    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFree(d));
    return 0;
}
