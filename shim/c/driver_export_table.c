/* cuGetExportTable: NVIDIA's private driver tables, found by UUID. The tables NVIDIA's CUDA
   runtime needs are built in driver_export_slots.c. Any other is refused with
   CUDA_ERROR_NOT_SUPPORTED; the refusal is said once on stderr, naming the table and who
   asked (from the caller's return address, dladdr), except to callers known to manage
   without theirs: NVIDIA's compiler libraries (NVRTC, nvJitLink, ...), which ask for their
   own reasons, and tables the runtime asks for first and does without. VGPU_TRACE=1 prints
   every question and its answer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_export_tables.h"

/* Libraries of the CUDA toolkit that ask for tables vgpu lacks and manage without them. */
static const char *const quiet_libraries[] = {"libnvrtc", "libnvJitLink", "libnvptxcompiler",
                                              "libnvvm", "libnvfatbin"};

/* Tables NVIDIA's runtime asks for and does without when refused. */
static const unsigned char declined_tables[][16] = {
    /* asked for before cuInit; the runtime goes on to the tables it needs */
    {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d,
     0xd9},
};

int vgpu_export_tracing(void)
{
    static int tracing = -1;

    if (tracing < 0) {
        const char *value = getenv("VGPU_TRACE");
        tracing = value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
    }
    return tracing;
}

void vgpu_uuid_text(const unsigned char id[16], char text[37])
{
    static const int dashes_after[] = {3, 5, 7, 9};
    size_t i, d = 0, pos = 0;

    for (i = 0; i < 16; i++) {
        pos += (size_t)snprintf(text + pos, 37 - pos, "%02x", id[i]);
        if (d < 4 && (int)i == dashes_after[d]) {
            text[pos++] = '-';
            d++;
        }
    }
    text[pos] = '\0';
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static int quiet(const unsigned char id[16], const char *path)
{
    size_t i;

    for (i = 0; i < sizeof declined_tables / sizeof declined_tables[0]; i++)
        if (memcmp(declined_tables[i], id, 16) == 0)
            return 1;
    for (i = 0; i < sizeof quiet_libraries / sizeof quiet_libraries[0]; i++)
        if (strncmp(base_name(path), quiet_libraries[i], strlen(quiet_libraries[i])) == 0)
            return 1;
    return 0;
}

static void explain(const unsigned char id[16], const void *caller)
{
    static atomic_flag explained = ATOMIC_FLAG_INIT;
    Dl_info info;
    const char *path = "the program";
    char text[37];

    if (dladdr(caller, &info) != 0 && info.dli_fname != NULL && info.dli_fname[0] != '\0')
        path = info.dli_fname;
    if (quiet(id, path) || atomic_flag_test_and_set(&explained))
        return;
    vgpu_uuid_text(id, text);
    fprintf(stderr, "vgpu: %s asked for the driver's private table {%s}, which vgpu does not "
            "provide; the call fails.\n", path, text);
    fflush(stderr);
}

static atomic_int nvidia_runtime_attached;

/* For Python (declared in the driver's cffi cdef): 1 once NVIDIA's runtime has taken its
   interface table, so this process's runtime calls go through NVIDIA's runtime. */
int vgpu_nvidia_runtime_attached(void)
{
    return atomic_load(&nvidia_runtime_attached);
}

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    const struct vgpu_export_table *table;
    char text[37];

    if (ppExportTable == NULL || pExportTableId == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    table = vgpu_export_table_find(pExportTableId);
    *ppExportTable = table != NULL ? table->slots : NULL;
    if (vgpu_export_tracing()) {
        vgpu_uuid_text((const unsigned char *)pExportTableId->bytes, text);
        fprintf(stderr, "vgpu trace: cuGetExportTable({%s}) -> %s\n", text,
                table != NULL ? table->name : "CUDA_ERROR_NOT_SUPPORTED");
    }
    if (table == vgpu_export_tables) /* the first: CUDART_INTERFACE */
        atomic_store(&nvidia_runtime_attached, 1);
    if (table != NULL)
        return CUDA_SUCCESS;
    explain((const unsigned char *)pExportTableId->bytes, __builtin_return_address(0));
    return CUDA_ERROR_NOT_SUPPORTED;
}
