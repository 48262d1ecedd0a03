/* Declarations shared by the runtime shim's C files (hand-written and generated). */
#ifndef VGPU_RUNTIME_SHIM_H
#define VGPU_RUNTIME_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "cudart_types.h"
#include "cudart_functions.h"

/* Generated tables (runtime_tables.c). */
extern const size_t vgpu_runtime_symbol_count;
extern const char *const vgpu_runtime_symbols[];   /* by fn_id */
extern void *const vgpu_runtime_entries[];         /* by fn_id */

/* Every generated stub calls this: starts the embedded runtime if needed, then runs the
   Python handler of `fn_id` with pointers to the call's arguments. A function returning
   something other than cudaError_t passes `result`, where Python stores its value; it keeps
   its zero initialization if the call cannot run. */
int vgpu_runtime_dispatch(int fn_id, void **args, void *result);

/* For Python (declared in the cffi cdef too): the stub of `fn_id`, or NULL. */
void *vgpu_runtime_entry(int fn_id);
const char *vgpu_runtime_symbol_name(int fn_id);

#endif
