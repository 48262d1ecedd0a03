"""Libraries of the runtime API (cudaLibraryLoadData and kin: how cuRAND's host library, for
one, loads its kernels), on the driver layer's (shim/driver/module.py); a kernel of a library
launches with cudaLaunchKernel like any other (see launch.function_layout)."""

from __future__ import annotations

from ..driver import launch as driver_launch
from ..driver import module as driver_module
from ._state import api, check_out, ffi, set_pointer
from .device import _check_device
from .launch import function_layout

__all__ = ["cudaLibraryLoadData", "cudaLibraryUnload", "cudaLibraryGetKernel",
           "cudaLibraryGetKernelCount", "cudaLibraryEnumerateKernels", "cudaLibraryGetGlobal",
           "cudaKernelSetAttributeForDevice"]


def _handle(out) -> int:
    return int(ffi.cast("uintptr_t", out[0]))


@api
def cudaLibraryLoadData(library, code, jit_options, jit_values, num_jit_options,
                        library_options, library_values, num_library_options):
    check_out(library)
    out = ffi.new("CUlibrary *")
    driver_module.cuLibraryLoadData.__wrapped__(
        out, code, ffi.cast("CUjit_option *", jit_options), jit_values, num_jit_options,
        ffi.cast("CUlibraryOption *", library_options), library_values, num_library_options)
    set_pointer(library, _handle(out))


@api
def cudaLibraryUnload(library):
    driver_module.cuLibraryUnload.__wrapped__(library)


@api
def cudaLibraryGetKernel(kernel, library, name):
    check_out(kernel)
    out = ffi.new("CUkernel *")
    driver_module.cuLibraryGetKernel.__wrapped__(out, library, name)
    set_pointer(kernel, _handle(out))


@api
def cudaLibraryGetKernelCount(count, library):
    driver_module.cuLibraryGetKernelCount.__wrapped__(count, library)


@api
def cudaLibraryEnumerateKernels(kernels, num_kernels, library):
    driver_module.cuLibraryEnumerateKernels.__wrapped__(
        ffi.cast("CUkernel *", kernels), num_kernels, library)


@api
def cudaLibraryGetGlobal(dptr, size, library, name):
    check_out(dptr)
    out = ffi.new("CUdeviceptr *")
    driver_module.cuLibraryGetGlobal.__wrapped__(out, size, library, name)
    set_pointer(dptr, int(out[0]))


@api
def cudaKernelSetAttributeForDevice(kernel, attribute, value, device):
    _check_device(device)
    driver_launch._set_attribute(function_layout(kernel)[1], attribute, value)
