"""Registration: what nvcc's generated code tells the runtime at program start, and the lazy
loading of the images it registers.

Static constructors call `__cudaRegisterFatBinary` once per translation unit's image and once
for the program's device-link image (cubin only, no PTX, even in a default build), then
`__cudaRegisterFunction` / `__cudaRegisterVar` for each kernel and device variable of the
image, then `__cudaRegisterFatBinaryEnd`. None of this contacts the server. An image is read,
turned into what the backend loads and loaded into the calling thread's context the first
time one of its kernels or variables is used; so an image that cannot run (no PTX for the
emu backend) fails with a message naming the kernel, and only if that kernel is used.

Relocatable device code (`-rdc=true`): the program's own device-link stub
(`__cudaRegisterLinkedBinary_<module id>`, defined in the executable, not in cudart) registers
one version-2 wrapper for all objects; its last field points at a NULL-terminated list of each
object's fatbin container from `__nv_relfatbin` (cubin + PTX). The registered image itself is
the nvlink-ed cubin; every backend is sent the objects' PTX modules instead, to be linked at
load (see driver.module.linked_image, which also serves NVIDIA's static runtime).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from dataclasses import dataclass, field

from vgpu.fatbin import (
    FatbinError,
    parse_fatbin,
    read_wrapper_at,
    require_ptx,
)

from ..driver import module as driver_module
from ..driver._state import _HANDLE_MARK, _KIND_SHIFT, Kind
from ._state import (
    CudaError,
    E,
    current_context,
    driver_state,
    ffi,
    ptr,
    warn_once,
)

__all__ = [
    "RegisteredKernel",
    "RegisteredVariable",
    "RegisteredImage",
    "registry",
    "__cudaRegisterFatBinary",
    "__cudaRegisterFatBinaryEnd",
    "__cudaUnregisterFatBinary",
    "__cudaRegisterFunction",
    "__cudaRegisterVar",
    "__cudaRegisterManagedVar",
    "__cudaInitModule",
]

@dataclass(eq=False)
class RegisteredImage:
    """One `__cudaRegisterFatBinary` call and what was registered against its handle."""

    wrapper: int  # address of the program's __fatBinC_Wrapper_t
    cell: object  # `void *[1]` holding `wrapper`: its address is the handle the program keeps
    kernels: list[RegisteredKernel] = field(default_factory=list)
    variables: list[RegisteredVariable] = field(default_factory=list)
    modules: dict[int, int] = field(default_factory=dict)  # context -> driver module handle
    # Its __managed__ variables, each with the address of the program's pointer to it, which
    # host code reads the variable through once the image is loaded.
    managed: list[tuple[RegisteredVariable, int]] = field(default_factory=list)
    # Why the image can never load (no PTX, corrupt): (code, message).
    failure: tuple[int, str] | None = None


@dataclass(eq=False)
class RegisteredKernel:
    name: str  # the device-side (mangled) name
    host_function: int  # address of the host stub, what `<<<>>>` and cudaLaunchKernel name
    handle: int  # the cudaKernel_t __cudaGetKernel gives the program
    image: RegisteredImage
    functions: dict[int, int] = field(default_factory=dict)  # context -> driver function
    # (context, driver function, its layout) of the last launch: the launch path's shortcut.
    last_use: tuple = (0, 0, None)


@dataclass(eq=False)
class RegisteredVariable:
    name: str
    host_variable: int  # address of the host shadow, what cudaMemcpyToSymbol names
    size: int
    constant: bool
    image: RegisteredImage


class Registry:
    """Everything registered, by the handles and addresses the program uses to name it.

    Kernels are found by `void *` cdata keys: cffi pointers hash and compare by address
    whatever their type, so the launch path looks up the pointer it was given without first
    converting it to an int (which costs more than the lookup).
    """

    def __init__(self) -> None:
        self.images: dict[int, RegisteredImage] = {}
        self.kernels: dict[object, RegisteredKernel] = {}  # by host stub and by handle
        self.variables_by_host: dict[int, RegisteredVariable] = {}
        # cudaKernel_t values: vgpu handles of the KERNEL kind, which the driver layer never
        # issues, so they cannot be confused with its function handles.
        self._kernel_ids = itertools.count(1)
        # Taken when an image or a function is not loaded yet: threads that launch the same
        # kernel first at the same time must load it once, and none may launch a function
        # before it has been announced to the server.
        self._loading = threading.RLock()

    def image(self, handle) -> RegisteredImage:
        image = self.images.get(ptr(handle))
        if image is None:
            raise CudaError(E.cudaErrorInvalidResourceHandle, "unknown fatbin handle")
        return image

    def new_kernel_handle(self) -> int:
        return _HANDLE_MARK | (Kind.KERNEL << _KIND_SHIFT) | next(self._kernel_ids)

    # ----------------------------------------------------------------- lookups

    def kernel(self, func) -> RegisteredKernel:
        """The kernel a host stub or a cudaKernel_t (pointer cdata) names."""
        kernel = self.kernels.get(func)
        if kernel is None:
            raise CudaError(E.cudaErrorInvalidDeviceFunction,
                            f"0x{ptr(func):x} is not a registered kernel")
        return kernel

    def add_kernel(self, kernel: RegisteredKernel) -> None:
        self.kernels[ffi.cast("void *", kernel.host_function)] = kernel
        self.kernels[ffi.cast("void *", kernel.handle)] = kernel

    def function(self, kernel: RegisteredKernel, context: int) -> int:
        """The driver function of `kernel` in `context`, loading its image on first use."""
        function = kernel.functions.get(context)
        if function is not None and function in driver_state.functions:
            return function
        with self._loading:
            function = kernel.functions.get(context)
            if function is not None and function in driver_state.functions:
                return function  # another thread loaded it meanwhile
            module = self.module(kernel.image, context, f"kernel {kernel.name!r}")
            try:
                function = driver_module._function_for(module, kernel.name)
            except CudaError:
                raise CudaError(E.cudaErrorInvalidDeviceFunction,
                                f"kernel {kernel.name!r} is not in its image") from None
            kernel.functions[context] = function
            return function

    def variable(self, host_variable: int) -> tuple[int, int]:
        """(device address, size) of the device variable whose host shadow is at the
        address, loading its image on first use."""
        variable = self.variables_by_host.get(host_variable)
        if variable is None:
            raise CudaError(E.cudaErrorInvalidSymbol,
                            f"0x{host_variable:x} is not a registered device variable")
        module = self.module(variable.image, current_context(),
                             f"device variable {variable.name!r}")
        try:
            address, size = driver_module._global(module, variable.name)
        except CudaError:
            raise CudaError(E.cudaErrorInvalidSymbol,
                            f"device variable {variable.name!r} is not in its image") from None
        return address, size

    def module(self, image: RegisteredImage, context: int, user: str) -> int:
        """The driver module of `image` in `context`; loads it the first time. A failure
        names `user` (the kernel or variable that needed the image) once on stderr."""
        module = image.modules.get(context)
        if module is not None and module in driver_state.modules:
            return module
        with self._loading:
            return self._load(image, context, user)

    def _load(self, image: RegisteredImage, context: int, user: str) -> int:
        module = image.modules.get(context)
        if module is not None and module in driver_state.modules:
            return module  # another thread loaded it meanwhile
        try:
            if image.failure:
                raise CudaError(*image.failure)
            try:
                data = _loadable_image(image.wrapper)
            except FatbinError as exc:
                image.failure = (E.cudaErrorNoKernelImageForDevice, str(exc))
                raise CudaError(*image.failure) from None
            module = driver_module._load(data, context)
            for variable, pointer in image.managed:
                address, _ = driver_module._global(module, variable.name)
                ffi.cast("void **", pointer)[0] = ffi.cast("void *", address)
                # Host code names the variable by that address (&var, cudaMemcpyToSymbol).
                self.variables_by_host[address] = variable
        except CudaError as exc:
            warn_once(("load", user), f"{user} cannot be used: {exc.message or exc}")
            raise
        image.modules[context] = module
        return module

    def forget_loaded(self) -> None:
        """Drop every module and function this process loaded (after cudaDeviceReset)."""
        for image in self.images.values():
            image.modules.clear()
            for kernel in image.kernels:
                kernel.functions.clear()
                kernel.last_use = (0, 0, None)

    # ----------------------------------------------------------------- removal

    def remove(self, image: RegisteredImage) -> None:
        del self.images[ptr(image.cell)]
        for kernel in image.kernels:
            self.kernels.pop(ffi.cast("void *", kernel.host_function), None)
            self.kernels.pop(ffi.cast("void *", kernel.handle), None)
        for variable in image.variables:
            self.variables_by_host.pop(variable.host_variable, None)
        for module in image.modules.values():
            if module in driver_state.modules:
                driver_module.cuModuleUnload.__wrapped__(module)


    def after_fork_in_child(self) -> None:
        """A forked child has a session of its own, where nothing is loaded yet."""
        self._loading = threading.RLock()
        self.forget_loaded()


registry = Registry()
os.register_at_fork(after_in_child=registry.after_fork_in_child)


# ----------------------------------------------------------------- images

def _backend() -> str:
    connection = driver_state.connection
    return connection.info.get("backend", "") if connection is not None else ""


def _device_arch() -> int:
    """The connected device's compute capability as an architecture number (80 for 8.0):
    the newest PTX it can run, as a GPU's driver picks a fatbin's PTX."""
    major, minor = driver_state.connection.info["device"]["compute_capability"]
    return major * 10 + minor


def _loadable_image(wrapper_address: int) -> bytes:
    """What the server's backend loads for the image registered at `wrapper_address`: the
    fatbin for a GPU backend, its PTX for the emulator; for an -rdc program, the objects' PTX
    for every backend (driver_module.linked_image)."""
    emu = _backend() == "emu"
    linked = driver_module.linked_image(wrapper_address, emu, _device_arch())
    if linked is not None:
        return linked
    wrapper = read_wrapper_at(wrapper_address)
    if not emu:
        return wrapper.container
    return require_ptx(parse_fatbin(wrapper.container), _device_arch()).encode()


# ----------------------------------------------------------------- entry points

def _registration(default):
    """Registration runs in static constructors and returns no error code: a failure is
    said on stderr and the call returns `default`, never an exception into C."""

    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            try:
                return fn(*args)
            except (CudaError, FatbinError, ValueError, OSError) as exc:
                warn_once((fn.__name__, str(exc)), f"{fn.__name__}: {exc}")
                return default

        return wrapper

    return wrap


@_registration(default=0)
def __cudaRegisterFatBinary(fat_cubin):
    """Returns the handle (a `void **`) the program passes to the other registration calls."""
    wrapper = ptr(fat_cubin)
    if not wrapper:
        raise CudaError(E.cudaErrorInvalidValue, "the fatbin wrapper pointer is NULL")
    cell = ffi.new("void *[1]")
    cell[0] = ffi.cast("void *", wrapper)  # NVIDIA's handle leads to the wrapper too
    registry.images[ptr(cell)] = RegisteredImage(wrapper, cell)
    return ptr(cell)


@_registration(default=None)
def __cudaRegisterFatBinaryEnd(handle):
    # NVIDIA's runtime may load the image here; vgpu loads it when it is first used.
    registry.image(handle)


@_registration(default=None)
def __cudaUnregisterFatBinary(handle):
    registry.remove(registry.image(handle))


@_registration(default=None)
def __cudaRegisterFunction(handle, host_function, device_function, device_name, thread_limit,
                           tid, bid, block_dim, grid_dim, warp_size):
    image = registry.image(handle)
    kernel = RegisteredKernel(ffi.string(device_name).decode(), ptr(host_function),
                              registry.new_kernel_handle(), image)
    image.kernels.append(kernel)
    registry.add_kernel(kernel)


@_registration(default=None)
def __cudaRegisterVar(handle, host_variable, device_address, device_name, ext, size, constant,
                      is_global):
    image = registry.image(handle)
    variable = RegisteredVariable(ffi.string(device_name).decode(), ptr(host_variable), size,
                                  bool(constant), image)
    image.variables.append(variable)
    registry.variables_by_host[variable.host_variable] = variable


@_registration(default=None)
def __cudaRegisterManagedVar(handle, host_variable_pointer, device_address, device_name, ext,
                             size, constant, is_global):
    """Host code reaches a __managed__ variable through the pointer at
    `host_variable_pointer`, which loading the image (__cudaInitModule, or the first use of
    the image) points at the variable; symbol calls name it by its host shadow."""
    __cudaRegisterVar.__wrapped__(handle, device_address, device_address, device_name, ext,
                                  size, constant, is_global)
    image = registry.image(handle)
    image.managed.append((image.variables[-1], ptr(host_variable_pointer)))


@_registration(default=0)
def __cudaInitModule(handle):
    """Load the image now (nvcc calls this before host code touches managed variables);
    1 when it is loaded."""
    image = registry.image(handle)
    registry.module(image, current_context(), "the image's module")
    return 1
