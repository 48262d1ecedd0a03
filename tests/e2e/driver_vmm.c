/* CUDA's virtual memory API as a driver-API program uses it, in the manner of cuda-samples'
 * vectorAddMMAP: address ranges reserved (one at a fixed address), physical allocations
 * mapped into them, access granted, a kernel run over them, one allocation mapped at two
 * addresses showing the same bytes, then everything unmapped, released and freed; and
 * misuse, each with CUDA's error. Prints one line per check: "name got expected".
 *
 * Usage: driver_vmm KERNELS.ptx [MODE]. MODE "api" (the default) runs the above; the others
 * end in a fault that loses the context, as a GPU's would:
 *   copy-without-access    a copy into memory mapped but not made accessible
 *   kernel-without-access  a kernel reading such memory
 *   write-read-only        reads of memory made read-only, then a kernel writing it
 * and one holds state for a test to move:
 *   hold PAUSE_FILE        one allocation at two addresses (read-write, read-only), another
 *                          released while mapped at a far fixed address, both filled;
 *                          prints "pid N", waits until PAUSE_FILE is gone, then checks all
 *                          is as it was */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test_files.h"

static int failures = 0;
static void expect(const char *what, long long got, long long want) {
    printf("%s %lld %lld\n", what, got, want);
    if (got != want) failures++;
}

static CUmemAllocationProp device_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

static CUmemAccessDesc access_desc(CUmemAccess_flags flags) {
    CUmemAccessDesc desc;
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    desc.flags = flags;
    return desc;
}

static CUresult set_access(CUdeviceptr p, size_t size, CUmemAccess_flags flags) {
    CUmemAccessDesc desc = access_desc(flags);
    return cuMemSetAccess(p, size, &desc, 1);
}

static size_t free_memory(void) {
    size_t free_bytes = 0, total = 0;
    cuMemGetInfo(&free_bytes, &total);
    return free_bytes;
}

static CUresult launch(CUfunction f, void **args, int n) {
    CUresult rc = cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    return rc != CUDA_SUCCESS ? rc : cuCtxSynchronize();
}

enum { N = 4096 };  /* floats the kernels work on, at the start of each mapping */
static float host_a[N], host_b[N], host_c[N];

