/* The path every generated stub takes: make sure the embedded runtime is up, then let
   Python handle the call. If the runtime cannot start, the call fails with
   CUDA_ERROR_NOT_INITIALIZED (the failure was reported once, on stderr). */
#include "driver_shim.h"
#include "embedded_python.h"

/* Defined in the cffi module (shim/build_driver.py). */
int vgpu_cffi_start(void);
int vgpu_py_boot(char *error, size_t size);
int vgpu_py_dispatch(int fn_id, void **args, void *result);

static const struct vgpu_embedding driver_embedding = {"CUDA", NULL, vgpu_cffi_start, vgpu_py_boot};

int vgpu_driver_dispatch(int fn_id, void **args, void *result)
{
    if (!vgpu_embedded_python_ready(&driver_embedding))
        return CUDA_ERROR_NOT_INITIALIZED;
    return vgpu_py_dispatch(fn_id, args, result);
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
