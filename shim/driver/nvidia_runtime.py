"""What differs when NVIDIA's own runtime is the caller (a program carrying it statically,
cuda-python's cuda.bindings.runtime, CuPy): it reaches the driver through the private tables
of shim/c/driver_export_slots.c, and takes their interface table first."""

from __future__ import annotations

from .._libcuda import lib


def under_nvidia_runtime(driver_code: int, runtime_code: int) -> int:
    """The code of a failure whose runtime error is more precise than the driver API's.
    NVIDIA's runtime passes the driver's codes on unchanged (its error numbers equal the
    driver's), yet its programs see the precise ones for these failures (a launch
    configuration, a launch of what is no kernel): its driver gives them, and so
    does vgpu's once NVIDIA's runtime has taken its interface table (cuGetExportTable)."""
    return runtime_code if lib.vgpu_nvidia_runtime_attached() else driver_code
