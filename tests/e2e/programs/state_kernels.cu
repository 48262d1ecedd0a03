// Kernels of the state-moving programs (state_loop.c, state_loop.py), compiled to PTX by the
// tests. Integer arithmetic wraps modulo 2^32, so every result is bit-exact and a test can
// compute it on the host.

// Starts at 1000, one more per iteration: a moved session must keep module globals.
__device__ unsigned int iterations_done = 1000;

// table[j] is allocation j: the kernel reads its pointer from device memory, so a moved
// session must also keep the addresses that device memory holds.
extern "C" __global__ void step(unsigned int *const *table, unsigned int j,
                                unsigned long long words, unsigned int stride,
                                unsigned int iteration) {
    unsigned long long i =
        ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * stride;
    if (i < words) {
        unsigned int *x = table[j];
        x[i] = x[i] * (2u * j + 3u) + (16u * iteration + j + 1u);
    }
}

extern "C" __global__ void count_iteration() { iterations_done += 1; }
