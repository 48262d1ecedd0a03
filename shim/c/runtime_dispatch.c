/* The gate every generated runtime stub passes: the embedded runtime must be up (and booted:
   every callback attached) before a stub calls its Python callback. If it cannot start,
   calls fail with cudaErrorInitializationError (reported once, on stderr). */
#include <dlfcn.h>
#include <stdio.h>

#include "runtime_shim.h"
#include "embedded_python.h"

/* Defined in the cffi module (shim/shim_builder.py). */
int vgpu_cffi_start(void);
int vgpu_boot(char *error, size_t size);

/* The runtime is built on the driver, and both shims embed one interpreter. The driver shim
   is made to start it first: two shims initializing Python at once from two threads would
   race, and its own start serializes. NVIDIA's cudart loads libcuda.so.1 the same way. */
static int start_driver(char *why, size_t size)
{
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    int (*driver_get_version)(int *);
    int version = 0;

    if (libcuda == NULL) {
        snprintf(why, size, "cannot load libcuda.so.1: %s", dlerror());
        return 0;
    }
    driver_get_version = (int (*)(int *))dlsym(libcuda, "cuDriverGetVersion");
    if (driver_get_version == NULL) {
        snprintf(why, size, "libcuda.so.1 has no cuDriverGetVersion");
        return 0;
    }
    if (driver_get_version(&version) == 3) { /* CUDA_ERROR_NOT_INITIALIZED */
        why[0] = '\0'; /* the driver shim has said why, in the one line the user needs */
        return 0;
    }
    return 1;
}

static const struct vgpu_embedding runtime_embedding = {
    "CUDA runtime", start_driver, vgpu_cffi_start, vgpu_boot,
};

int vgpu_runtime_ready(void)
{
    return vgpu_embedded_python_ready(&runtime_embedding);
}

int vgpu_runtime_gone(void)
{
    return vgpu_embedded_python_gone();
}

void *vgpu_runtime_entry(int fn_id)
{
    if (fn_id < 0 || (size_t)fn_id >= vgpu_runtime_symbol_count)
        return NULL;
    return vgpu_runtime_entries[fn_id];
}

const char *vgpu_runtime_symbol_name(int fn_id)
{
    if (fn_id < 0 || (size_t)fn_id >= vgpu_runtime_symbol_count)
        return NULL;
    return vgpu_runtime_symbols[fn_id];
}
