/* Declarations shared by the driver shim's C files (hand-written and generated). */
#ifndef VGPU_DRIVER_SHIM_H
#define VGPU_DRIVER_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "embedded_python.h" /* vgpu_set_aside_exception */
#include "foreign_types.h"
#include "cuda_types.h"
#include "driver_functions.h" /* rendered by the build from the API table (shim_builder.py) */

/* Which default stream a cuGetProcAddress answer serves: the legacy one, or the
   per-thread one (symbols suffixed _ptds / _ptsz). */
enum vgpu_flavour { VGPU_FLAVOUR_LEGACY = 0, VGPU_FLAVOUR_PER_THREAD = 1 };

/* `function` answers `base` from CUDA `version` on, in `flavour`. */
struct vgpu_proc_entry {
    const char *base;
    int version;
    int flavour;
    void *function;
};

struct vgpu_result_text {
    int value;
    const char *name; /* CUDA_ERROR_INVALID_VALUE */
    const char *text; /* cuGetErrorString's answer */
};

/* Generated tables (driver_tables.c). */
extern const size_t vgpu_driver_symbol_count;
extern const char *const vgpu_driver_symbols[];    /* by fn_id */
extern void *const vgpu_driver_entries[];          /* by fn_id */
extern const size_t vgpu_driver_proc_entry_count;
extern const struct vgpu_proc_entry vgpu_driver_proc_entries[];
extern const size_t vgpu_driver_result_count;
extern const struct vgpu_result_text vgpu_driver_results[];

/* Every generated stub asks this first: 1 once the embedded runtime is up and every Python
   callback attached (starting it on the first call), 0 if it cannot start. */
int vgpu_driver_ready(void);

/* Not ready because the program is exiting (see vgpu_embedded_python_gone): the stub then
   returns CUDA_SUCCESS for a call that releases something (the session's end frees it all)
   and CUDA_ERROR_DEINITIALIZED, the driver shutting down, for any other. */
int vgpu_driver_gone(void);

/* For Python (declared in the cffi cdef too): the stub of `fn_id`, or NULL. */
void *vgpu_driver_entry(int fn_id);
const char *vgpu_driver_symbol_name(int fn_id);

#endif
