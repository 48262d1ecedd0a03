// A runtime-API program with state worth moving: two buffers, each updated on its own stream
// by <<<>>> kernels whose coefficients are __constant__ data, events timing each iteration,
// stream-ordered copies (cudaMemcpyAsync) from and to its host buffers: pageable ones, or
// with --pinned pinned ones (cudaMallocHost), which keep a session from moving for now.
// It computes what state_loop.c computes with COUNT 2 and STRIDE 1, so the tests check both
// against one host model.
//
// Usage: rt_state_loop TOTAL_KIB ITERATIONS [--pause-file PATH] [--pinned]
// Prints what state_loop.c prints, and pauses as it does.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "rt_state_loop: %s failed: %s\n", #call, cudaGetErrorName(e_)); \
    exit(1); } } while (0)

__constant__ unsigned int coefficients[2][2];  // per buffer: multiplier, addend
__device__ unsigned int iterations_done = 1000;

__global__ void step(unsigned int *x, unsigned int j, unsigned long long words,
                     unsigned int iteration) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < words) x[i] = x[i] * coefficients[j][0] + (16u * iteration + coefficients[j][1]);
}

__global__ void count_iteration() { iterations_done += 1; }

static void print_state(unsigned int **buffers) {
    unsigned int *counter, value;
    CHECK(cudaGetSymbolAddress((void **)&counter, iterations_done));
    CHECK(cudaMemcpyFromSymbol(&value, iterations_done, sizeof value));
    printf("pointers %p %p\ncounter %p %u\n", (void *)buffers[0], (void *)buffers[1],
           (void *)counter, value);
    fflush(stdout);
}

// Whether the pause file asks for a pause before iteration k (state_loop.c says how).
static bool pause_requested(const char *pause_file, unsigned k) {
    if (pause_file == NULL) return false;
    FILE *f = fopen(pause_file, "r");
    if (f == NULL) return false;
    unsigned at = 0;
    if (fscanf(f, "%u", &at) != 1) at = 0;
    fclose(f);
    return at <= k;
}

static void wait_while_paused(const char *pause_file, unsigned k) {
    if (!pause_requested(pause_file, k)) return;
    CHECK(cudaDeviceSynchronize());
    printf("paused %u\n", k);
    fflush(stdout);
    struct timespec tick = {0, 5 * 1000 * 1000};
    while (pause_requested(pause_file, k)) nanosleep(&tick, NULL);
}

int main(int argc, char **argv) {
    const char *pause_file = NULL;
    bool pinned = false, usage = argc < 3;
    for (int a = 3; a < argc && !usage; a++) {
        if (strcmp(argv[a], "--pinned") == 0) pinned = true;
        else if (strcmp(argv[a], "--pause-file") == 0 && a + 1 < argc) pause_file = argv[++a];
        else usage = true;
    }
    if (usage) {
        fprintf(stderr, "usage: rt_state_loop TOTAL_KIB ITERATIONS [--pause-file PATH] "
                        "[--pinned]\n");
        return 2;
    }
    unsigned long long words = strtoull(argv[1], NULL, 10) * 1024 / 2 / 4;
    unsigned iterations = (unsigned)atoi(argv[2]);
    printf("pid %d\n", (int)getpid());

    const unsigned int host_coefficients[2][2] = {{3, 1}, {5, 2}};
    CHECK(cudaMemcpyToSymbol(coefficients, host_coefficients, sizeof host_coefficients));
    cudaStream_t streams[2];
    cudaEvent_t start, done[2];
    unsigned int *buffers[2], *host[2];
    CHECK(cudaEventCreate(&start));
    for (unsigned j = 0; j < 2; j++) {
        CHECK(cudaStreamCreateWithFlags(&streams[j], cudaStreamNonBlocking));
        CHECK(cudaEventCreate(&done[j]));
        CHECK(cudaMalloc(&buffers[j], words * 4));
        if (pinned) CHECK(cudaMallocHost(&host[j], words * 4));
        else host[j] = (unsigned int *)malloc(words * 4);
        for (unsigned long long i = 0; i < words; i++)
            host[j][i] = (uint32_t)(i * 2654435761u + j * 97u);
        CHECK(cudaMemcpyAsync(buffers[j], host[j], words * 4, cudaMemcpyHostToDevice,
                              streams[j]));
    }
    CHECK(cudaDeviceSynchronize());
    print_state(buffers);

    unsigned blocks = (unsigned)((words + 255) / 256);
    for (unsigned k = 0; k < iterations; k++) {
        wait_while_paused(pause_file, k);
        CHECK(cudaEventRecord(start, streams[0]));
        for (unsigned j = 0; j < 2; j++) {
            step<<<blocks, 256, 0, streams[j]>>>(buffers[j], j, words, k);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(done[j], streams[j]));
        }
        count_iteration<<<1, 1, 0, streams[0]>>>();
        for (unsigned j = 0; j < 2; j++) {
            float ms = -1.0f;
            CHECK(cudaEventSynchronize(done[j]));
            if (j == 0) {
                CHECK(cudaEventElapsedTime(&ms, start, done[0]));
                if (ms < 0.0f) { fprintf(stderr, "rt_state_loop: negative time\n"); return 1; }
            }
        }
        CHECK(cudaStreamSynchronize(streams[0]));
        printf("iteration %u\n", k);
        fflush(stdout);
    }
    wait_while_paused(pause_file, iterations);

    uint64_t checksum = 0;
    for (unsigned j = 0; j < 2; j++) {
        CHECK(cudaMemcpyAsync(host[j], buffers[j], words * 4, cudaMemcpyDeviceToHost,
                              streams[j]));
        CHECK(cudaStreamSynchronize(streams[j]));
        uint64_t sum = 0;
        for (unsigned long long i = 0; i < words; i++) sum += (uint64_t)host[j][i] * (2 * i + 1);
        checksum += sum * (j + 1);
    }
    print_state(buffers);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    for (unsigned j = 0; j < 2; j++) {
        CHECK(cudaFree(buffers[j]));
        if (pinned) CHECK(cudaFreeHost(host[j]));
        else free(host[j]);
        CHECK(cudaStreamDestroy(streams[j]));
        CHECK(cudaEventDestroy(done[j]));
    }
    CHECK(cudaEventDestroy(start));
    return 0;
}
