"""Modules, libraries (context-independent modules) and the PTX linker.

Loading is the one module call that waits for the server: it returns every kernel's
parameter layout and every module variable's address, so that cuModuleGetFunction,
cuModuleGetGlobal and launches are answered and validated here without a round trip.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from pathlib import Path

from vgpu.fatbin import FatbinError, prelinked_ptx
from vgpu.image_kernels import kernel_names
from vgpu.module_image import (
    FATBIN_CONTAINER_MAGIC,
    ImageError,
    mapped_file,
    pack_linked_ptx,
    read_image,
)

from . import managed
from ._state import (
    CudaError,
    E,
    KernelLayout,
    Kind,
    ModuleInfo,
    api,
    check_out,
    ffi,
    handle_of,
    ptr,
    state,
)
from .launch import _launched_function
from .ptx_target import check_ptx_target

CU_JIT_INPUT_CUBIN, CU_JIT_INPUT_PTX, CU_JIT_INPUT_FATBINARY = 0, 1, 2
CU_JIT_INPUT_OBJECT, CU_JIT_INPUT_LIBRARY = 3, 4
CU_MODULE_EAGER_LOADING, CU_MODULE_LAZY_LOADING = 1, 2
CU_JIT_MAX_REGISTERS = 0
CU_JIT_INFO_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER = 3, 5
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 4, 6


# Why a module cannot be loaded matters to the user whatever the program does with the code:
# a module built without PTX, or using what the emulator lacks, never runs on vgpu.
REFUSALS = frozenset({E.CUDA_ERROR_INVALID_IMAGE, E.CUDA_ERROR_NO_BINARY_FOR_GPU,
                      E.CUDA_ERROR_INVALID_PTX, E.CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
                      E.CUDA_ERROR_INVALID_SOURCE, E.CUDA_ERROR_JIT_COMPILER_NOT_FOUND})


def says_refusals(fn):
    """A load call whose refusal is told on stderr, always, with the reason in words."""

    @functools.wraps(fn)
    def wrapper(*args):
        try:
            fn(*args)
        except CudaError as exc:
            if exc.code in REFUSALS:
                print(f"vgpu: {fn.__name__}: {exc.message or 'the module cannot be loaded'} "
                      f"({E(exc.code).name})", file=sys.stderr, flush=True)
            raise

    return wrapper


def _load(image: bytes, context: int, max_registers: int = 0, library: bool = False,
          handle: int | None = None) -> int:
    conn = state.conn()
    handle = handle or state.new_handle(Kind.MODULE)
    spec = ["inline", image] if len(image) <= 1 << 20 else conn.frame(image)
    result, _ = conn.call("cuModuleLoadData", handle, context, spec, len(image))
    if max_registers:  # the JIT compiles within the limit: the kernels report at most it
        for kernel in result["kernels"].values():
            attributes = kernel[3]
            attributes["num_regs"] = min(attributes.get("num_regs", 0), max_registers)
    state.modules[handle] = ModuleInfo(context, result["kernels"], result["variables"],
                                       library_image=image if library else None)
    for address, size in result["variables"].values():
        state.add_allocation(address, size, context, module_variable=True)
    managed.add_module_variables(result["variables"], result.get("managed", ()))
    return handle


def reload_library(handle: int, info: ModuleInfo, context: int) -> None:
    """A library of a reset primary context, loaded into it afresh under the same handles
    (its own and its kernels'): CUDA's libraries are independent of contexts, and NVIDIA's
    runtime keeps using its kernel handles after cudaDeviceReset."""
    if info.no_binary:  # nothing of it is on the server
        state.modules[handle] = info
        return
    _load(info.library_image, context, library=True, handle=handle)
    for name, function in info.functions.items():
        _function_for(handle, name, Kind.FUNCTION, function)


def linked_image(wrapper_address: int, emu: bool, device_arch: int) -> bytes | None:
    """For the device-link image of an -rdc program (a version-2 fatbin wrapper, which
    vgpu's runtime registers and NVIDIA's static runtime hands to cuLibraryLoadData), the
    objects' PTX, to be linked at load (by the emulator, or by a GPU's driver: cuLink*);
    None for any other image.

    The image itself is an nvlink-ed cubin, which runs only on a GPU of the architecture it
    was built for; the server may hold another one, or be an emulator underneath (a cuda
    backend that is itself a vgpu client). The PTX links and runs on all of them. So the
    cubin is kept only where the objects have no PTX (an SASS-only build): on a GPU backend,
    the one place it may run. On the emulator that is an error saying how to rebuild."""
    try:
        ptx = prelinked_ptx(wrapper_address, device_arch if emu else None)
    except FatbinError:
        if emu:
            raise
        return None
    return pack_linked_ptx([p.encode() for p in ptx]) if ptx else None


def _image_at(address: int) -> bytes:
    """The module image a load call is handed a pointer to."""
    try:
        image = read_image(address)
    except ImageError as exc:
        raise CudaError(E.CUDA_ERROR_INVALID_IMAGE, str(exc)) from None
    major, minor = state.device["compute_capability"]
    try:
        linked = linked_image(address, state.conn().info.get("backend") == "emu",
                              major * 10 + minor)
    except FatbinError:  # objects without PTX: the cubin, whose kernels emu refuses by name
        linked = None
    return image if linked is None else linked


def _load_module(image: bytes, context: int, origin: str | None, max_registers: int = 0) -> int:
    """A module (cuModuleLoad*). One without code the device runs is refused at load, as
    CUDA's driver refuses it; the refusal names the file the image came from (`origin`),
    where known, and its kernels, which the program never gets to ask for."""
    check_ptx_target(image, state.device["compute_capability"])
    try:
        return _load(image, context, max_registers)
    except CudaError as exc:
        if exc.code != E.CUDA_ERROR_NO_BINARY_FOR_GPU:
            raise
        raise CudaError(exc.code, f"{_describe(image, origin)}: {exc.message}") from None


def _describe(image: bytes, origin: str | None, shown: int = 3) -> str:
    """'k.cubin (kernels 'a', 'b')': what a refusal is about."""
    names = kernel_names(image)
    listed = ", ".join(repr(name) for name in names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    kernels = f"kernel{'s' if len(names) > 1 else ''} {listed}" if names else "no kernels"
    return f"{origin or 'the image'} ({kernels})"


def _load_from_pointer(image_ptr, max_registers: int = 0) -> int:
    context = state.current_context()
    address = ptr(image_ptr)
    return _load_module(_image_at(address), context, mapped_file(address), max_registers)


def _jit_max_registers(num_options: int, options, values) -> int:
    """CU_JIT_MAX_REGISTERS (an unsigned int passed in the value pointer itself); 0: none."""
    for i in range(num_options):
        if options[i] == CU_JIT_MAX_REGISTERS:
            return int(ffi.cast("uintptr_t", values[i])) & 0xFFFFFFFF
    return 0


def _clear_jit_logs(num_options: int, options, values) -> None:
    """JIT options ask for log buffers; the server's loader writes nothing into them."""
    for i in range(num_options):
        if options[i] in (CU_JIT_INFO_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER) and \
                values[i] != ffi.NULL:
            ffi.cast("char *", values[i])[0] = b"\0"


