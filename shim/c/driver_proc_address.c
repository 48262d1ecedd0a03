/* cuGetProcAddress, answered from the generated table without Python, as the real driver
   answers it: for a base name ("cuMemAlloc"), the variant that was current at the requested
   CUDA version (cuMemAlloc_v2 from 3020 on), and the per-thread default stream variant
   (_ptds/_ptsz) when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is asked for and one
   exists. cuda-python resolves every driver function this way. */
#include <string.h>

#include "driver_shim.h"

/* The first entry whose base is `name`, or NULL (entries are sorted by base, strcmp). */
static const struct vgpu_proc_entry *first_entry(const char *name)
{
    size_t low = 0, high = vgpu_driver_proc_entry_count;

    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (strcmp(vgpu_driver_proc_entries[middle].base, name) < 0)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < vgpu_driver_proc_entry_count && strcmp(vgpu_driver_proc_entries[low].base, name) == 0)
        return &vgpu_driver_proc_entries[low];
    return NULL;
}

static CUresult look_up(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    const struct vgpu_proc_entry *entry, *end = vgpu_driver_proc_entries + vgpu_driver_proc_entry_count;
    const struct vgpu_proc_entry *best = NULL;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;

    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    entry = first_entry(symbol);
    if (entry == NULL) {
        if (status != NULL)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    for (; entry < end && strcmp(entry->base, symbol) == 0; entry++) {
        if (entry->version > cudaVersion || (entry->flavour == VGPU_FLAVOUR_PER_THREAD && !per_thread))
            continue;
        /* Newest version wins; at equal versions the per-thread variant, when asked for. */
        if (best == NULL || entry->version > best->version
            || (entry->version == best->version && entry->flavour > best->flavour))
            best = entry;
    }
    if (best == NULL) {
        if (status != NULL)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->function;
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return look_up(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return look_up(symbol, pfn, cudaVersion, flags, NULL);
}
