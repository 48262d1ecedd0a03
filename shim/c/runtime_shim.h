/* Declarations shared by the runtime shim's C files (hand-written and generated). */
#ifndef VGPU_RUNTIME_SHIM_H
#define VGPU_RUNTIME_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "embedded_python.h" /* vgpu_set_aside_exception */
#include "foreign_types.h"
#include "cudart_types.h"
#include "runtime_functions.h" /* rendered by the build from the API table (shim_builder.py) */

/* Generated tables (runtime_tables.c). */
extern const size_t vgpu_runtime_symbol_count;
extern const char *const vgpu_runtime_symbols[];   /* by fn_id */
extern void *const vgpu_runtime_entries[];         /* by fn_id */

/* Every generated stub asks this first: 1 once the embedded runtime is up and every Python
   callback attached (starting the driver shim's, then its own, on the first call), 0 if it
   cannot start: the stub then returns cudaErrorInitializationError, or a zero result. */
int vgpu_runtime_ready(void);

/* Not ready because the program is exiting: cudaSuccess for a call that releases something,
   cudaErrorCudartUnloading for any other (see vgpu_driver_gone). */
int vgpu_runtime_gone(void);

/* For Python (declared in the cffi cdef too): the stub of `fn_id`, or NULL. */
void *vgpu_runtime_entry(int fn_id);
const char *vgpu_runtime_symbol_name(int fn_id);

#endif