@api
@says_refusals
def cuModuleLoadData(module, image):
    check_out(module)
    module[0] = ffi.cast("CUmodule", _load_from_pointer(image))


@api
@says_refusals
def cuModuleLoadDataEx(module, image, num_options, options, option_values):
    check_out(module)
    _clear_jit_logs(num_options, options, option_values)
    max_registers = _jit_max_registers(num_options, options, option_values)
    module[0] = ffi.cast("CUmodule", _load_from_pointer(image, max_registers))


cuModuleLoadFatBinary = cuModuleLoadData


@api
def cuModuleGetLoadingMode(mode):
    """CUDA_MODULE_LOADING's mode, read as CUDA's driver reads it: EAGER, or else LAZY (the
    default since CUDA 12.2). vgpu's driver loads a module whole at cuModuleLoad* in both;
    what the mode changes is NVIDIA's runtime, which asks for it: eager, it loads every image
    of a program at its first call; lazy, each at the first use of one of its kernels or
    variables, as vgpu's own runtime always does."""
    check_out(mode)
    mode[0] = CU_MODULE_EAGER_LOADING if _environment("CUDA_MODULE_LOADING") == b"EAGER" \
        else CU_MODULE_LAZY_LOADING


def _environment(name: str) -> bytes | None:
    """The process's variable as it is now: a program may set it (setenv) after the embedded
    Python took its copy of the environment."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    return getenv(name.encode())


@api
@says_refusals
def cuModuleLoad(module, fname):
    check_out(module)
    context = state.current_context()
    path = Path(ffi.string(fname).decode(errors="replace"))
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise CudaError(E.CUDA_ERROR_FILE_NOT_FOUND, f"cannot read {path}: {exc}") from None
    module[0] = ffi.cast("CUmodule", _load_module(image, context, str(path)))


def _module_arg(module) -> int:
    return handle_of(module, Kind.MODULE, state.modules)


@api
def cuModuleUnload(module):
    handle = _module_arg(module)
    info = state.modules.pop(handle)
    for function in info.functions.values():
        state.functions.pop(function, None)
    for address, _ in info.variables.values():
        state.remove_allocation(address)
        managed.release(address)
    if not info.no_binary:
        state.conn().post("cuModuleUnload", handle)


def _kernel_names(info: ModuleInfo) -> list[str]:
    return list(info.kernels) if not info.no_binary else list(info.kernel_names)


def _function_for(module_handle: int, name: str, kind: int = Kind.FUNCTION,
                  wanted: int | None = None) -> int:
    """The function handle of kernel `name` (a new one, or `wanted`, at its first use)."""
    info = state.modules[module_handle]
    if info.no_binary and (name in info.kernel_names or not info.kernel_names):
        origin = f" of {info.origin}" if info.origin else ""
        raise CudaError(E.CUDA_ERROR_NO_BINARY_FOR_GPU,
                        f"kernel {name!r}{origin} cannot run: {info.no_binary}")
    if name not in info.kernels:
        raise CudaError(E.CUDA_ERROR_NOT_FOUND, f"no kernel named {name!r} in the module")
    with state.lock:  # two threads asking at once must get (and announce) one handle
        handle = info.functions.get(name)
        if handle is None:
            handle = wanted or state.new_handle(kind)
            # Announced to the server before any thread can see it, so no launch with this
            # handle can overtake the announcement.
            state.conn().post("cuModuleGetFunction", handle, module_handle, name)
            offsets, sizes, buffer_size, attributes = info.kernels[name]
            state.functions[handle] = KernelLayout(name, offsets, sizes, buffer_size,
                                                   attributes, module_handle)
            info.functions[name] = handle
    return handle


@api
@says_refusals
def cuModuleGetFunction(hfunc, module, name):
    check_out(hfunc)
    check_out(name)
    handle = _function_for(_module_arg(module), ffi.string(name).decode())
    hfunc[0] = ffi.cast("CUfunction", handle)


@api
def cuModuleGetFunctionCount(count, mod):
    check_out(count)
    count[0] = len(_kernel_names(state.modules[_module_arg(mod)]))


@api
def cuModuleEnumerateFunctions(functions, num_functions, mod):
    """The module's kernels (in the image's order), as many as `functions` has room for."""
    check_out(functions)
    handle = _module_arg(mod)
    for i, name in enumerate(_kernel_names(state.modules[handle])[:num_functions]):
        functions[i] = ffi.cast("CUfunction", _function_for(handle, name))


def _global(module_handle: int, name: str) -> list:
    info = state.modules[module_handle]
    if info.no_binary:
        raise CudaError(E.CUDA_ERROR_NO_BINARY_FOR_GPU,
                        f"variable {name!r} cannot be had: {info.no_binary}")
    variables = info.variables
    if name not in variables:
        raise CudaError(E.CUDA_ERROR_NOT_FOUND, f"no global named {name!r} in the module")
    return variables[name]


@api
def cuModuleGetGlobal_v2(dptr, nbytes, module, name):
    check_out(name)
    address, size = _global(_module_arg(module), ffi.string(name).decode())
    if dptr != ffi.NULL:
        dptr[0] = address
    if nbytes != ffi.NULL:
        nbytes[0] = size


# ----------------------------------------------------------------- libraries

# A library is loaded into the primary context of device 0 (CUDA loads it into each context
# that uses it; vgpu, into that one only).
def _library_context() -> int:
    from .context import _primary

    return _primary(0)[0]


def _load_library(image: bytes, origin: Callable[[], str | None]) -> int:
    """A library; one without code the device runs (cubins only, say) is taken all the same,
    as CUDA's driver takes it, and each of its kernels is refused when asked for, naming the
    file the image came from (`origin`), where known: NVIDIA's static runtime, loading
    eagerly (cuModuleGetLoadingMode), loads every image of a program at its first call, those
    whose kernels the program never launches too."""
    context = _library_context()
    try:
        return _load(image, context, library=True)
    except CudaError as exc:
        if exc.code != E.CUDA_ERROR_NO_BINARY_FOR_GPU:
            raise
        why = exc.message or "the library holds no code the device runs"
    handle = state.new_handle(Kind.MODULE)
    state.modules[handle] = ModuleInfo(context, {}, {}, library_image=image, no_binary=why,
                                       kernel_names=tuple(kernel_names(image)),
                                       origin=Path(origin() or "").name)
    return handle


@api
@says_refusals
def cuLibraryLoadData(library, code, jit_options, jit_values, num_jit_options,
                      library_options, library_values, num_library_options):
    check_out(library)
    _clear_jit_logs(num_jit_options, jit_options, jit_values)
    image = _image_at(ptr(code))
    library[0] = ffi.cast("CUlibrary", _load_library(image, lambda: mapped_file(ptr(code))))


@api
@says_refusals
def cuLibraryLoadFromFile(library, filename, jit_options, jit_values, num_jit_options,
                          library_options, library_values, num_library_options):
    check_out(library)
    path = Path(ffi.string(filename).decode(errors="replace"))
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise CudaError(E.CUDA_ERROR_FILE_NOT_FOUND, f"cannot read {path}: {exc}") from None
    library[0] = ffi.cast("CUlibrary", _load_library(image, lambda: str(path)))


def _library_arg(library) -> int:
    # Libraries share the module table: a library is a module loaded in the primary context.
    return handle_of(library, Kind.MODULE, state.modules)


@api
def cuLibraryUnload(library):
    cuModuleUnload.__wrapped__(library)


@api
@says_refusals
def cuLibraryGetKernel(pkernel, library, name):
    check_out(pkernel)
    check_out(name)
    handle = _function_for(_library_arg(library), ffi.string(name).decode())
    pkernel[0] = ffi.cast("CUkernel", handle)


@api
def cuLibraryGetKernelCount(count, library):
    cuModuleGetFunctionCount.__wrapped__(count, ffi.cast("CUmodule", _library_arg(library)))


@api
def cuLibraryEnumerateKernels(kernels, num_kernels, library):
    """The library's kernels (in the image's order), as many as `kernels` has room for; the
    handles are those cuLibraryGetKernel gives."""
    check_out(kernels)
    handle = _library_arg(library)
    for i, name in enumerate(_kernel_names(state.modules[handle])[:num_kernels]):
        kernels[i] = ffi.cast("CUkernel", _function_for(handle, name))


@api
def cuLibraryGetModule(pmod, library):
    check_out(pmod)
    pmod[0] = ffi.cast("CUmodule", _library_arg(library))


@api
def cuLibraryGetManaged(dptr, nbytes, library, name):
    """A __managed__ variable of a library (NVIDIA's runtime asks for each so); its address
    is the host's too."""
    handle = _library_arg(library)
    variable = ffi.string(name).decode(errors="replace")
    address, size = _global(handle, variable)
    if not managed.is_managed(address):
        raise CudaError(E.CUDA_ERROR_NOT_FOUND, f"{variable!r} is not a __managed__ variable")
    if dptr != ffi.NULL:
        dptr[0] = address
    if nbytes != ffi.NULL:
        nbytes[0] = size


@api
def cuLibraryGetGlobal(dptr, nbytes, library, name):
    cuModuleGetGlobal_v2.__wrapped__(dptr, nbytes, library, name)


@api
def cuKernelGetFunction(pfunc, kernel):
    """A kernel handle is also a valid function handle (CUDA lets CUkernel stand for
    CUfunction). NVIDIA's CUDA 12 runtime asks for the function of any pointer its program
    passed to cudaLaunchKernel that is no registered kernel, as its CUDA 13 runtime launches
    it: the same refusal."""
    check_out(pfunc)
    _, handle = _launched_function(kernel)
    pfunc[0] = ffi.cast("CUfunction", handle)


@api
def cuKernelGetName(name, kernel):
    check_out(name)
    layout = state.functions[handle_of(kernel, Kind.FUNCTION, state.functions)]
    name[0] = _interned_name(layout.name)


_names: dict[str, object] = {}


def _interned_name(name: str):
    """A C string that lives as long as the process, as CUDA's returned names do."""
    if name not in _names:
        _names[name] = ffi.new("char[]", name.encode())
    return _names[name]


# ----------------------------------------------------------------- linker (PTX only)

def _ptx_from(input_type: int, data: bytes, what: str) -> list[bytes]:
    """The PTX modules a linker input contributes."""
    if input_type in (CU_JIT_INPUT_OBJECT, CU_JIT_INPUT_LIBRARY):
        from .link_objects import ptx_from_library, ptx_from_object

        try:
            found = (ptx_from_library if input_type == CU_JIT_INPUT_LIBRARY
                     else ptx_from_object)(data, what)
        except ValueError as exc:
            raise CudaError(E.CUDA_ERROR_INVALID_IMAGE, str(exc)) from None
        if not found and input_type == CU_JIT_INPUT_OBJECT:
            raise CudaError(E.CUDA_ERROR_NO_BINARY_FOR_GPU, f"{what}: the object has no PTX")
        return found
    return [_single_ptx(input_type, data, what)]


def _single_ptx(input_type: int, data: bytes, what: str) -> bytes:
    if input_type == CU_JIT_INPUT_PTX:
        return data.rstrip(b"\0")
    # vgpu's NVRTC hands back an sm_XY compilation's cubin as a fatbin that also carries
    # its PTX (shim/c/nvrtc_forwarder.c); a program links it as the cubin it asked for.
    if input_type == CU_JIT_INPUT_FATBINARY or (
            input_type == CU_JIT_INPUT_CUBIN
            and data[:4] == FATBIN_CONTAINER_MAGIC.to_bytes(4, "little")):
        from vgpu.fatbin import FatbinError, parse_fatbin, select_ptx

        major, minor = state.connection.info["device"]["compute_capability"]
        try:  # the newest PTX the device can run, as its driver's linker picks it
            ptx = select_ptx(parse_fatbin(data), major * 10 + minor)
        except FatbinError as exc:
            raise CudaError(E.CUDA_ERROR_INVALID_IMAGE, f"{what}: {exc}") from None
        if ptx is None:
            raise CudaError(E.CUDA_ERROR_NO_BINARY_FOR_GPU,
                            f"{what}: the fatbin has no PTX for compute_{major}{minor} or older")
        return ptx.encode()
    raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                    f"{what}: the vgpu linker takes PTX, and fatbins, objects and libraries "
                    "carrying PTX, only")


