// Explicit stream-ordered memory pools: a pool made with cudaMemPoolCreate, allocations from it
// (cudaMallocFromPoolAsync, and cudaMallocAsync once it is the device's current pool), its
// attributes and access, and the errors CUDA gives for misuse. The pool is exportable: the
// parent sends its file descriptor and one pointer's export data to a child forked before
// either touched CUDA; the child imports both, checks what it sees and adds to it in place,
// and the parent reads the sum. Results are checked against the host.
#include "check.cuh"
#include "forked_child.h"
#include <cstdint>

__global__ void fill(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = 5 * i + 2;
}

__global__ void check_and_add(int *v, int n, int *wrong)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        if (v[i] != 5 * i + 2)
            atomicAdd(wrong, 1);
        v[i] += 100 * i;
    }
}

static int child(const forked &parent, int n)
{
    cudaMemPoolPtrExportData data;
    int fd = receive_fd(parent.in, &data, sizeof(data));
    EXPECT(fd >= 0);
    cudaMemPool_t imported;
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemPoolImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
                                                      cudaMemHandleTypeNone, 0));
    CHECK(cudaMemPoolImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
                                               cudaMemHandleTypePosixFileDescriptor, 0));
    close(fd);
    // An imported pool only holds what is imported into it.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    void *own;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMallocFromPoolAsync(&own, 64, imported, stream));
    int *shared;
    CHECK(cudaMemPoolImportPointer((void **)&shared, imported, &data));
    // Export data of another pool (here: altered) is refused.
    cudaMemPoolPtrExportData altered = data;
    altered.reserved[0] ^= 0xff;
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemPoolImportPointer(&own, imported, &altered));
    int *wrong;
    CHECK(cudaMalloc(&wrong, sizeof(int)));
    CHECK(cudaMemset(wrong, 0, sizeof(int)));
    check_and_add<<<(n + 255) / 256, 256, 0, stream>>>(shared, n, wrong);
    int wrong_count = -1;
    CHECK(cudaMemcpyAsync(&wrong_count, wrong, sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaFreeAsync(shared, stream));
    CHECK(cudaStreamSynchronize(stream));
    EXPECT(wrong_count == 0);
    CHECK(cudaMemPoolDestroy(imported));
    char done = 1;
    EXPECT(transfer(parent.out, &done, 1, 1));
    return 0;
}

int main()
{
    const int n = 3000;
    forked other;
    EXPECT(fork_with_channels(&other));
    if (other.pid == 0)
        return child(other, n);

    // The device says pools export to file descriptors, as programs check before they do.
    int handle_types = 0;
    CHECK(cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
    EXPECT(handle_types & cudaMemHandleTypePosixFileDescriptor);
    cudaDeviceProp device_props;
    CHECK(cudaGetDeviceProperties(&device_props, 0));
    EXPECT(device_props.memoryPoolSupportedHandleTypes == (unsigned)handle_types);

    // Misuse of the pool's properties.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    cudaMemPool_t pool;
    cudaMemPoolProps bad = props;
    bad.allocType = cudaMemAllocationTypeInvalid;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolCreate(&pool, &bad));
    bad = props;
    bad.location.id = 99;
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaMemPoolCreate(&pool, &bad));
    bad = props;
    bad.handleTypes = cudaMemHandleTypeWin32;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolCreate(&pool, &bad));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolCreate(&pool, nullptr));
    CHECK(cudaMemPoolCreate(&pool, &props));
    cudaMemPool_t default_pool, current;
    CHECK(cudaDeviceGetDefaultMemPool(&default_pool, 0));
    EXPECT(pool != default_pool);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolDestroy(default_pool));

    // Attributes are the pool's own.
    unsigned long long threshold = 1 << 20, got = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &got));
    EXPECT(got == threshold);
    CHECK(cudaMemPoolGetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &got));
    EXPECT(got == 0);

    // Access: the owning device always reads and writes.
    cudaMemLocation location = {cudaMemLocationTypeDevice, 0};
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    CHECK(cudaMemPoolGetAccess(&flags, pool, &location));
    EXPECT(flags == cudaMemAccessFlagsProtReadWrite);
    cudaMemAccessDesc desc = {location, cudaMemAccessFlagsProtReadWrite};
    CHECK(cudaMemPoolSetAccess(pool, &desc, 1));
    desc.flags = cudaMemAccessFlagsProtNone;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolSetAccess(pool, &desc, 1));

    // Allocation from the pool, and from the device's current pool once it is this one.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int *v, *scratch;
    CHECK(cudaMallocFromPoolAsync(&v, n * sizeof(int), pool, stream));
    CHECK(cudaDeviceSetMemPool(0, pool));
    CHECK(cudaDeviceGetMemPool(&current, 0));
    EXPECT(current == pool);
    CHECK(cudaMallocAsync(&scratch, 1024, stream));
    unsigned long long used = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    EXPECT(used == n * sizeof(int) + 1024);
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, scratch));
    EXPECT(attributes.type == cudaMemoryTypeDevice);
    CHECK(cudaFreeAsync(scratch, stream));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    fill<<<(n + 255) / 256, 256, 0, stream>>>(v, n);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    EXPECT(used == n * sizeof(int));

    // Export: the pool as a file descriptor, the pointer as export data.
    int fd = -1;
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemPoolExportToShareableHandle(&fd, default_pool,
                                                    cudaMemHandleTypePosixFileDescriptor, 0));
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor,
                                             0));
    cudaMemPoolPtrExportData data;
    int *plain;
    CHECK(cudaMalloc(&plain, 64));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolExportPointer(&data, plain));
    CHECK(cudaMemPoolExportPointer(&data, v));
    EXPECT(send_fd(other.out, fd, &data, sizeof(data)));
    close(fd);
    char done = 0;
    EXPECT(transfer(other.in, &done, 1, 0) && done == 1);
    EXPECT(child_succeeded(other.pid));

    int *host = new int[n];
    CHECK(cudaMemcpy(host, v, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(host[i] == 5 * i + 2 + 100 * i);
    delete[] host;
    CHECK(cudaFreeAsync(v, stream));
    CHECK(cudaFree(plain));
    CHECK(cudaStreamSynchronize(stream));
    // Destroying the current pool puts the device back on its default pool.
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaDeviceGetMemPool(&current, 0));
    EXPECT(current == default_pool);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemPoolDestroy(pool));
    printf("memory_pools: the child process added to %d ints of the parent's pool\n", n);
    return 0;
}
