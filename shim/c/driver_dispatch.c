/* The gate every generated stub passes: the embedded runtime must be up (and booted: every
   callback attached) before a stub calls its Python callback. If the runtime cannot start,
   the stubs return CUDA_ERROR_NOT_INITIALIZED (the failure was reported once, on stderr). */
#include "driver_shim.h"
#include "embedded_python.h"

/* Defined in the cffi module (shim/shim_builder.py). */
int vgpu_cffi_start(void);
int vgpu_boot(char *error, size_t size);

static const struct vgpu_embedding driver_embedding = {"CUDA", NULL, vgpu_cffi_start, vgpu_boot};

int vgpu_driver_ready(void)
{
    return vgpu_embedded_python_ready(&driver_embedding);
}

int vgpu_driver_gone(void)
{
    return vgpu_embedded_python_gone();
}

void *vgpu_driver_entry(int fn_id)
{
    if (fn_id < 0 || (size_t)fn_id >= vgpu_driver_symbol_count)
        return NULL;
    return vgpu_driver_entries[fn_id];
}

const char *vgpu_driver_symbol_name(int fn_id)
{
    if (fn_id < 0 || (size_t)fn_id >= vgpu_driver_symbol_count)
        return NULL;
    return vgpu_driver_symbols[fn_id];
}
