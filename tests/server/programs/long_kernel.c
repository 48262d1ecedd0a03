/* An unmodified driver-API program whose kernel runs for hours (256 threads counting to
 * ITERATIONS, default two billion): what a user stops with Ctrl-C, or a server stops under.
 * Prints "launched" once the kernel is queued, then waits for it in cuCtxSynchronize and
 * prints what that returned. Usage: long_kernel [ITERATIONS] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static const char PTX[] =
    ".version 9.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u32 spin_param_0)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<4>;\n"
    "    ld.param.u32 %r1, [spin_param_0];\n"
    "    mov.u32 %r2, 0;\n"
    "$L_loop:\n"
    "    add.s32 %r2, %r2, 1;\n"
    "    setp.lt.u32 %p1, %r2, %r1;\n"
    "    @%p1 bra $L_loop;\n"
    "    ret;\n"
    "}\n";

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s failed: %d\n", #call, r_); return 1; } } while (0)

int main(int argc, char **argv) {
    unsigned iterations = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 2000000000u;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction spin;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    void *params[] = {&iterations};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    printf("launched\n");
    fflush(stdout);
    CUresult r = cuCtxSynchronize();
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("cuCtxSynchronize returned %d (%s)\n", r, name);
    return r == CUDA_SUCCESS ? 0 : 2;
}