def _link_arg(link_state) -> int:
    handle = ptr(link_state)
    if handle not in state.link_states:
        raise CudaError(E.CUDA_ERROR_INVALID_HANDLE, "invalid link state")
    return handle


@api
def cuLinkCreate_v2(num_options, options, option_values, state_out):
    check_out(state_out)
    state.current_context()
    _clear_jit_logs(num_options, options, option_values)
    handle = state.new_handle(Kind.LINK)
    state.link_states[handle] = []
    state_out[0] = ffi.cast("CUlinkState", handle)


@api
def cuLinkAddData_v2(link_state, input_type, data, size, name, num_options, options, values):
    handle = _link_arg(link_state)
    if data == ffi.NULL or size == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "no data to link")
    what = ffi.string(name).decode(errors="replace") if name != ffi.NULL else "input"
    state.link_states[handle].extend(_ptx_from(input_type, ffi.buffer(data, size)[:], what))


@api
def cuLinkAddFile_v2(link_state, input_type, path, num_options, options, values):
    handle = _link_arg(link_state)
    file = Path(ffi.string(path).decode(errors="replace"))
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise CudaError(E.CUDA_ERROR_FILE_NOT_FOUND, f"cannot read {file}: {exc}") from None
    state.link_states[handle].extend(_ptx_from(input_type, data, str(file)))


@api
def cuLinkComplete(link_state, cubin_out, size_out):
    handle = _link_arg(link_state)
    check_out(cubin_out)
    if not state.link_states[handle]:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "nothing was added to the link")
    image = pack_linked_ptx(state.link_states[handle])
    buffer = state.link_outputs[handle] = ffi.new("char[]", image)  # lives until cuLinkDestroy
    cubin_out[0] = ffi.cast("void *", buffer)
    if size_out != ffi.NULL:
        size_out[0] = len(image)


@api
def cuLinkDestroy(link_state):
    handle = _link_arg(link_state)
    del state.link_states[handle]
    state.link_outputs.pop(handle, None)
