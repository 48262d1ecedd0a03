/* An unmodified driver-API program that copies megabytes between pageable host memory and
 * device memory, with kernels in between, at offsets inside allocations, and into an
 * allocation freed and made again (often at the same address). Exits 0 and prints "all
 * large copies correct" only if every byte is right. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char PTX[] =
    ".version 9.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 data, .param .u32 n)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [data];\n"
    "    ld.param.u32 %r1, [n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra $L_done;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r5, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    ld.global.u32 %r6, [%rd4];\n"
    "    add.s32 %r7, %r6, 1;\n"
    "    st.global.u32 [%rd4], %r7;\n"
    "$L_done:\n"
    "    ret;\n"
    "}\n";

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, r_); \
    return 1; } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); return 1; } } while (0)

enum { MIB = 1 << 20, N = 4 * MIB }; /* 4 Mi uint32: 16 MiB */

static CUresult add_one(CUfunction fn, CUdeviceptr data, unsigned n) {
    void *params[] = {&data, &n};
    return cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUdeviceptr d, again;
    uint32_t *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
    EXPECT(host && back);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "add_one"));

    /* The whole allocation there and back, a kernel in between: the copy back waits for it. */
    for (unsigned i = 0; i < N; i++) host[i] = i * 3u;
    CHECK(cuMemAlloc(&d, N * sizeof *host));
    CHECK(cuMemcpyHtoD(d, host, N * sizeof *host));
    CHECK(add_one(fn, d, N));
    CHECK(cuMemcpyDtoH(back, d, N * sizeof *back));
    for (unsigned i = 0; i < N; i++) EXPECT(back[i] == i * 3u + 1);

    /* Parts of it, at offsets: 3 MiB written 5 MiB in, 2 MiB read back from 1 MiB + 4 in. */
    memset(host, 0xab, 3 * MIB);
    CHECK(cuMemcpyHtoD(d + 5 * MIB, host, 3 * MIB));
    CHECK(cuMemcpyDtoH(back, d + MIB + 4, 2 * MIB));
    for (unsigned i = 0; i < 2 * MIB / 4; i++) EXPECT(back[i] == (MIB / 4 + 1 + i) * 3u + 1);
    CHECK(cuMemcpyDtoH(back, d, N * sizeof *back));
    for (unsigned i = 0; i < N; i++) {
        int in_part = i >= 5 * MIB / 4 && i < 8 * MIB / 4;
        EXPECT(back[i] == (in_part ? 0xababababu : i * 3u + 1));
    }

    /* Freed and allocated again: the new allocation's bytes, not the old one's. */
    CHECK(cuMemFree(d));
    CHECK(cuMemAlloc(&again, N * sizeof *host));
    for (unsigned i = 0; i < N; i++) host[i] = ~i;
    CHECK(cuMemcpyHtoD(again, host, N * sizeof *host));
    CHECK(add_one(fn, again, N));
    CHECK(cuMemcpyDtoH(back, again, N * sizeof *back));
    for (unsigned i = 0; i < N; i++) EXPECT(back[i] == ~i + 1u);

    /* A copy that runs past the allocation is refused, as CUDA does. */
    EXPECT(cuMemcpyHtoD(again + N * sizeof *host - MIB, host, 2 * MIB) ==
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(again));
    CHECK(cuCtxDestroy(ctx));
    printf("all large copies correct\n");
    return 0;
}
