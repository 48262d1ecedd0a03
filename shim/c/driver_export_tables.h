/* The driver's private tables (cuGetExportTable), shared by the C files that build them. */
#ifndef VGPU_DRIVER_EXPORT_TABLES_H
#define VGPU_DRIVER_EXPORT_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "driver_shim.h"

/* One table: an array of slots, found by its UUID. A slot holds a function, the table's
   size in bytes (slot 0 of most tables: callers check it before using later slots), or
   NULL where NVIDIA's driver is not known to fill it. */
struct vgpu_export_table {
    const char *name;      /* ours, for messages: NVIDIA publishes none */
    unsigned char id[16];  /* CUuuid bytes, in the order its text form writes them */
    const void *const *slots;
    size_t count;
};

extern const struct vgpu_export_table vgpu_export_tables[];
extern const size_t vgpu_export_table_count;

/* The table with this UUID, or NULL. */
const struct vgpu_export_table *vgpu_export_table_find(const CUuuid *id);

/* "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9" (37 bytes with the NUL). */
void vgpu_uuid_text(const unsigned char id[16], char text[37]);

/* 1 when VGPU_TRACE asks for every call to be printed. */
int vgpu_export_tracing(void);

/* Context-local storage (driver_context_storage.c): values a caller keeps per context, under
   its own keys, with a callback run when the context is destroyed or reset. */
typedef void (*vgpu_storage_destructor)(CUcontext ctx, void *key, void *value);
CUresult vgpu_context_storage_put(CUcontext ctx, void *key, void *value,
                                  vgpu_storage_destructor destructor);
CUresult vgpu_context_storage_delete(CUcontext ctx, void *key);
CUresult vgpu_context_storage_get(void **value, CUcontext ctx, void *key);

/* The driver's answer to the runtime's integrity check (driver_integrity.c): a keyed hash
   of what both sides know (versions, process and thread, the tables' addresses, the time the
   runtime chose, every device's UUID and PCI location). */
CUresult vgpu_integrity_answer(uint32_t runtime_value, uint64_t unix_seconds,
                               const void *cudart_table, const void *integrity_table,
                               const void *answering_function, uint64_t result[2]);

#endif
