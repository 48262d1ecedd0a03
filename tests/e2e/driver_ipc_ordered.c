/* IPC through the driver API between two processes of one server, in order: the parent fills
 * device memory that lies behind another allocation (so not at the start of the device's
 * page), records an interprocess event behind the kernel, and exports both; the child, forked
 * before either touched CUDA, opens them, has its stream wait for the parent's event, doubles
 * the memory in place with a kernel, and checks what it read; the parent then reads the
 * doubled values. Nothing waits for the other process on the device, so any backend runs it.
 * Usage: driver_ipc_ordered KERNELS.ptx (stream_kernels.cu) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include "driver_checks.h"
#include "forked_child.h"
#include "test_files.h"

enum { N = 3000, BLOCK = 256, BASE = 11 };

struct handles {
    CUipcMemHandle memory;
    CUipcEventHandle event;
};

/* A context of its own, and `name` of the PTX module at `ptx_path` loaded in it. */
static int kernel_in_new_context(const char *ptx_path, const char *name, CUcontext *ctx,
                                 CUfunction *kernel)
{
    CUdevice dev;
    CUmodule mod;
    char *ptx = read_file(ptx_path);
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    free(ptx);
    CHECK(cuModuleGetFunction(kernel, mod, name));
    return 0;
}

static int child(const char *ptx_path, int from_parent, int to_parent)
{
    CUcontext ctx;
    CUfunction add_into;
    struct handles h;
    EXPECT(transfer(from_parent, &h, sizeof h, 0));
    if (kernel_in_new_context(ptx_path, "add_into", &ctx, &add_into)) return 1;
    CUdeviceptr memory, again;
    CUevent parents;
    CHECK(cuIpcOpenMemHandle(&memory, h.memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(cuIpcOpenMemHandle(&again, h.memory, 0));
    EXPECT(again == memory);
    CHECK(cuIpcOpenEventHandle(&parents, h.event));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamWaitEvent(stream, parents, 0));
    int *seen = malloc(N * sizeof(int));
    EXPECT(seen != NULL);
    CHECK(cuMemcpyDtoHAsync(seen, memory, N * sizeof(int), stream));
    int n = N;
    void *add_params[] = {&memory, &memory, &memory, &n};
    CHECK(cuLaunchKernel(add_into, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream,
                         add_params, NULL));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuEventSynchronize(parents));
    CHECK(cuEventQuery(parents));
    for (int i = 0; i < N; i++)
        EXPECT(seen[i] == BASE + 3 * i);
    free(seen);
    CHECK(cuStreamDestroy(stream));
    CHECK(cuEventDestroy(parents));
    CHECK(cuIpcCloseMemHandle(again));
    CHECK(cuIpcCloseMemHandle(memory));
    EXPECT(cuIpcCloseMemHandle(memory) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxDestroy(ctx));
    char done = 'd';
    EXPECT(transfer(to_parent, &done, 1, 1));
    return 0;
}

int main(int argc, char **argv)
{
    EXPECT(argc == 2);
    struct forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(argv[1], other.in, other.out);

    CUcontext ctx;
    CUfunction fill;
    if (kernel_in_new_context(argv[1], "fill", &ctx, &fill)) return 1;
    CUdeviceptr before, memory;
    CHECK(cuMemAlloc(&before, 1000));
    CHECK(cuMemAlloc(&memory, N * sizeof(int)));
    CHECK(cuMemsetD8(before, 0x5a, 1000));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent event;
    CHECK(cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    int n = N, base = BASE;
    void *fill_params[] = {&memory, &n, &base};
    CHECK(cuLaunchKernel(fill, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream,
                         fill_params, NULL));
    CHECK(cuEventRecord(event, stream));
    struct handles h;
    CHECK(cuIpcGetEventHandle(&h.event, event));
    CHECK(cuIpcGetMemHandle(&h.memory, memory + 4 * 100));  /* any address inside it */
    EXPECT(transfer(other.out, &h, sizeof h, 1));
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0));
    EXPECT(child_succeeded(other.pid));
    int *result = malloc(N * sizeof(int));
    unsigned char *untouched = malloc(1000);
    EXPECT(result != NULL && untouched != NULL);
    CHECK(cuMemcpyDtoH(result, memory, N * sizeof(int)));
    CHECK(cuMemcpyDtoH(untouched, before, 1000));
    for (int i = 0; i < N; i++)
        EXPECT(result[i] == 2 * (BASE + 3 * i));
    for (int i = 0; i < 1000; i++)
        EXPECT(untouched[i] == 0x5a);
    free(result);
    free(untouched);
    CHECK(cuEventDestroy(event));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_ipc_ordered: the child doubled the parent's memory after its event\n");
    return 0;
}
