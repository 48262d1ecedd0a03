// Kernels that wait on the clock, as tests and samples do to make work take a known time:
// spinning until clock64() has advanced by N cycles takes N / clock rate seconds, and the
// %globaltimer difference across the wait matches the wall time.
#include <chrono>
#include "check.cuh"

__device__ unsigned long long global_timer()
{
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

__global__ void spin(long long cycles, long long *elapsed_cycles,
                     unsigned long long *elapsed_ns)
{
    unsigned long long timer_start = global_timer();
    long long start = clock64(), now = start;
    while (now - start < cycles)
        now = clock64();
    *elapsed_cycles = now - start;
    *elapsed_ns = global_timer() - timer_start;
}

int main()
{
    int rate_khz = 0;
    CHECK(cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0));
    EXPECT(rate_khz > 0);
    const double wait_s = 0.3;
    const long long cycles = (long long)(wait_s * rate_khz * 1000.0);
    long long *dcycles;
    unsigned long long *dns;
    CHECK(cudaMalloc(&dcycles, sizeof(long long)));
    CHECK(cudaMalloc(&dns, sizeof(unsigned long long)));
    spin<<<1, 1>>>(1000, dcycles, dns);  // loads the module before the timed launch
    CHECK(cudaDeviceSynchronize());

    auto begin = std::chrono::steady_clock::now();
    spin<<<1, 1>>>(cycles, dcycles, dns);
    CHECK(cudaDeviceSynchronize());
    double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin)
                        .count();
    long long elapsed_cycles = 0;
    unsigned long long elapsed_ns = 0;
    CHECK(cudaMemcpy(&elapsed_cycles, dcycles, sizeof(long long), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&elapsed_ns, dns, sizeof(elapsed_ns), cudaMemcpyDeviceToHost));
    double timer_s = elapsed_ns * 1e-9;
    printf("clock_wait: %lld cycles at %d kHz: kernel %.3f s by %%globaltimer, %.3f s wall\n",
           elapsed_cycles, rate_khz, timer_s, wall_s);
    EXPECT(elapsed_cycles >= cycles);
    // The wait takes cycles / rate (the last clock read may overshoot a little) ...
    EXPECT(timer_s >= wait_s && timer_s < wait_s + 0.25);
    // ... and %globaltimer measures the same wall time the host sees, launch overhead aside.
    EXPECT(wall_s >= timer_s && wall_s < timer_s + 2.0);
    printf("clock_wait: waited as long as the clock rate says\n");
    return 0;
}
