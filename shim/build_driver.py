"""cffi builder of the driver shim: the extension `vgpu.shim._libcuda`, loaded as libcuda.so.1.

Used by setup.py (`cffi_modules`); see shim_builder.py for what all shims share. Besides the
generated stubs, its C answers cuGetProcAddress, cuGetErrorName/String and cuGetExportTable
(the private tables NVIDIA's runtime uses) without Python (shim/c/driver_*.c).
"""

import runpy
from pathlib import Path

__all__ = ["ffibuilder"]

_make_ffibuilder = runpy.run_path(str(Path(__file__).with_name("shim_builder.py")))[
    "make_ffibuilder"]

ffibuilder = _make_ffibuilder(
    library="libcuda",
    soname="libcuda.so.1",
    prefix="driver",
    types_header="cuda_types.h",
    sources=["generated/driver_stubs.c", "generated/driver_tables.c", "c/driver_dispatch.c",
             "c/driver_proc_address.c", "c/driver_errors.c",
             "c/driver_export_table.c", "c/driver_export_slots.c", "c/driver_integrity.c",
             "c/driver_context_storage.c", "c/driver_goodbye.c"],
    # A context going: NVIDIA's runtime's context-local storage is released with it; and
    # whether NVIDIA's runtime is the one calling (it expects some errors in its own codes).
    cdef="void vgpu_context_storage_release(void *ctx);\n"
         "int vgpu_nvidia_runtime_attached(void);\n",
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
