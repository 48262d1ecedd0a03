/* Exportable stream-ordered pools through the driver API, between two processes of one
 * server: the parent makes two pools exportable as POSIX file descriptors, fills an
 * allocation of each, and sends both pools' descriptors and both pointers' export data to a
 * child forked before either touched CUDA. The child imports the pools and the pointers,
 * adds one allocation into the other in place, and the parent reads the sum. Misuse gets
 * CUDA's errors: the wrong handle type, a pool that is not exportable, a pointer that is no
 * allocation of an exportable pool, a pointer imported into another pool than its own.
 * Results are checked against the host. Usage: driver_pool_ipc KERNELS.ptx (stream_kernels.cu) */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "forked_child.h"
#include "test_files.h"

enum { N = 2500, BLOCK = 256, BASE_A = 7, BASE_B = 1000 };

struct exported {
    CUmemPoolPtrExportData a, b;  /* an allocation of pool A, one of pool B */
};

static int setup(const char *ptx_path, CUcontext *ctx, CUmodule *mod, CUdevice *dev)
{
    char *ptx = read_file(ptx_path);
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(dev, 0));
    CHECK(cuCtxCreate(ctx, NULL, 0, *dev));
    CHECK(cuModuleLoadData(mod, ptx));
    free(ptx);
    return 0;
}

static void *as_handle(int fd) { return (void *)(uintptr_t)fd; }