static void api(CUfunction vadd, CUfunction scale, size_t gran) {
    CUmemAllocationProp prop = device_prop();
    CUdeviceptr first, fixed, moved, plain, spare;
    CUmemGenericAllocationHandle ha, hb, hc, hd, retained;
    size_t baseline;
    int n = N;
    float two = 2.0f;

    /* reservations: one where the driver likes, one at a fixed free address, one asked for
     * where the first lies, which goes elsewhere */
    expect("reserve", cuMemAddressReserve(&first, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    expect("reserve_aligned_to_granularity", first % gran, 0);
    CUdeviceptr wanted = first + 64 * gran;
    expect("reserve_fixed", cuMemAddressReserve(&fixed, 2 * gran, 0, wanted, 0), CUDA_SUCCESS);
    expect("reserve_fixed_honoured", fixed == wanted, 1);
    /* far from everything the program has: honoured too */
    CUdeviceptr far_wanted = first + (2ULL << 40), far;
    expect("reserve_fixed_far", cuMemAddressReserve(&far, gran, 0, far_wanted, 0),
           CUDA_SUCCESS);
    expect("reserve_fixed_far_honoured", far == far_wanted, 1);
    expect("reserve_taken_hint", cuMemAddressReserve(&moved, 2 * gran, 0, first, 0),
           CUDA_SUCCESS);
    expect("reserve_taken_hint_elsewhere",
           moved != first && (moved >= first + 4 * gran || moved + 2 * gran <= first), 1);
    expect("alloc", cuMemAlloc(&plain, gran), CUDA_SUCCESS);
    baseline = free_memory();
    expect("alloc_outside_reservations",
           (plain >= first + 4 * gran || plain + gran <= first) &&
           (plain >= fixed + 2 * gran || plain + gran <= fixed) &&
           (plain >= moved + 2 * gran || plain + gran <= moved), 1);

    /* physical memory: counted in use from its creation */
    expect("create_a", cuMemCreate(&ha, gran, &prop, 0), CUDA_SUCCESS);
    expect("create_b", cuMemCreate(&hb, gran, &prop, 0), CUDA_SUCCESS);
    expect("create_c", cuMemCreate(&hc, gran, &prop, 0), CUDA_SUCCESS);
    expect("create_d", cuMemCreate(&hd, 2 * gran, &prop, 0), CUDA_SUCCESS);
    expect("created_memory_in_use", baseline - free_memory(), (long long)(5 * gran));

    /* three allocations side by side in the first reservation, made accessible at once */
    expect("map_a", cuMemMap(first, gran, 0, ha, 0), CUDA_SUCCESS);
    expect("map_b", cuMemMap(first + gran, gran, 0, hb, 0), CUDA_SUCCESS);
    expect("map_c", cuMemMap(first + 2 * gran, gran, 0, hc, 0), CUDA_SUCCESS);
    expect("set_access", set_access(first, 3 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
           CUDA_SUCCESS);
    {
        unsigned long long flags = 99;
        CUmemLocation location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
        expect("get_access", cuMemGetAccess(&flags, &location, first + gran + 64), CUDA_SUCCESS);
        expect("get_access_flags", (long long)flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }

    /* vector add over mapped memory */
    for (int i = 0; i < N; i++) { host_a[i] = i * 0.5f; host_b[i] = 1000.0f - i; }
    CUdeviceptr da = first, db = first + gran, dc = first + 2 * gran;
    expect("copy_in_a", cuMemcpyHtoD(da, host_a, sizeof host_a), CUDA_SUCCESS);
    expect("copy_in_b", cuMemcpyHtoD(db, host_b, sizeof host_b), CUDA_SUCCESS);
    void *vadd_args[] = {&da, &db, &dc, &n};
    expect("vadd", launch(vadd, vadd_args, N), CUDA_SUCCESS);
    expect("copy_out_c", cuMemcpyDtoH(host_c, dc, sizeof host_c), CUDA_SUCCESS);
    int right = 1;
    for (int i = 0; i < N; i++) right &= host_c[i] == host_a[i] + host_b[i];
    expect("vadd_results", right, 1);

    /* b and c are one run of addresses: copies, memsets and kernels cross from one to the
     * other, as on a GPU */
    {
        float cross[16], back[16];
        int sixteen = 16;
        CUdeviceptr seam = first + 2 * gran - 8 * sizeof(float), inside_c = dc + 4096;
        for (int i = 0; i < 16; i++) cross[i] = i + 0.25f;
        expect("copy_across_mappings", cuMemcpyHtoD(seam, cross, sizeof cross), CUDA_SUCCESS);
        void *args[] = {&seam, &two, &sixteen};
        expect("kernel_across_mappings", launch(scale, args, 16), CUDA_SUCCESS);
        expect("copy_back_across_mappings", cuMemcpyDtoH(back, seam, sizeof back), CUDA_SUCCESS);
        right = 1;
        for (int i = 0; i < 16; i++) right &= back[i] == cross[i] * 2.0f;
        expect("across_mappings_results", right, 1);
        expect("memset_across_mappings", cuMemsetD32(seam, 0x3f800000, 16), CUDA_SUCCESS);
        expect("copy_dtod_across_mappings", cuMemcpyDtoD(inside_c, seam, sizeof back),
               CUDA_SUCCESS);
        expect("copy_back_dtod", cuMemcpyDtoH(back, inside_c, sizeof back), CUDA_SUCCESS);
        right = 1;
        for (int i = 0; i < 16; i++) right &= back[i] == 1.0f;
        expect("memset_and_dtod_across_mappings_results", right, 1);
        expect("copy_past_mapped_memory", cuMemcpyHtoD(first + 3 * gran - 8, cross, 16),
               CUDA_ERROR_INVALID_VALUE);
    }

    /* pointer queries see each mapping */
    {
        CUdeviceptr base = 0; size_t size = 0;
        expect("address_range", cuMemGetAddressRange(&base, &size, db + 100), CUDA_SUCCESS);
        expect("address_range_base", base == db, 1);
        expect("address_range_size", (long long)size, (long long)gran);
        unsigned int type = 0;
        expect("pointer_memory_type",
               cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, db + 100),
               CUDA_SUCCESS);
        expect("pointer_memory_type_device", type, CU_MEMORYTYPE_DEVICE);
    }

    /* aliasing: allocation a at a second address shows the same bytes, both ways */
    expect("map_a_again", cuMemMap(fixed, gran, 0, ha, 0), CUDA_SUCCESS);
    expect("set_access_alias", set_access(fixed, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
           CUDA_SUCCESS);
    expect("copy_out_alias", cuMemcpyDtoH(host_c, fixed, sizeof host_c), CUDA_SUCCESS);
    expect("alias_shows_a", memcmp(host_c, host_a, sizeof host_a) == 0, 1);
    void *scale_args[] = {&fixed, &two, &n};
    expect("scale_alias", launch(scale, scale_args, N), CUDA_SUCCESS);
    expect("copy_out_a", cuMemcpyDtoH(host_c, da, sizeof host_c), CUDA_SUCCESS);
    right = 1;
    for (int i = 0; i < N; i++) right &= host_c[i] == host_a[i] * 2.0f;
    expect("write_through_alias_shows_at_a", right, 1);

    /* c at the far address too */
    {
        static float at_c[N];
        expect("map_c_far", cuMemMap(far, gran, 0, hc, 0), CUDA_SUCCESS);
        expect("set_access_far", set_access(far, gran, CU_MEM_ACCESS_FLAGS_PROT_READ),
               CUDA_SUCCESS);
        expect("copy_out_far", cuMemcpyDtoH(host_c, far, sizeof host_c), CUDA_SUCCESS);
        expect("copy_out_c_again", cuMemcpyDtoH(at_c, dc, sizeof at_c), CUDA_SUCCESS);
        expect("far_alias_shows_c", memcmp(host_c, at_c, sizeof at_c) == 0, 1);
        expect("unmap_far", cuMemUnmap(far, gran), CUDA_SUCCESS);
        expect("address_free_far", cuMemAddressFree(far, gran), CUDA_SUCCESS);
    }

    /* the handle behind an address, and the allocation's properties */
    expect("retain", cuMemRetainAllocationHandle(&retained, (void *)(fixed + 4096)),
           CUDA_SUCCESS);
    expect("retain_gives_the_mapped_handle", retained == ha, 1);
    expect("release_retained", cuMemRelease(retained), CUDA_SUCCESS);
    {
        CUmemAllocationProp got;
        memset(&got, 0xff, sizeof got);
        expect("properties", cuMemGetAllocationPropertiesFromHandle(&got, ha), CUDA_SUCCESS);
        expect("properties_type", got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
        expect("properties_location_type", got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
        expect("properties_location_id", got.location.id, 0);
        expect("properties_handle_types", got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
    }

    /* misuse */
    {
        CUmemAllocationProp bad = device_prop();
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;
        unsigned long long flags;
        CUmemLocation location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
        expect("create_size_not_granular", cuMemCreate(&h, gran + 4096, &prop, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("create_flags", cuMemCreate(&h, gran, &prop, 1), CUDA_ERROR_INVALID_VALUE);
        bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
        expect("create_type_invalid", cuMemCreate(&h, gran, &bad, 0), CUDA_ERROR_INVALID_VALUE);
        bad = device_prop();
        bad.location.id = 1;
        expect("create_other_device", cuMemCreate(&h, gran, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
        bad = device_prop();
        bad.location.type = CU_MEM_LOCATION_TYPE_INVALID;
        expect("create_location_invalid", cuMemCreate(&h, gran, &bad, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("granularity_location_invalid", cuMemGetAllocationGranularity(
                   (size_t *)&flags, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CUDA_ERROR_INVALID_VALUE);
        expect("granularity_bad_option", cuMemGetAllocationGranularity(
                   (size_t *)&flags, &prop, (CUmemAllocationGranularity_flags)7),
               CUDA_ERROR_INVALID_VALUE);
        expect("reserve_size_zero", cuMemAddressReserve(&p, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
        expect("reserve_alignment_not_power_of_two", cuMemAddressReserve(&p, gran, 3 * gran, 0, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("reserve_flags", cuMemAddressReserve(&p, gran, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
        expect("map_unknown_handle", cuMemMap(moved, gran, 0, 0x1234, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_overlapping", cuMemMap(first + gran, gran, 0, hd, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_past_the_allocation", cuMemMap(moved, 2 * gran, 0, hb, 0),
               CUDA_ERROR_INVALID_VALUE);
        /* the offset "currently must be zero"; NVIDIA's driver says so with this code */
        expect("map_at_an_offset", cuMemMap(moved, gran, gran, hd, 0),
               CUDA_ERROR_NOT_SUPPORTED);
        expect("map_misaligned", cuMemMap(moved + 4096, gran, 0, hb, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_size_not_granular", cuMemMap(moved, 4096, 0, hb, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_outside_reservations", cuMemMap(plain, gran, 0, hb, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_past_the_reservation", cuMemMap(first + 3 * gran, 2 * gran, 0, hd, 0),
               CUDA_ERROR_INVALID_VALUE);
        expect("map_flags", cuMemMap(moved, gran, 0, hb, 1), CUDA_ERROR_INVALID_VALUE);
        expect("map_d", cuMemMap(moved, 2 * gran, 0, hd, 0), CUDA_SUCCESS);
        expect("unmap_part_of_a_mapping", cuMemUnmap(first, gran / 2), CUDA_ERROR_INVALID_VALUE);
        expect("unmap_unmapped", cuMemUnmap(first + 3 * gran, gran), CUDA_ERROR_INVALID_VALUE);
        expect("set_access_unmapped", set_access(first + 3 * gran, gran,
                                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
               CUDA_ERROR_INVALID_VALUE);
        expect("set_access_bad_flags", set_access(first, gran, (CUmemAccess_flags)2),
               CUDA_ERROR_INVALID_VALUE);
        {
            CUmemAccessDesc desc = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
            desc.location.id = 1;
            expect("set_access_other_device", cuMemSetAccess(first, gran, &desc, 1),
                   CUDA_ERROR_INVALID_DEVICE);
            expect("set_access_no_descriptors", cuMemSetAccess(first, gran, &desc, 0),
                   CUDA_ERROR_INVALID_VALUE);
        }
        expect("get_access_unmapped", cuMemGetAccess(&flags, &location, first + 3 * gran),
               CUDA_ERROR_INVALID_VALUE);
        expect("get_access_mapped_not_accessible", cuMemGetAccess(&flags, &location, moved),
               CUDA_SUCCESS);
        expect("get_access_mapped_not_accessible_flags", (long long)flags,
               CU_MEM_ACCESS_FLAGS_PROT_NONE);
        expect("retain_unmapped", cuMemRetainAllocationHandle(&h, (void *)(first + 3 * gran)),
               CUDA_ERROR_INVALID_VALUE);
        expect("release_unknown", cuMemRelease(0x1234), CUDA_ERROR_INVALID_VALUE);
        expect("properties_unknown", cuMemGetAllocationPropertiesFromHandle(&bad, 0x1234),
               CUDA_ERROR_INVALID_VALUE);
        expect("free_mapped_with_cuMemFree", cuMemFree(first), CUDA_ERROR_INVALID_VALUE);
        expect("address_free_with_mappings", cuMemAddressFree(first, 4 * gran),
               CUDA_ERROR_INVALID_VALUE);
        expect("address_free_wrong_size", cuMemAddressFree(fixed, gran), CUDA_ERROR_INVALID_VALUE);
        expect("address_free_not_reserved", cuMemAddressFree(plain, gran),
               CUDA_ERROR_INVALID_VALUE);
    }

    /* releasing a handle frees nothing while it is mapped; the last unmap frees it */
    expect("release_a", cuMemRelease(ha), CUDA_SUCCESS);
    expect("properties_released", cuMemGetAllocationPropertiesFromHandle(&prop, ha),
           CUDA_ERROR_INVALID_VALUE);
    expect("map_released", cuMemMap(first + 3 * gran, gran, 0, ha, 0), CUDA_ERROR_INVALID_VALUE);
    expect("unmap_first_three", cuMemUnmap(first, 3 * gran), CUDA_SUCCESS);
    expect("copy_after_unmap", cuMemcpyHtoD(first, host_a, 16), CUDA_ERROR_INVALID_VALUE);
    expect("released_but_mapped_in_use", baseline - free_memory(), (long long)(5 * gran));
    expect("copy_out_alias_after_release", cuMemcpyDtoH(host_c, fixed, sizeof host_c),
           CUDA_SUCCESS);
    right = 1;
    for (int i = 0; i < N; i++) right &= host_c[i] == host_a[i] * 2.0f;
    expect("released_memory_keeps_its_bytes", right, 1);
    expect("unmap_alias", cuMemUnmap(fixed, gran), CUDA_SUCCESS);
    expect("freed_with_its_last_mapping", baseline - free_memory(), (long long)(4 * gran));

    /* everything goes */
    expect("unmap_d", cuMemUnmap(moved, 2 * gran), CUDA_SUCCESS);
    expect("release_b", cuMemRelease(hb), CUDA_SUCCESS);
    expect("release_c", cuMemRelease(hc), CUDA_SUCCESS);
    expect("release_d", cuMemRelease(hd), CUDA_SUCCESS);
    expect("release_twice", cuMemRelease(hd), CUDA_ERROR_INVALID_VALUE);
    expect("address_free_first", cuMemAddressFree(first, 4 * gran), CUDA_SUCCESS);
    expect("address_free_fixed", cuMemAddressFree(fixed, 2 * gran), CUDA_SUCCESS);
    expect("address_free_moved", cuMemAddressFree(moved, 2 * gran), CUDA_SUCCESS);
    expect("address_free_twice", cuMemAddressFree(moved, 2 * gran), CUDA_ERROR_INVALID_VALUE);
    expect("all_memory_back", baseline - free_memory(), 0);
    expect("free_plain", cuMemFree(plain), CUDA_SUCCESS);
    /* the range is free again: the fixed address can be had once more */
    expect("reserve_fixed_again", cuMemAddressReserve(&spare, 2 * gran, 0, wanted, 0),
           CUDA_SUCCESS);
    expect("reserve_fixed_again_honoured", spare == wanted, 1);
    expect("address_free_spare", cuMemAddressFree(spare, 2 * gran), CUDA_SUCCESS);
}

/* One allocation mapped in a reservation of its own, at `access` (none: left as mapped). */
static CUdeviceptr mapped(size_t gran, int access) {
    CUmemAllocationProp prop = device_prop();
    CUdeviceptr p;
    CUmemGenericAllocationHandle h;
    expect("reserve", cuMemAddressReserve(&p, gran, 0, 0, 0), CUDA_SUCCESS);
    expect("create", cuMemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
    expect("map", cuMemMap(p, gran, 0, h, 0), CUDA_SUCCESS);
    if (access) expect("set_access", set_access(p, gran, access), CUDA_SUCCESS);
    return p;
}

static void hold(CUfunction scale, size_t gran, const char *pause_file) {
    CUmemAllocationProp prop = device_prop();
    CUdeviceptr rw, ro, orphan;
    CUmemGenericAllocationHandle h, released, got;
    unsigned long long flags = 99;
    CUmemLocation location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    int n = N, right = 1;
    float two = 2.0f;
    for (int i = 0; i < N; i++) { host_a[i] = i * 0.5f; host_b[i] = 1000.0f - i; }
    expect("reserve_rw", cuMemAddressReserve(&rw, gran, 0, 0, 0), CUDA_SUCCESS);
    expect("reserve_ro", cuMemAddressReserve(&ro, gran, 0, 0, 0), CUDA_SUCCESS);
    expect("reserve_orphan_far", cuMemAddressReserve(&orphan, gran, 0, rw + (2ULL << 40), 0),
           CUDA_SUCCESS);
    expect("reserve_orphan_far_honoured", orphan == rw + (2ULL << 40), 1);
    expect("create", cuMemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
    expect("create_released", cuMemCreate(&released, gran, &prop, 0), CUDA_SUCCESS);
    expect("map_rw", cuMemMap(rw, gran, 0, h, 0), CUDA_SUCCESS);
    expect("map_ro", cuMemMap(ro, gran, 0, h, 0), CUDA_SUCCESS);
    expect("map_orphan", cuMemMap(orphan, gran, 0, released, 0), CUDA_SUCCESS);
    expect("access_rw", set_access(rw, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_SUCCESS);
    expect("access_ro", set_access(ro, gran, CU_MEM_ACCESS_FLAGS_PROT_READ), CUDA_SUCCESS);
    expect("access_orphan", set_access(orphan, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
           CUDA_SUCCESS);
    expect("fill_rw", cuMemcpyHtoD(rw, host_a, sizeof host_a), CUDA_SUCCESS);
    expect("fill_orphan", cuMemcpyHtoD(orphan, host_b, sizeof host_b), CUDA_SUCCESS);
    expect("release_mapped", cuMemRelease(released), CUDA_SUCCESS);
    expect("synchronize", cuCtxSynchronize(), CUDA_SUCCESS);
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    while (access(pause_file, F_OK) == 0) usleep(20000);

    expect("read_only_alias_kept", cuMemcpyDtoH(host_c, ro, sizeof host_c), CUDA_SUCCESS);
    expect("read_only_alias_shows_a", memcmp(host_c, host_a, sizeof host_a) == 0, 1);
    void *scale_args[] = {&rw, &two, &n};
    expect("scale_rw", launch(scale, scale_args, N), CUDA_SUCCESS);
    expect("read_alias_after_scale", cuMemcpyDtoH(host_c, ro, sizeof host_c), CUDA_SUCCESS);
    for (int i = 0; i < N; i++) right &= host_c[i] == host_a[i] * 2.0f;
    expect("still_one_allocation_at_two_addresses", right, 1);
    expect("get_access_ro", cuMemGetAccess(&flags, &location, ro), CUDA_SUCCESS);
    expect("access_ro_kept", (long long)flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
    expect("read_orphan", cuMemcpyDtoH(host_c, orphan, sizeof host_c), CUDA_SUCCESS);
    expect("released_memory_kept", memcmp(host_c, host_b, sizeof host_b) == 0, 1);
    expect("retain_orphan", cuMemRetainAllocationHandle(&got, (void *)orphan), CUDA_SUCCESS);
    expect("retain_orphan_handle", got == released, 1);
    expect("release_orphan", cuMemRelease(got), CUDA_SUCCESS);
    expect("unmap_all", cuMemUnmap(rw, gran) | cuMemUnmap(ro, gran) | cuMemUnmap(orphan, gran),
           CUDA_SUCCESS);
    expect("release", cuMemRelease(h), CUDA_SUCCESS);
    expect("free_all", cuMemAddressFree(rw, gran) | cuMemAddressFree(ro, gran) |
           cuMemAddressFree(orphan, gran), CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction vadd, scale;
    int supported = 0, n = N;
    float two = 2.0f;
    size_t gran = 0, recommended = 0;
    const char *mode = argc > 2 ? argv[2] : "api";
    char *ptx = read_file(argc > 1 ? argv[1] : "kernels.ptx");
    if (!ptx) { fprintf(stderr, "cannot read the PTX\n"); return 2; }

    expect("init", cuInit(0), CUDA_SUCCESS);
    cuDeviceGet(&dev, 0);
    cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    expect("vmm_supported", supported, 1);
    expect("context", cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    expect("module", cuModuleLoadData(&mod, ptx), CUDA_SUCCESS);
    cuModuleGetFunction(&vadd, mod, "vadd");
    cuModuleGetFunction(&scale, mod, "scale");
    {
        CUmemAllocationProp prop = device_prop();
        expect("granularity", cuMemGetAllocationGranularity(&gran, &prop,
                                                            CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CUDA_SUCCESS);
        expect("granularity_is_2_MiB", (long long)gran, 2 << 20);
        cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        expect("recommended_granularity_is_2_MiB", (long long)recommended, 2 << 20);
    }

    if (strcmp(mode, "api") == 0) {
        api(vadd, scale, gran);
    } else if (strcmp(mode, "copy-without-access") == 0) {
        CUdeviceptr p = mapped(gran, 0);
        /* A copy from pageable memory may return before it runs: it faults then, or at
         * the next synchronization, as on a GPU */
        CUresult rc = cuMemcpyHtoD(p, host_a, sizeof host_a);
        expect("copy_returns", rc == CUDA_SUCCESS || rc == CUDA_ERROR_ILLEGAL_ADDRESS, 1);
        expect("copy_faults", cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        expect("context_lost", cuMemcpyDtoH(host_c, p, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
    } else if (strcmp(mode, "kernel-without-access") == 0) {
        CUdeviceptr p = mapped(gran, 0), out = mapped(gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        void *args[] = {&p, &p, &out, &n};
        expect("kernel_faults", launch(vadd, args, N), CUDA_ERROR_ILLEGAL_ADDRESS);
    } else if (strcmp(mode, "write-read-only") == 0) {
        CUdeviceptr p = mapped(gran, CU_MEM_ACCESS_FLAGS_PROT_READ);
        CUdeviceptr out = mapped(gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        void *vadd_args[] = {&p, &p, &out, &n};
        expect("copy_out_read_only", cuMemcpyDtoH(host_c, p, sizeof host_c), CUDA_SUCCESS);
        expect("kernel_reads_read_only", launch(vadd, vadd_args, N), CUDA_SUCCESS);
        void *scale_args[] = {&p, &two, &n};
        expect("kernel_writing_faults", launch(scale, scale_args, N), CUDA_ERROR_ILLEGAL_ADDRESS);
    } else if (strcmp(mode, "hold") == 0 && argc > 3) {
        hold(scale, gran, argv[3]);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("failures %d\n", failures);
    return failures != 0;
}
