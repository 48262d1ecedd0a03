/* IPC through the driver API between two processes of one server: the parent exports device
 * memory and an interprocess event recorded behind a kernel that waits for a flag; the child,
 * forked before either touched CUDA, opens both, sets the flag in the shared memory, waits for
 * the parent's event, and reads what the parent's kernel wrote. Results are checked against
 * the host; misuse gets CUDA's errors. Usage: driver_ipc KERNELS.ptx (stream_kernels.cu) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "forked_child.h"
#include "test_files.h"

enum { N = 3000, BLOCK = 256 };

struct handles {
    CUipcMemHandle memory, flag;
    CUipcEventHandle event;
};

static int setup(const char *ptx_path, CUcontext *ctx, CUmodule *mod)
{
    CUdevice dev;
    char *ptx = read_file(ptx_path);
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    int ipc_events = 0;
    CHECK(cuDeviceGetAttribute(&ipc_events, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, dev));
    EXPECT(ipc_events == 1);
    CHECK(cuCtxCreate(ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(mod, ptx));
    free(ptx);
    return 0;
}

static int child(const char *ptx_path, int from_parent, int to_parent)
{
    CUcontext ctx; CUmodule mod; CUfunction set_flag, add_into;
    struct handles h;
    EXPECT(transfer(from_parent, &h, sizeof h, 0));
    if (setup(ptx_path, &ctx, &mod)) return 1;
    CHECK(cuModuleGetFunction(&set_flag, mod, "set_flag"));
    CHECK(cuModuleGetFunction(&add_into, mod, "add_into"));
    CUdeviceptr memory, again, flag, nothing;
    CUevent parents;
    EXPECT(cuIpcOpenMemHandle(&memory, h.memory, 2) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuIpcOpenMemHandle(&memory, h.memory, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(cuIpcOpenMemHandle(&again, h.memory, 0));
    EXPECT(again == memory);
    CHECK(cuIpcOpenMemHandle(&flag, h.flag, 0));
    CUipcMemHandle forged = h.memory;
    forged.reserved[33] ^= 0x11;
    EXPECT(cuIpcOpenMemHandle(&nothing, forged, 0) == CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMemFree(memory) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuIpcOpenEventHandle(&parents, h.event));
    EXPECT(cuEventQuery(parents) == CUDA_ERROR_NOT_READY);

    /* Release the parent's kernel, then wait for its event before reading what it wrote. */
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    int value = 5;
    void *set_params[] = {&flag, &value};
    CHECK(cuLaunchKernel(set_flag, 1, 1, 1, 1, 1, 1, 0, stream, set_params, NULL));
    CHECK(cuStreamWaitEvent(stream, parents, 0));
    /* memory[i] += memory[i] for every i, after the parent's kernel has filled it */
    int n = N;
    void *add_params[] = {&memory, &memory, &memory, &n};
    CHECK(cuLaunchKernel(add_into, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream,
                         add_params, NULL));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuEventSynchronize(parents));
    CHECK(cuIpcCloseMemHandle(again));
    CHECK(cuIpcCloseMemHandle(memory));
    CHECK(cuIpcCloseMemHandle(flag));
    EXPECT(cuIpcCloseMemHandle(memory) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventDestroy(parents));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuCtxDestroy(ctx));
    char done = 'd';
    EXPECT(transfer(to_parent, &done, 1, 1));
    return 0;
}

int main(int argc, char **argv)
{
    const char *ptx_path = argc > 1 ? argv[1] : "stream_kernels.ptx";
    struct forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(ptx_path, other.in, other.out);

    CUcontext ctx; CUmodule mod; CUfunction wait_for_flag, fill;
    if (setup(ptx_path, &ctx, &mod)) return 1;
    CHECK(cuModuleGetFunction(&wait_for_flag, mod, "wait_for_flag"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill"));
    CUdeviceptr memory, flag, seen;
    CHECK(cuMemAlloc(&memory, N * sizeof(int)));
    CHECK(cuMemAlloc(&flag, sizeof(int)));
    CHECK(cuMemAlloc(&seen, sizeof(int)));
    CHECK(cuMemsetD32(flag, 0, 1));
    CHECK(cuMemsetD32(memory, 0, N));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent event, timed;
    EXPECT(cuEventCreate(&event, CU_EVENT_INTERPROCESS) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&timed, CU_EVENT_DEFAULT));
    struct handles h;
    EXPECT(cuIpcGetEventHandle(&h.event, timed) == CUDA_ERROR_INVALID_VALUE);
    /* the kernel waits for the child's flag; the fill behind it gives what the child reads */
    void *wait_params[] = {&flag, &seen};
    CHECK(cuLaunchKernel(wait_for_flag, 1, 1, 1, 1, 1, 1, 0, stream, wait_params, NULL));
    int n = N, base = 11;
    void *fill_params[] = {&memory, &n, &base};
    CHECK(cuLaunchKernel(fill, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream,
                         fill_params, NULL));
    CHECK(cuEventRecord(event, stream));
    CHECK(cuIpcGetEventHandle(&h.event, event));
    CHECK(cuIpcGetMemHandle(&h.memory, memory));
    CHECK(cuIpcGetMemHandle(&h.flag, flag));
    CUdeviceptr own;
    EXPECT(cuIpcOpenMemHandle(&own, h.memory, 0) == CUDA_ERROR_INVALID_CONTEXT);
    int on_host = 0;
    EXPECT(cuIpcGetMemHandle(&h.flag, (CUdeviceptr)&on_host) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuIpcGetMemHandle(&h.flag, flag));
    EXPECT(transfer(other.out, &h, sizeof h, 1));
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0));
    EXPECT(child_succeeded(other.pid));
    int *result = malloc(N * sizeof(int));
    int seen_value = 0;
    CHECK(cuMemcpyDtoH(result, memory, N * sizeof(int)));
    CHECK(cuMemcpyDtoH(&seen_value, seen, sizeof seen_value));
    EXPECT(seen_value == 6);
    for (int i = 0; i < N; i++)
        EXPECT(result[i] == 2 * (base + 3 * i));
    free(result);
    CHECK(cuCtxDestroy(ctx));
    printf("driver_ipc: all checks passed\n");
    return 0;
}