static int child(const char *ptx_path, int from_parent, int to_parent)
{
    struct exported data;
    int fd_a = receive_fd(from_parent, &data, sizeof data);
    char none;
    int fd_b = receive_fd(from_parent, &none, 1);
    EXPECT(fd_a >= 0 && fd_b >= 0);
    CUcontext ctx; CUmodule mod; CUdevice dev; CUfunction add_into;
    if (setup(ptx_path, &ctx, &mod, &dev)) return 1;
    CHECK(cuModuleGetFunction(&add_into, mod, "add_into"));

    CUmemoryPool a, b, refused;
    EXPECT(cuMemPoolImportFromShareableHandle(&refused, as_handle(fd_a), CU_MEM_HANDLE_TYPE_NONE,
                                              0) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolImportFromShareableHandle(&refused, as_handle(fd_a),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1) ==
           CUDA_ERROR_INVALID_VALUE);
    /* a descriptor that is no exported pool (the channel to the parent) */
    EXPECT(cuMemPoolImportFromShareableHandle(&refused, as_handle(from_parent),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolImportFromShareableHandle(&a, as_handle(fd_a),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CHECK(cuMemPoolImportFromShareableHandle(&b, as_handle(fd_b),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(fd_a);
    close(fd_b);

    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr own, in_a, in_b;
    /* an imported pool only holds the pointers imported into it */
    EXPECT(cuMemAllocFromPoolAsync(&own, 64, a, stream) == CUDA_ERROR_INVALID_VALUE);
    /* each pointer belongs to its own pool */
    EXPECT(cuMemPoolImportPointer(&own, a, &data.b) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolImportPointer(&own, b, &data.a) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolImportPointer(&own, a, NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolImportPointer(&in_a, a, &data.a));
    CHECK(cuMemPoolImportPointer(&in_b, b, &data.b));
    EXPECT(in_a != in_b);

    /* a[i] += b[i], in place in the parent's memory */
    int n = N;
    void *params[] = {&in_a, &in_b, &in_a, &n};
    CHECK(cuLaunchKernel(add_into, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream,
                         params, NULL));
    CHECK(cuMemFreeAsync(in_a, stream));
    CHECK(cuMemFreeAsync(in_b, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemPoolDestroy(a));
    CHECK(cuMemPoolDestroy(b));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuCtxDestroy(ctx));
    char done = 'd';
    EXPECT(transfer(to_parent, &done, 1, 1));
    return 0;
}

static CUmemPoolProps pool_props(CUdevice dev, CUmemAllocationHandleType handle_types)
{
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = handle_types;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    return props;
}

static int fill(CUfunction kernel, CUdeviceptr v, int base, CUstream stream)
{
    int n = N;
    void *params[] = {&v, &n, &base};
    CHECK(cuLaunchKernel(kernel, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, stream, params,
                         NULL));
    return 0;
}

static int check_values(CUdeviceptr v, int (*want)(int))
{
    int *host = malloc(N * sizeof(int));
    EXPECT(host != NULL);
    CHECK(cuMemcpyDtoH(host, v, N * sizeof(int)));
    for (int i = 0; i < N; i++)
        EXPECT(host[i] == want(i));
    free(host);
    return 0;
}

static int summed(int i) { return (BASE_A + 3 * i) + (BASE_B + 3 * i); }
static int untouched(int i) { return BASE_B + 3 * i; }

int main(int argc, char **argv)
{
    const char *ptx_path = argc > 1 ? argv[1] : "stream_kernels.ptx";
    struct forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(ptx_path, other.in, other.out);

    CUcontext ctx; CUmodule mod; CUdevice dev; CUfunction fill_kernel;
    if (setup(ptx_path, &ctx, &mod, &dev)) return 1;
    CHECK(cuModuleGetFunction(&fill_kernel, mod, "fill"));
    int handle_types = 0;
    CHECK(cuDeviceGetAttribute(&handle_types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
                               dev));
    EXPECT(handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

    CUmemoryPool a, b, plain, device_default;
    CUmemPoolProps props = pool_props(dev, CU_MEM_HANDLE_TYPE_WIN32);
    EXPECT(cuMemPoolCreate(&a, &props) == CUDA_ERROR_INVALID_VALUE);
    props = pool_props(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK(cuMemPoolCreate(&a, &props));
    CHECK(cuMemPoolCreate(&b, &props));
    props = pool_props(dev, CU_MEM_HANDLE_TYPE_NONE);
    CHECK(cuMemPoolCreate(&plain, &props));
    CHECK(cuDeviceGetDefaultMemPool(&device_default, dev));

    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr va, vb, vplain, not_pooled;
    CHECK(cuMemAllocFromPoolAsync(&va, N * sizeof(int), a, stream));
    CHECK(cuMemAllocFromPoolAsync(&vb, N * sizeof(int), b, stream));
    CHECK(cuMemAllocFromPoolAsync(&vplain, 256, plain, stream));
    CHECK(cuMemAlloc(&not_pooled, 256));
    if (fill(fill_kernel, va, BASE_A, stream) || fill(fill_kernel, vb, BASE_B, stream)) return 1;

    /* Pools export only as what they were made exportable as, with no flags. */
    int fd_a = -1, fd_b = -1, refused = -1;
    EXPECT(cuMemPoolExportToShareableHandle(&refused, plain,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportToShareableHandle(&refused, device_default,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportToShareableHandle(&refused, a, CU_MEM_HANDLE_TYPE_WIN32, 0) ==
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportToShareableHandle(&refused, a, CU_MEM_HANDLE_TYPE_NONE, 0) ==
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportToShareableHandle(&refused, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                            1) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(refused == -1);
    CHECK(cuMemPoolExportToShareableHandle(&fd_a, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           0));
    CHECK(cuMemPoolExportToShareableHandle(&fd_b, b, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           0));
    EXPECT(fd_a >= 0 && fd_b >= 0 && fd_a != fd_b);

    /* Pointers export only from an exportable pool. */
    struct exported data;
    CUmemPoolPtrExportData unused;
    EXPECT(cuMemPoolExportPointer(&unused, not_pooled) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportPointer(&unused, vplain) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolExportPointer(&data.a, va));
    CHECK(cuMemPoolExportPointer(&data.b, vb));
    CHECK(cuStreamSynchronize(stream));  /* both filled before the child adds */

    char none = 0;
    EXPECT(send_fd(other.out, fd_a, &data, sizeof data));
    EXPECT(send_fd(other.out, fd_b, &none, 1));
    close(fd_a);
    close(fd_b);
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0) && done == 'd');
    EXPECT(child_succeeded(other.pid));

    if (check_values(va, summed) || check_values(vb, untouched)) return 1;
    CHECK(cuMemFreeAsync(va, stream));
    CHECK(cuMemFreeAsync(vb, stream));
    CHECK(cuMemFreeAsync(vplain, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemFree(not_pooled));
    CHECK(cuMemPoolDestroy(a));
    CHECK(cuMemPoolDestroy(b));
    CHECK(cuMemPoolDestroy(plain));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_pool_ipc: the child added pool B's %d ints into pool A's\n", N);
    return 0;
}
