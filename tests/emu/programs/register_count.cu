// What kernels report as their register count (cudaFuncGetAttributes().numRegs,
// CU_FUNC_ATTRIBUTE_NUM_REGS): a plausible count that __launch_bounds__, __maxnreg__ and the
// CU_JIT_MAX_REGISTERS option limit, and that the occupancy calculator agrees with.
#include <cuda.h>
#include "check.cuh"

#define CHECK_DRIVER(call)                                                                  \
    do {                                                                                    \
        CUresult check_res_ = (call);                                                       \
        if (check_res_ != CUDA_SUCCESS) {                                                   \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call,            \
                    (int)check_res_);                                                       \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

// Many values live at once: the PTX declares far more registers than a block of 1024
// threads could have.
#define MANY_VALUES(out, in)                                                                \
    float v[96];                                                                            \
    _Pragma("unroll") for (int k = 0; k < 96; ++k) v[k] = in[threadIdx.x + k] * (k + 1);   \
    float s = 0.0f;                                                                         \
    _Pragma("unroll") for (int k = 0; k < 96; ++k) s += v[k] * v[95 - k];                   \
    out[threadIdx.x] = s;

__global__ void unbounded(const float *in, float *out) { MANY_VALUES(out, in) }
__global__ void __launch_bounds__(128) bounded(const float *in, float *out) { MANY_VALUES(out, in) }
__global__ void __maxnreg__(40) limited(const float *in, float *out) { MANY_VALUES(out, in) }

// 40 64-bit registers declared: 80 32-bit slots.
static const char WIDE_PTX[] =
    ".version 7.8\n.target sm_75\n.address_size 64\n"
    ".visible .entry wide(.param .u64 out)\n{\n"
    "    .reg .b64 %rd<40>;\n"
    "    ld.param.u64 %rd1, [out];\n"
    "    mov.u64 %rd2, 7;\n"
    "    st.global.u64 [%rd1], %rd2;\n"
    "    ret;\n}\n";

static int occupancy_registers(int regs)  // per warp, allocated in units of 256
{
    return (regs * 32 + 255) / 256 * 256;
}

int main()
{
    int per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, 0));
    cudaFuncAttributes unbounded_attr, bounded_attr, limited_attr;
    CHECK(cudaFuncGetAttributes(&unbounded_attr, unbounded));
    CHECK(cudaFuncGetAttributes(&bounded_attr, bounded));
    CHECK(cudaFuncGetAttributes(&limited_attr, limited));
    printf("register_count: unbounded %d, launch bounds 128: %d, maxnreg 40: %d\n",
           unbounded_attr.numRegs, bounded_attr.numRegs, limited_attr.numRegs);
    // A block of 1024 threads must fit: at most 64 registers each, and the kernel launches.
    EXPECT(unbounded_attr.numRegs > 0 && unbounded_attr.numRegs <= 64);
    EXPECT(unbounded_attr.maxThreadsPerBlock == 1024);
    EXPECT(bounded_attr.numRegs > 64 && bounded_attr.numRegs <= 255);
    EXPECT(bounded_attr.maxThreadsPerBlock == 128);
    EXPECT(limited_attr.numRegs > 0 && limited_attr.numRegs <= 40);

    float *din, *dout;
    CHECK(cudaMalloc(&din, 2048 * sizeof(float)));
    CHECK(cudaMalloc(&dout, 1024 * sizeof(float)));
    CHECK(cudaMemset(din, 0, 2048 * sizeof(float)));
    unbounded<<<1, 1024>>>(din, dout);
    CHECK(cudaDeviceSynchronize());

    // The occupancy calculator uses the same counts.
    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, unbounded, 1024, 0));
    EXPECT(blocks >= 1 && blocks * 32 * occupancy_registers(unbounded_attr.numRegs) <= per_sm);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bounded, 128, 0));
    EXPECT(blocks >= 1 && blocks * 4 * occupancy_registers(bounded_attr.numRegs) <= per_sm);
    EXPECT((blocks + 1) * 4 * occupancy_registers(bounded_attr.numRegs) > per_sm ||
           blocks == 16);

    // CU_JIT_MAX_REGISTERS at load caps what the driver reports.
    CUmodule plain, capped;
    CUfunction plain_fn, capped_fn;
    CHECK_DRIVER(cuModuleLoadData(&plain, WIDE_PTX));
    CUjit_option options[] = {CU_JIT_MAX_REGISTERS};
    void *values[] = {(void *)(uintptr_t)24};
    CHECK_DRIVER(cuModuleLoadDataEx(&capped, WIDE_PTX, 1, options, values));
    CHECK_DRIVER(cuModuleGetFunction(&plain_fn, plain, "wide"));
    CHECK_DRIVER(cuModuleGetFunction(&capped_fn, capped, "wide"));
    int plain_regs = 0, capped_regs = 0;
    CHECK_DRIVER(cuFuncGetAttribute(&plain_regs, CU_FUNC_ATTRIBUTE_NUM_REGS, plain_fn));
    CHECK_DRIVER(cuFuncGetAttribute(&capped_regs, CU_FUNC_ATTRIBUTE_NUM_REGS, capped_fn));
    printf("register_count: PTX with 80 register slots: %d, with CU_JIT_MAX_REGISTERS 24: %d\n",
           plain_regs, capped_regs);
    EXPECT(plain_regs > 24 && plain_regs <= 64);
    EXPECT(capped_regs > 0 && capped_regs <= 24);
    printf("register_count: counts plausible and limited\n");
    return 0;
}
