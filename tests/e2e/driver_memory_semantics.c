/* What a driver-API program sees of memory and contexts, checked value by value: pointer
 * attributes written at their full width (8-byte outputs prefilled with a pattern, so that a
 * 4-byte write shows), the CUDA 13 entry points cuda-python asks cuGetProcAddress for,
 * synchronous memsets of mapped page-locked memory, host-to-host copies ordered after queued
 * work (and a "host" side that is device memory copied from the device), stale and stray
 * pointers refused, the primary context released by its last user.
 * Prints one line per check: "name got expected". Usage: driver_memory_semantics KERNELS.ptx */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 0xA5A5A5A5A5A5A5A5ULL
#define SENTINEL_HIGH 0xA5A5A5A5ULL

static int failures = 0;
static void expect(const char *what, long long got, long long want) {
    printf("%s %lld %lld\n", what, got, want);
    if (got != want) failures++;
}

/* One attribute into an 8-byte output holding SENTINEL. */
static unsigned long long attribute(CUpointer_attribute which, CUdeviceptr p, CUresult *rc) {
    unsigned long long out = SENTINEL;
    *rc = cuPointerGetAttribute(&out, which, p);
    return out;
}

/* A 4-byte attribute: the low half is the value, the high half still the pattern. */
static void expect_u32(const char *what, CUpointer_attribute which, CUdeviceptr p,
                       unsigned int want) {
    char name[96];
    CUresult rc;
    unsigned long long out = attribute(which, p, &rc);
    snprintf(name, sizeof name, "%s_rc", what);
    expect(name, rc, CUDA_SUCCESS);
    snprintf(name, sizeof name, "%s_value", what);
    expect(name, (long long)(out & 0xFFFFFFFFULL), want);
    snprintf(name, sizeof name, "%s_high_half_untouched", what);
    expect(name, (long long)(out >> 32), (long long)SENTINEL_HIGH);
}

/* An 8-byte attribute: all of it is the value. */
static void expect_u64(const char *what, CUpointer_attribute which, CUdeviceptr p,
                       unsigned long long want) {
    char name[96];
    CUresult rc;
    unsigned long long out = attribute(which, p, &rc);
    snprintf(name, sizeof name, "%s_rc", what);
    expect(name, rc, CUDA_SUCCESS);
    snprintf(name, sizeof name, "%s", what);
    expect(name, out == want, 1);
}

