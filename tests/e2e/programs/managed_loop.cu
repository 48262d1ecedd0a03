// A runtime-API program whose state lives in managed memory, for the tests of moving
// sessions: each iteration the host changes one word of a cudaMallocManaged buffer, a kernel
// updates every word and counts into a __managed__ variable, and the host reads a word back
// after synchronizing. test_managed_memory.py models the same steps on the host.
//
// Usage: managed_loop WORDS ITERATIONS [--pause-file PATH]
// Prints "pid N", "pointers BUFFER COUNTER" at the start and the end, "iteration K" after
// each iteration, "paused K" when it pauses (state_loop.c says how), then
// "checksum HEX".
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "managed_loop: %s failed: %s\n", #call, cudaGetErrorName(e_)); \
    exit(1); } } while (0)

__managed__ unsigned int counter = 1000;

__global__ void step(unsigned int *x, unsigned int words, unsigned int k)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < words) x[i] = x[i] * 3u + k;
    if (i == 0) counter += 1;
}

static bool pause_requested(const char *pause_file, unsigned k)
{
    if (pause_file == NULL) return false;
    FILE *f = fopen(pause_file, "r");
    if (f == NULL) return false;
    unsigned at = 0;
    if (fscanf(f, "%u", &at) != 1) at = 0;
    fclose(f);
    return at <= k;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: managed_loop WORDS ITERATIONS [--pause-file PATH]\n");
        return 2;
    }
    unsigned words = (unsigned)atoi(argv[1]), iterations = (unsigned)atoi(argv[2]);
    const char *pause_file = argc > 4 && strcmp(argv[3], "--pause-file") == 0 ? argv[4] : NULL;
    printf("pid %d\n", (int)getpid());
    unsigned int *x = NULL;
    CHECK(cudaMallocManaged(&x, words * sizeof(unsigned int)));
    for (unsigned i = 0; i < words; i++) x[i] = i * 2654435761u + 7u;
    printf("pointers %p %p\n", (void *)x, (void *)&counter);
    fflush(stdout);
    uint64_t seen = 0;
    for (unsigned k = 0; k < iterations; k++) {
        if (pause_requested(pause_file, k)) {
            printf("paused %u\n", k);
            fflush(stdout);
            struct timespec tick = {0, 5 * 1000 * 1000};
            while (pause_requested(pause_file, k)) nanosleep(&tick, NULL);
        }
        x[k % words] += k;
        step<<<(words + 255) / 256, 256>>>(x, words, k);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        seen += x[(k * 7) % words];
        printf("iteration %u\n", k);
        fflush(stdout);
    }
    uint64_t checksum = seen + counter;
    for (unsigned i = 0; i < words; i++) checksum += (uint64_t)(i + 1) * x[i];
    printf("pointers %p %p\n", (void *)x, (void *)&counter);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    CHECK(cudaFree(x));
    return 0;
}
