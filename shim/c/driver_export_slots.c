/* The driver's private tables that NVIDIA's CUDA runtime asks for (cuGetExportTable), with
   what each slot does where the runtime depends on it. The runtime (libcudart_static.a, linked
   into nvcc's default builds, cuda-python's cuda.bindings.runtime and CuPy) reaches the
   driver through these besides the public API; vgpu answers each slot with the public API
   it stands for.

   What is known of the tables (UUIDs, sizes, slots) was learnt from ZLUDA's documentation of
   them (github vosen/ZLUDA, dark_api/src/lib.rs) and from watching NVIDIA's runtime call them
   (VGPU_TRACE=1 prints every table asked for and every slot called). A slot whose behaviour is
   unknown is refused: it names its table and index on stderr, once, and fails with
   CUDA_ERROR_NOT_SUPPORTED, so a runtime that needs it says so instead of misbehaving. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "driver_export_tables.h"

/* Slot 0 of most tables: the table's size in bytes. */
#define TABLE_SIZE(count) ((const void *)(uintptr_t)((count) * sizeof(void *)))

#define CUDART_INTERFACE_ID \
    {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}
#define TOOLS_TLS_ID \
    {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}
#define TOOLS_CALLBACK_HOOKS_ID \
    {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}
#define CONTEXT_STORAGE_ID \
    {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}
#define INTEGRITY_CHECK_ID \
    {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}
#define TOOLS_CONTEXT_ID \
    {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}
#define CONTEXT_CHECKS_ID \
    {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}

enum {
    CUDART_INTERFACE_SLOTS = 13,
    TOOLS_TLS_SLOTS = 4,
    TOOLS_CALLBACK_HOOKS_SLOTS = 7,
    CONTEXT_STORAGE_SLOTS = 4,
    INTEGRITY_CHECK_SLOTS = 3,
    CONTEXT_CHECKS_SLOTS = 4,
    TOOLS_CONTEXT_SLOTS = 95,
};

static void refuse(const char *table, const unsigned char id[16], int index, const void *caller)
{
    char text[37];
    Dl_info info;
    const char *who = "a caller";

    if (dladdr(caller, &info) != 0 && info.dli_fname != NULL && info.dli_fname[0] != '\0')
        who = info.dli_fname;
    vgpu_uuid_text(id, text);
    fprintf(stderr, "vgpu: %s called slot %d of the driver's private table %s {%s}, which "
            "vgpu cannot reproduce; the call fails (CUDA_ERROR_NOT_SUPPORTED).\n",
            who, index, table, text);
    fflush(stderr);
}

