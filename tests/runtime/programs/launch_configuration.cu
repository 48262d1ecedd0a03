// The configuration <<<grid, block, shared, stream>>> gives a launch (nvcc's generated code
// pushes it before the launch's arguments are evaluated and pops it inside the host stub):
// each launch runs with its own configuration when another launch happens while its arguments
// are evaluated, when host threads launch at once, and after a launch refused for a bad
// configuration.
#include "check.cuh"
#include <thread>
#include <vector>

// Each thread writes its grid's and block's shape: which configuration ran is visible.
__global__ void record(int *out, int value)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = value * 10000 + gridDim.x * 100 + blockDim.x;
}

static const int SLOTS = 256;

// The slots a launch of `record` with `grid` x `block` threads and `value` writes, the rest -1.
static bool recorded(const int *host, int grid, int block, int value)
{
    for (int i = 0; i < SLOTS; i++)
        if (host[i] != (i < grid * block ? value * 10000 + grid * 100 + block : -1))
            return false;
    return true;
}

static int *inner_out;

// A launch made while the outer launch's arguments are evaluated.
static int launch_inner(int value)
{
    record<<<2, 8>>>(inner_out, value);
    return value + 1;
}

static void fetch(int *host, const int *device, cudaStream_t stream)
{
    CHECK(cudaMemcpyAsync(host, device, SLOTS * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
}

int main()
{
    int host[SLOTS];
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int *outer_out;
    CHECK(cudaMalloc(&outer_out, SLOTS * sizeof(int)));
    CHECK(cudaMalloc(&inner_out, SLOTS * sizeof(int)));
    CHECK(cudaMemset(outer_out, 0xff, SLOTS * sizeof(int)));
    CHECK(cudaMemset(inner_out, 0xff, SLOTS * sizeof(int)));

    record<<<3, 32, 64, stream>>>(outer_out, launch_inner(4));
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    fetch(host, outer_out, nullptr);
    EXPECT(recorded(host, 3, 32, 5));
    fetch(host, inner_out, nullptr);
    EXPECT(recorded(host, 2, 8, 4));

    // Four host threads, each launching with a configuration and a stream of its own.
    const int threads = 4;
    std::vector<int *> outs(threads);
    std::vector<std::thread> workers;
    std::vector<int> passed(threads, 0);
    for (int t = 0; t < threads; t++) {
        CHECK(cudaMalloc(&outs[t], SLOTS * sizeof(int)));
        CHECK(cudaMemset(outs[t], 0xff, SLOTS * sizeof(int)));
    }
    for (int t = 0; t < threads; t++)
        workers.emplace_back([&, t] {
            cudaStream_t own;
            int mine[SLOTS];
            CHECK(cudaStreamCreate(&own));
            for (int i = 0; i < 20; i++)
                record<<<t + 1, 16 * (t + 1), 0, own>>>(outs[t], i);
            CHECK(cudaGetLastError());
            fetch(mine, outs[t], own);
            passed[t] = recorded(mine, t + 1, 16 * (t + 1), 19);
            CHECK(cudaStreamDestroy(own));
        });
    for (auto &worker : workers)
        worker.join();
    for (int t = 0; t < threads; t++)
        EXPECT(passed[t]);

    // A refused launch leaves nothing behind for the next one. A block of more threads than
    // the kernel takes is an invalid value (CUDA 13; earlier runtimes said invalid
    // configuration).
    record<<<1, 4096>>>(outer_out, 9);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGetLastError());
    CHECK(cudaMemset(outer_out, 0xff, SLOTS * sizeof(int)));
    record<<<1, 64, 0, stream>>>(outer_out, 8);
    CHECK(cudaGetLastError());
    fetch(host, outer_out, stream);
    EXPECT(recorded(host, 1, 64, 8));

    for (int t = 0; t < threads; t++)
        CHECK(cudaFree(outs[t]));
    CHECK(cudaFree(outer_out));
    CHECK(cudaFree(inner_out));
    CHECK(cudaStreamDestroy(stream));
    printf("launch_configuration: nested, concurrent and refused launches configured right\n");
    return 0;
}
