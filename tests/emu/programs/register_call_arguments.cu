// PTX calls may pass registers and constants as arguments and take results in registers, not
// only .param variables (as hand-written PTX does); NVIDIA's assembler accepts them.
#include "check.cuh"

extern "C" __device__ __noinline__ int twice_plus(int x, int y) { return 2 * x + y; }

__global__ void through_registers(const int *in, int *out)
{
    int v = in[threadIdx.x], r;
    asm volatile("call.uni (%0), twice_plus, (%1, 5);" : "=r"(r) : "r"(v));
    out[threadIdx.x] = r + twice_plus(v, in[0]);  // a C++ call too, through .param variables
}

int main()
{
    const int n = 64;
    int values[n], out[n];
    for (int i = 0; i < n; ++i)
        values[i] = i * 3 - 40;
    int *din, *dout;
    CHECK(cudaMalloc(&din, sizeof(values)));
    CHECK(cudaMalloc(&dout, sizeof(out)));
    CHECK(cudaMemcpy(din, values, sizeof(values), cudaMemcpyHostToDevice));
    through_registers<<<1, n>>>(din, dout);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(out[i] == (2 * values[i] + 5) + (2 * values[i] + values[0]));
    printf("register_call_arguments: %d calls with register arguments correct\n", n);
    return 0;
}