/* A slot nobody has seen used: refused, said once. */
#define REFUSED_SLOT(table, index)                                                          \
    static CUresult table##_refused_##index(void)                                            \
    {                                                                                       \
        static atomic_flag said = ATOMIC_FLAG_INIT;                                         \
        static const unsigned char id[16] = table##_ID;                                     \
        if (!atomic_flag_test_and_set(&said) || vgpu_export_tracing())                      \
            refuse(#table, id, index, __builtin_return_address(0));                         \
        return CUDA_ERROR_NOT_SUPPORTED;                                                    \
    }

static CUresult traced(const char *what, CUresult rc)
{
    if (vgpu_export_tracing())
        fprintf(stderr, "vgpu trace: export table %s -> %d\n", what, (int)rc);
    return rc;
}

/* ------------------------------------------------------------------ CUDART_INTERFACE */

/* A module from the fatbin wrapper nvcc's code registers (__fatBinC_Wrapper_t), loaded into
   the current context: cuModuleLoadData takes the wrapper as it is. */
static CUresult module_from_wrapper(CUmodule *module, const void *wrapper)
{
    if (module == NULL || wrapper == NULL)
        return traced("CUDART_INTERFACE[1] module from fatbin", CUDA_ERROR_INVALID_VALUE);
    return traced("CUDART_INTERFACE[1] module from fatbin", cuModuleLoadData(module, wrapper));
}

/* The device's primary context, retained (the runtime's context for the device). */
static CUresult primary_context(CUcontext *ctx, CUdevice dev)
{
    return traced("CUDART_INTERFACE[2] primary context", cuDevicePrimaryCtxRetain(ctx, dev));
}

/* As slot 1, with three more arguments that the runtime passes as NULL, NULL, 0; others are
   refused rather than ignored, as their meaning is unknown. */
static CUresult module_from_wrapper_ext(CUmodule *module, const void *wrapper, void *arg3,
                                        void *arg4, unsigned int arg5)
{
    if (arg3 != NULL || arg4 != NULL || arg5 != 0)
        return traced("CUDART_INTERFACE[6] module from fatbin (options)",
                      CUDA_ERROR_NOT_SUPPORTED);
    if (module == NULL || wrapper == NULL)
        return traced("CUDART_INTERFACE[6] module from fatbin", CUDA_ERROR_INVALID_VALUE);
    return traced("CUDART_INTERFACE[6] module from fatbin", cuModuleLoadData(module, wrapper));
}

/* Called with one word; nothing for vgpu to do. */
static void cudart_notice(uintptr_t value)
{
    (void)value;
    traced("CUDART_INTERFACE[7] notice", CUDA_SUCCESS);
}

/* As slot 6, from the fatbin container itself (the wrapper's data). */
static CUresult module_from_fatbin_ext(const void *fatbin, CUmodule *module, void *arg3,
                                       void *arg4, unsigned int arg5)
{
    if (arg3 != NULL || arg4 != NULL || arg5 != 0)
        return traced("CUDART_INTERFACE[8] module from fatbin (options)",
                      CUDA_ERROR_NOT_SUPPORTED);
    if (module == NULL || fatbin == NULL)
        return traced("CUDART_INTERFACE[8] module from fatbin", CUDA_ERROR_INVALID_VALUE);
    return traced("CUDART_INTERFACE[8] module from fatbin", cuModuleLoadData(module, fatbin));
}

/* NVIDIA's driver loads its JIT compilers here; vgpu's server compiles. */
static CUresult load_compilers(void)
{
    return traced("CUDART_INTERFACE[12] load compilers", CUDA_SUCCESS);
}

REFUSED_SLOT(CUDART_INTERFACE, 3)
REFUSED_SLOT(CUDART_INTERFACE, 4)
REFUSED_SLOT(CUDART_INTERFACE, 5)
REFUSED_SLOT(CUDART_INTERFACE, 9)
REFUSED_SLOT(CUDART_INTERFACE, 10)
REFUSED_SLOT(CUDART_INTERFACE, 11)

static const void *const cudart_interface[CUDART_INTERFACE_SLOTS] = {
    TABLE_SIZE(CUDART_INTERFACE_SLOTS),
    (const void *)module_from_wrapper,
    (const void *)primary_context,
    (const void *)CUDART_INTERFACE_refused_3,
    (const void *)CUDART_INTERFACE_refused_4,
    (const void *)CUDART_INTERFACE_refused_5,
    (const void *)module_from_wrapper_ext,
    (const void *)cudart_notice,
    (const void *)module_from_fatbin_ext,
    (const void *)CUDART_INTERFACE_refused_9,
    (const void *)CUDART_INTERFACE_refused_10,
    (const void *)CUDART_INTERFACE_refused_11,
    (const void *)load_compilers,
};

/* ------------------------------------------------------------------ TOOLS_TLS */

REFUSED_SLOT(TOOLS_TLS, 1)
REFUSED_SLOT(TOOLS_TLS, 2)
REFUSED_SLOT(TOOLS_TLS, 3)

static const void *const tools_tls[TOOLS_TLS_SLOTS] = {
    TABLE_SIZE(TOOLS_TLS_SLOTS),
    (const void *)TOOLS_TLS_refused_1,
    (const void *)TOOLS_TLS_refused_2,
    (const void *)TOOLS_TLS_refused_3,
};

/* ------------------------------------------------------------------ TOOLS_CALLBACK_HOOKS */

/* Two buffers the runtime asks for (by address and size) and keeps its tools' callback
   state in; they are the runtime's to fill. */
static unsigned char hooks_buffer[1024], hooks_small_buffer[14];

static void hooks_storage(void **buffer, size_t *size)
{
    *buffer = hooks_buffer;
    *size = sizeof hooks_buffer;
    traced("TOOLS_CALLBACK_HOOKS[2] buffer", CUDA_SUCCESS);
}

static void hooks_small_storage(void **buffer, size_t *size)
{
    *buffer = hooks_small_buffer;
    *size = sizeof hooks_small_buffer;
    traced("TOOLS_CALLBACK_HOOKS[6] buffer", CUDA_SUCCESS);
}

REFUSED_SLOT(TOOLS_CALLBACK_HOOKS, 1)
REFUSED_SLOT(TOOLS_CALLBACK_HOOKS, 3)
REFUSED_SLOT(TOOLS_CALLBACK_HOOKS, 4)
REFUSED_SLOT(TOOLS_CALLBACK_HOOKS, 5)

static const void *const tools_callback_hooks[TOOLS_CALLBACK_HOOKS_SLOTS] = {
    TABLE_SIZE(TOOLS_CALLBACK_HOOKS_SLOTS),
    (const void *)TOOLS_CALLBACK_HOOKS_refused_1,
    (const void *)hooks_storage,
    (const void *)TOOLS_CALLBACK_HOOKS_refused_3,
    (const void *)TOOLS_CALLBACK_HOOKS_refused_4,
    (const void *)TOOLS_CALLBACK_HOOKS_refused_5,
    (const void *)hooks_small_storage,
};

/* ------------------------------------------------------------------ CONTEXT_STORAGE */

static CUresult storage_put(CUcontext ctx, void *key, void *value,
                            vgpu_storage_destructor destructor)
{
    return traced("CONTEXT_STORAGE[0] put",
                  vgpu_context_storage_put(ctx, key, value, destructor));
}

static CUresult storage_delete(CUcontext ctx, void *key)
{
    return traced("CONTEXT_STORAGE[1] delete", vgpu_context_storage_delete(ctx, key));
}

static CUresult storage_get(void **value, CUcontext ctx, void *key)
{
    return traced("CONTEXT_STORAGE[2] get", vgpu_context_storage_get(value, ctx, key));
}

REFUSED_SLOT(CONTEXT_STORAGE, 3)

/* This table has no size slot. */
static const void *const context_storage[CONTEXT_STORAGE_SLOTS] = {
    (const void *)storage_put,
    (const void *)storage_delete,
    (const void *)storage_get,
    (const void *)CONTEXT_STORAGE_refused_3,
};

/* ------------------------------------------------------------------ INTEGRITY_CHECK */

static const void *const integrity_check[INTEGRITY_CHECK_SLOTS];

static CUresult integrity_answer(uint32_t runtime_value, uint64_t unix_seconds,
                                 uint64_t result[2])
{
    return traced("INTEGRITY_CHECK[1] answer",
                  vgpu_integrity_answer(runtime_value, unix_seconds, cudart_interface,
                                        integrity_check, integrity_check[1], result));
}

REFUSED_SLOT(INTEGRITY_CHECK, 2)

static const void *const integrity_check[INTEGRITY_CHECK_SLOTS] = {
    TABLE_SIZE(INTEGRITY_CHECK_SLOTS),
    (const void *)integrity_answer,
    (const void *)INTEGRITY_CHECK_refused_2,
};

/* ------------------------------------------------------------------ CONTEXT_CHECKS */

/* Asked about a context: vgpu's contexts have none of the conditions it reports. */
static CUresult context_check(CUcontext ctx, uint32_t *condition, const void **detail)
{
    (void)ctx;
    (void)detail;
    if (condition != NULL)
        *condition = 0;
    return traced("CONTEXT_CHECKS[2] check", CUDA_SUCCESS);
}

static uint32_t context_check_flags(void)
{
    traced("CONTEXT_CHECKS[3] flags", CUDA_SUCCESS);
    return 0;
}

REFUSED_SLOT(CONTEXT_CHECKS, 1)

static const void *const context_checks[CONTEXT_CHECKS_SLOTS] = {
    TABLE_SIZE(CONTEXT_CHECKS_SLOTS),
    (const void *)CONTEXT_CHECKS_refused_1,
    (const void *)context_check,
    (const void *)context_check_flags,
};

/* ------------------------------------------------------------------ TOOLS_CONTEXT */

/* Asked for by newer 13.x runtimes (cuda-python's), which have not been seen calling any of
   its 94 slots: every one is refused. */
#define REFUSED_TEN(table, tens)                                                            \
    REFUSED_SLOT(table, tens##0) REFUSED_SLOT(table, tens##1) REFUSED_SLOT(table, tens##2)  \
    REFUSED_SLOT(table, tens##3) REFUSED_SLOT(table, tens##4) REFUSED_SLOT(table, tens##5)  \
    REFUSED_SLOT(table, tens##6) REFUSED_SLOT(table, tens##7) REFUSED_SLOT(table, tens##8)  \
    REFUSED_SLOT(table, tens##9)
#define SLOT_TEN(table, tens)                                                               \
    (const void *)table##_refused_##tens##0, (const void *)table##_refused_##tens##1,        \
    (const void *)table##_refused_##tens##2, (const void *)table##_refused_##tens##3,        \
    (const void *)table##_refused_##tens##4, (const void *)table##_refused_##tens##5,        \
    (const void *)table##_refused_##tens##6, (const void *)table##_refused_##tens##7,        \
    (const void *)table##_refused_##tens##8, (const void *)table##_refused_##tens##9

REFUSED_SLOT(TOOLS_CONTEXT, 1)
REFUSED_SLOT(TOOLS_CONTEXT, 2)
REFUSED_SLOT(TOOLS_CONTEXT, 3)
REFUSED_SLOT(TOOLS_CONTEXT, 4)
REFUSED_SLOT(TOOLS_CONTEXT, 5)
REFUSED_SLOT(TOOLS_CONTEXT, 6)
REFUSED_SLOT(TOOLS_CONTEXT, 7)
REFUSED_SLOT(TOOLS_CONTEXT, 8)
REFUSED_SLOT(TOOLS_CONTEXT, 9)
REFUSED_TEN(TOOLS_CONTEXT, 1)
REFUSED_TEN(TOOLS_CONTEXT, 2)
REFUSED_TEN(TOOLS_CONTEXT, 3)
REFUSED_TEN(TOOLS_CONTEXT, 4)
REFUSED_TEN(TOOLS_CONTEXT, 5)
REFUSED_TEN(TOOLS_CONTEXT, 6)
REFUSED_TEN(TOOLS_CONTEXT, 7)
REFUSED_TEN(TOOLS_CONTEXT, 8)
REFUSED_SLOT(TOOLS_CONTEXT, 90)
REFUSED_SLOT(TOOLS_CONTEXT, 91)
REFUSED_SLOT(TOOLS_CONTEXT, 92)
REFUSED_SLOT(TOOLS_CONTEXT, 93)
REFUSED_SLOT(TOOLS_CONTEXT, 94)

static const void *const tools_context[TOOLS_CONTEXT_SLOTS] = {
    TABLE_SIZE(TOOLS_CONTEXT_SLOTS),
    (const void *)TOOLS_CONTEXT_refused_1, (const void *)TOOLS_CONTEXT_refused_2,
    (const void *)TOOLS_CONTEXT_refused_3, (const void *)TOOLS_CONTEXT_refused_4,
    (const void *)TOOLS_CONTEXT_refused_5, (const void *)TOOLS_CONTEXT_refused_6,
    (const void *)TOOLS_CONTEXT_refused_7, (const void *)TOOLS_CONTEXT_refused_8,
    (const void *)TOOLS_CONTEXT_refused_9,
    SLOT_TEN(TOOLS_CONTEXT, 1), SLOT_TEN(TOOLS_CONTEXT, 2), SLOT_TEN(TOOLS_CONTEXT, 3),
    SLOT_TEN(TOOLS_CONTEXT, 4), SLOT_TEN(TOOLS_CONTEXT, 5), SLOT_TEN(TOOLS_CONTEXT, 6),
    SLOT_TEN(TOOLS_CONTEXT, 7), SLOT_TEN(TOOLS_CONTEXT, 8),
    (const void *)TOOLS_CONTEXT_refused_90, (const void *)TOOLS_CONTEXT_refused_91,
    (const void *)TOOLS_CONTEXT_refused_92, (const void *)TOOLS_CONTEXT_refused_93,
    (const void *)TOOLS_CONTEXT_refused_94,
};

/* ------------------------------------------------------------------ the list */

const struct vgpu_export_table vgpu_export_tables[] = {
    {"CUDART_INTERFACE", CUDART_INTERFACE_ID, cudart_interface, CUDART_INTERFACE_SLOTS},
    {"TOOLS_TLS", TOOLS_TLS_ID, tools_tls, TOOLS_TLS_SLOTS},
    {"TOOLS_CALLBACK_HOOKS", TOOLS_CALLBACK_HOOKS_ID, tools_callback_hooks,
     TOOLS_CALLBACK_HOOKS_SLOTS},
    {"CONTEXT_STORAGE", CONTEXT_STORAGE_ID, context_storage, CONTEXT_STORAGE_SLOTS},
    {"INTEGRITY_CHECK", INTEGRITY_CHECK_ID, integrity_check, INTEGRITY_CHECK_SLOTS},
    {"CONTEXT_CHECKS", CONTEXT_CHECKS_ID, context_checks, CONTEXT_CHECKS_SLOTS},
    {"TOOLS_CONTEXT", TOOLS_CONTEXT_ID, tools_context, TOOLS_CONTEXT_SLOTS},
};
const size_t vgpu_export_table_count = sizeof vgpu_export_tables / sizeof vgpu_export_tables[0];

const struct vgpu_export_table *vgpu_export_table_find(const CUuuid *id)
{
    size_t i;

    for (i = 0; i < vgpu_export_table_count; i++)
        if (memcmp(vgpu_export_tables[i].id, id->bytes, 16) == 0)
            return &vgpu_export_tables[i];
    return NULL;
}