int main(void) {
    CUdevice dev; CUcontext ctx; CUdeviceptr d, pooled; CUstream stream; CUmemoryPool pool;
    enum { SIZE = 4096 };

    expect("init", cuInit(0), CUDA_SUCCESS);
    cuDeviceGet(&dev, 0);
    expect("retain", cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    cuCtxSetCurrent(ctx);
    expect("alloc", cuMemAlloc(&d, SIZE), CUDA_SUCCESS);

    /* pointer attributes of device memory, at cuda.h's numbering and widths */
    expect_u64("attr_context", CU_POINTER_ATTRIBUTE_CONTEXT, d + 40, (unsigned long long)ctx);
    expect_u32("attr_memory_type", CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 40, CU_MEMORYTYPE_DEVICE);
    expect_u64("attr_device_pointer", CU_POINTER_ATTRIBUTE_DEVICE_POINTER, d + 40, d + 40);
    expect_u32("attr_is_managed", CU_POINTER_ATTRIBUTE_IS_MANAGED, d, 0);
    expect_u32("attr_device_ordinal", CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d, 0);
    expect_u64("attr_range_start", CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 40, d);
    expect_u64("attr_range_size", CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 40, SIZE);
    expect_u32("attr_mapped", CU_POINTER_ATTRIBUTE_MAPPED, d, 1);
    expect_u64("attr_allowed_handle_types", CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, d,
               CU_MEM_HANDLE_TYPE_NONE);
    expect_u32("attr_access_flags", CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, d,
               CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    expect_u64("attr_mempool_of_plain_alloc", CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d, 0);
    {
        CUresult rc;
        unsigned long long rdma = attribute(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, d, &rc);
        expect("attr_rdma_rc", rc, CUDA_SUCCESS);
        expect("attr_rdma_is_a_boolean", (rdma & 0xFFFFFFFFULL) <= 1, 1);
        expect("attr_rdma_high_half_untouched", (long long)(rdma >> 32), (long long)SENTINEL_HIGH);
        unsigned long long size = attribute(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, d, &rc);
        expect("attr_mapping_size_rc", rc, CUDA_SUCCESS);
        expect("attr_mapping_size_covers", size >= SIZE && size < (1ULL << 40), 1);
        unsigned long long base = attribute(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, d + 40, &rc);
        expect("attr_mapping_base_rc", rc, CUDA_SUCCESS);
        expect("attr_mapping_base_at_or_below", base <= d && base + size >= d + SIZE, 1);
    }
    cuStreamCreate(&stream, 0);
    cuDeviceGetDefaultMemPool(&pool, dev);
    expect("alloc_async", cuMemAllocAsync(&pooled, SIZE, stream), CUDA_SUCCESS);
    expect_u64("attr_mempool_of_pooled_alloc", CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pooled,
               (unsigned long long)pool);
    cuMemFreeAsync(pooled, stream);

    /* an explicit pool: its properties checked, allocations from it, attributes of its own */
    {
        CUmemPoolProps props = {0};
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUmemPoolProps bad = props;
        CUmemoryPool mine = NULL, current = NULL;
        bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
        expect("pool_create_host_location", cuMemPoolCreate(&mine, &bad),
               CUDA_ERROR_INVALID_VALUE);
        bad = props;
        bad.location.id = 64;
        expect("pool_create_no_such_device", cuMemPoolCreate(&mine, &bad),
               CUDA_ERROR_INVALID_DEVICE);
        expect("pool_create", cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
        CUdeviceptr from_pool = 0;
        expect("pool_alloc", cuMemAllocFromPoolAsync(&from_pool, SIZE, mine, stream),
               CUDA_SUCCESS);
        expect_u64("attr_mempool_of_explicit_pool", CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                   from_pool, (unsigned long long)mine);
        expect_u64("attr_handle_types_of_explicit_pool",
                   CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, from_pool,
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        cuuint64_t used = 0;
        cuMemPoolGetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        expect("pool_used", (long long)used, SIZE);
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        expect("default_pool_used", (long long)used, 0);
        expect("pool_set_current", cuDeviceSetMemPool(dev, mine), CUDA_SUCCESS);
        cuDeviceGetMemPool(&current, dev);
        expect("pool_is_current", current == mine, 1);
        expect("pool_destroy_default", cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
        cuMemFreeAsync(from_pool, stream);
        expect("pool_destroy", cuMemPoolDestroy(mine), CUDA_SUCCESS);
        cuDeviceGetMemPool(&current, dev);
        expect("pool_default_again", current == pool, 1);
        expect("pool_destroyed_alloc", cuMemAllocFromPoolAsync(&from_pool, SIZE, mine, stream),
               CUDA_ERROR_INVALID_VALUE);
    }

    /* several at once, for memory CUDA does not know: every output zeroed at its width */
    {
        char stack_var[8];
        CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_CONTEXT,
                                       CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                       CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                       CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                       CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
        unsigned long long outs[5];
        void *data[5];
        for (int i = 0; i < 5; i++) { outs[i] = SENTINEL; data[i] = &outs[i]; }
        expect("attrs_unknown_rc", cuPointerGetAttributes(5, which, data, (CUdeviceptr)stack_var),
               CUDA_SUCCESS);
        expect("attrs_unknown_context", outs[0] == 0, 1);
        expect("attrs_unknown_device_pointer", outs[1] == 0, 1);
        expect("attrs_unknown_host_pointer", outs[2] == 0, 1);
        expect("attrs_unknown_range_size", outs[3] == 0, 1);
        expect("attrs_unknown_memory_type", (long long)(outs[4] & 0xFFFFFFFFULL), 0);
        expect("attrs_unknown_memory_type_high_half", (long long)(outs[4] >> 32),
               (long long)SENTINEL_HIGH);
    }

    /* the CUDA 13 versions cuda-python resolves: working implementations */
    {
        CUresult (*synchronize_v2)(CUcontext) = NULL;
        CUresult (*get_device_v2)(CUdevice *, CUcontext) = NULL;
        CUresult (*stream_ctx_v2)(CUstream, CUcontext *, CUgreenCtx *) = NULL;
        CUdevice got_dev = -1; CUcontext got_ctx = NULL; CUgreenCtx green = (CUgreenCtx)1;
        expect("proc_sync_v2", cuGetProcAddress("cuCtxSynchronize", (void **)&synchronize_v2,
                                                13000, 0, NULL), CUDA_SUCCESS);
        expect("proc_get_device_v2", cuGetProcAddress("cuCtxGetDevice", (void **)&get_device_v2,
                                                      13000, 0, NULL), CUDA_SUCCESS);
        expect("proc_stream_ctx_v2", cuGetProcAddress("cuStreamGetCtx", (void **)&stream_ctx_v2,
                                                      12050, 0, NULL), CUDA_SUCCESS);
        expect("sync_v2_current", synchronize_v2(NULL), CUDA_SUCCESS);
        expect("sync_v2_ctx", synchronize_v2(ctx), CUDA_SUCCESS);
        expect("sync_v2_bad_ctx", synchronize_v2((CUcontext)stream), CUDA_ERROR_INVALID_CONTEXT);
        expect("get_device_v2", get_device_v2(&got_dev, ctx), CUDA_SUCCESS);
        expect("get_device_v2_value", got_dev, dev);
        expect("stream_ctx_v2", stream_ctx_v2(stream, &got_ctx, &green), CUDA_SUCCESS);
        expect("stream_ctx_v2_ctx", got_ctx == ctx, 1);
        expect("stream_ctx_v2_no_green", green == NULL, 1);
    }

    /* a synchronous memset of mapped page-locked memory is done when it returns */
    {
        unsigned char *mapped;
        CUdeviceptr mapped_dev, base = 0;
        size_t size = 0;
        expect("host_alloc_mapped", cuMemHostAlloc((void **)&mapped, SIZE,
                                                   CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
        memset(mapped, 0, SIZE);
        cuMemHostGetDevicePointer(&mapped_dev, mapped, 0);
        expect("memset_mapped", cuMemsetD8(mapped_dev, 0x5a, SIZE), CUDA_SUCCESS);
        expect("memset_mapped_first_byte", mapped[0], 0x5a);
        expect("memset_mapped_last_byte", mapped[SIZE - 1], 0x5a);
        expect("memset_mapped_d32", cuMemsetD32(mapped_dev, 0x01020304, SIZE / 4), CUDA_SUCCESS);
        expect("memset_mapped_d32_word", ((unsigned int *)mapped)[7], 0x01020304);
        expect("address_range_mapped", cuMemGetAddressRange(&base, &size, mapped_dev + 100),
               CUDA_SUCCESS);
        expect("address_range_mapped_base", base == mapped_dev, 1);
        expect("address_range_mapped_size", (long long)size, SIZE);
        cuMemFreeHost(mapped);
    }

    /* host-to-host copies between page-locked buffers keep their place after queued work */
    {
        unsigned char *filled, *copy, *source, *other, back[SIZE];
        CUdeviceptr target;
        cuMemAllocHost((void **)&filled, SIZE);
        cuMemAllocHost((void **)&copy, SIZE);
        cuMemAllocHost((void **)&source, SIZE);
        cuMemAllocHost((void **)&other, SIZE);
        cuMemAlloc(&target, SIZE);
        memset(filled, 0, SIZE);
        memset(source, 0x22, SIZE);
        memset(other, 0x33, SIZE);
        cuMemsetD8Async(d, 0x11, SIZE, stream);
        cuMemcpyDtoHAsync(filled, d, SIZE, stream);  /* queued: fills `filled` later */
        expect("h2h_after_queued_fill", cuMemcpy((CUdeviceptr)copy, (CUdeviceptr)filled, SIZE),
               CUDA_SUCCESS);
        expect("h2h_reads_the_filled_bytes", copy[0] == 0x11 && copy[SIZE - 1] == 0x11, 1);
        cuMemcpyHtoDAsync(target, source, SIZE, stream);  /* queued: reads `source` later */
        expect("h2h_over_queued_source", cuMemcpy((CUdeviceptr)source, (CUdeviceptr)other, SIZE),
               CUDA_SUCCESS);
        cuStreamSynchronize(stream);
        cuMemcpyDtoH(back, target, SIZE);
        expect("queued_copy_read_the_old_bytes", back[0] == 0x22 && back[SIZE - 1] == 0x22, 1);
        expect("h2h_wrote_the_new_bytes", source[0] == 0x33, 1);
        {
            /* A "host" side that is device memory: with unified addressing the pointer
             * decides. NVIDIA's runtime copies cudaMemcpyHostToHost with this call, and its
             * driver copies a device source so. */
            CUDA_MEMCPY2D p;
            memset(&p, 0, sizeof p);
            memset(copy, 0, SIZE);
            p.srcMemoryType = CU_MEMORYTYPE_HOST;
            p.srcHost = (const void *)target;
            p.srcPitch = SIZE;
            p.dstMemoryType = CU_MEMORYTYPE_HOST;
            p.dstHost = copy;
            p.dstPitch = SIZE;
            p.WidthInBytes = SIZE;
            p.Height = 1;
            expect("h2h_2d_from_device_memory", cuMemcpy2DUnaligned(&p), CUDA_SUCCESS);
            expect("h2h_2d_read_the_device_bytes", copy[0] == 0x22 && copy[SIZE - 1] == 0x22, 1);
        }
        cuMemFreeHost(filled); cuMemFreeHost(copy); cuMemFreeHost(source); cuMemFreeHost(other);
        cuMemFree(target);
    }

    /* a freed device pointer taken for host memory is an error, not a crash */
    {
        CUdeviceptr freed;
        char host[64] = {0};
        cuMemAlloc(&freed, 64);
        cuMemFree(freed);
        expect("copy_from_freed", cuMemcpy((CUdeviceptr)host, freed, 64), CUDA_ERROR_INVALID_VALUE);
        expect("copy_to_freed", cuMemcpy(freed, (CUdeviceptr)host, 64), CUDA_ERROR_INVALID_VALUE);
        expect("copy_to_stray_address", cuMemcpyDtoH((void *)16, d, 64), CUDA_ERROR_INVALID_VALUE);
    }

    expect("final_sync", cuCtxSynchronize(), CUDA_SUCCESS);

    /* the primary context released by its last user goes, with its memory */
    {
        CUcontext again;
        CUdeviceptr kept;
        unsigned int flags; int active = -1;
        size_t free_before, free_after, total;
        cuMemAlloc(&kept, 1 << 20);
        cuMemGetInfo(&free_before, &total);
        expect("release_last", cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
        expect("state_after_release", cuDevicePrimaryCtxGetState(dev, &flags, &active),
               CUDA_SUCCESS);
        expect("inactive_after_release", active, 0);
        expect("release_again", cuDevicePrimaryCtxRelease(dev), CUDA_ERROR_INVALID_CONTEXT);
        expect("retain_again", cuDevicePrimaryCtxRetain(&again, dev), CUDA_SUCCESS);
        cuCtxSetCurrent(again);
        cuMemGetInfo(&free_after, &total);
        expect("memory_released", free_after == total && free_after > free_before, 1);
        expect("old_allocation_gone", cuMemFree(kept), CUDA_ERROR_INVALID_VALUE);
        expect("old_stream_gone", cuStreamSynchronize(stream), CUDA_ERROR_INVALID_HANDLE);
        expect("fresh_context_works", cuMemAlloc(&kept, 64), CUDA_SUCCESS);
        expect("fresh_context_frees", cuMemFree(kept), CUDA_SUCCESS);
    }
    printf("failures %d\n", failures);
    return failures != 0;
}
