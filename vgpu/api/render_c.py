"""Writes a shim's generated C: its types, one stub per exported symbol, lookup tables.

A stub has the exact prototype the headers give its symbol. It lets the call through only once
the embedded Python runtime is up (else it returns the API's "not initialized" code, or zero),
then calls its symbol's own cffi callback, `vgpu_py_<symbol>`, with the same arguments: cffi
converts them to Python objects in its generated C and the result back.
The callbacks are declared once, in `<prefix>_callbacks.h`: the stubs include it, and the cffi
builder declares its contents `extern "Python+C"`, so cffi defines them. A callback has its
symbol's signature, except that `char` results travel as `signed char` (cffi would otherwise
want a one-byte string from the implementation, which returns an int). Functions that must work
even when Python cannot start (cuGetProcAddress, cuGetErrorString, ...) are written by hand in
shim/c/ and get neither stub nor callback. What the build renders from committed files is
not written here: the exported functions' prototypes (from the API table) and cffi's form of
the types (shim/shim_builder.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.api.driver_headers import FOREIGN_TYPES, DriverHeaders
from vgpu.api.header_parser import ApiHeaders, Prototype
from vgpu.api.runtime_headers import RuntimeHeaders
from vgpu.api.table import CALLBACK_PREFIX

__all__ = ["ShimSpec", "DRIVER_SHIM", "RUNTIME_SHIM", "render_driver_sources",
           "render_runtime_sources", "first_sentence"]


@dataclass(frozen=True, slots=True)
class ShimSpec:
    """What differs between the shims' generated C."""

    library: str                     # "libcuda": names the module (PyInit__libcuda), map file
    prefix: str                      # "driver": names the C files and tables
    error_type: str                  # the return type that is the call's result code
    not_ready: str                   # its value when the Python runtime cannot start
    gone: str                        # its value when the program is exiting (Python gone)
    success: str                     # its value for success
    # Calls that release something: at exit they succeed without Python (the server frees
    # what the session holds when it ends), as frees and unloads of objects that a
    # program's finalization destroys do under NVIDIA's driver.
    released_at_exit: frozenset[str]
    hand_written: frozenset[str]     # symbols implemented in shim/c/, no generated stub
    version_node: str | None         # symbol version of every export (cudart: libcudart.so.13)

    @property
    def ready(self) -> str:
        return f"vgpu_{self.prefix}_ready"

    @property
    def gone_check(self) -> str:
        return f"vgpu_{self.prefix}_gone"


DRIVER_SHIM = ShimSpec(
    library="libcuda",
    prefix="driver",
    error_type="CUresult",
    not_ready="CUDA_ERROR_NOT_INITIALIZED",
    gone="CUDA_ERROR_DEINITIALIZED",
    success="CUDA_SUCCESS",
    released_at_exit=frozenset({
        "cuMemFree", "cuMemFree_v2", "cuMemFreeHost", "cuMemFreeAsync", "cuMemHostUnregister",
        "cuModuleUnload", "cuLibraryUnload", "cuLinkDestroy", "cuStreamDestroy",
        "cuStreamDestroy_v2", "cuEventDestroy", "cuEventDestroy_v2", "cuCtxDestroy",
        "cuCtxDestroy_v2", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2",
        "cuArrayDestroy", "cuMipmappedArrayDestroy", "cuTexObjectDestroy",
        "cuSurfObjectDestroy", "cuMemRelease", "cuMemUnmap", "cuMemAddressFree",
        "cuMemPoolDestroy", "cuGraphDestroy", "cuGraphExecDestroy"}),
    hand_written=frozenset({"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetErrorName",
                            "cuGetErrorString", "cuGetExportTable"}),
    version_node=None,  # real libcuda's symbols carry no version
)

RUNTIME_SHIM = ShimSpec(
    library="libcudart",
    prefix="runtime",
    error_type="cudaError_t",
    not_ready="cudaErrorInitializationError",
    gone="cudaErrorCudartUnloading",
    success="cudaSuccess",
    released_at_exit=frozenset({
        "cudaFree", "cudaFreeHost", "cudaFreeAsync", "cudaFreeArray", "cudaFreeMipmappedArray",
        "cudaHostUnregister", "cudaStreamDestroy", "cudaEventDestroy",
        "cudaDestroyTextureObject", "cudaDestroySurfaceObject", "cudaGraphDestroy",
        "cudaGraphExecDestroy", "cudaMemPoolDestroy"}),
    # <<<>>>'s bookkeeping, kept out of Python (shim/c/runtime_launch_config.c).
    hand_written=frozenset({"__cudaPushCallConfiguration", "__cudaPopCallConfiguration"}),
    version_node="libcudart.so.13",  # what nvcc -cudart shared binaries import
)


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _error_text(headers: ApiHeaders, value: int, name: str) -> str:
    """cuGetErrorString's text: NVIDIA's runtime text of the same number where there is one
    (vgpu/api/gen_error_texts.py), else the first sentence of cuda.h's comment."""
    from vgpu.api.generated.error_texts import ERROR_TEXT

    return ERROR_TEXT.get(value) or first_sentence(headers.result_docs.get(value, name))


def first_sentence(doc: str) -> str:
    """`cuGetErrorString`'s text: the first sentence of the error's doc comment."""
    end = doc.find(". ")
    return (doc[:end] if end >= 0 else doc).rstrip(".")


def render_driver_sources(headers: DriverHeaders, banner: str) -> dict[str, str]:
    """File name (in shim/generated/) -> contents, for libcuda; and the window-system types
    both shims' types use (foreign_types.h)."""
    shim = DRIVER_SHIM
    return {
        "foreign_types.h": f"{banner}\n/* What the interop headers take from GL, EGL and VDPAU "
                           f"(vgpu/api/driver_headers.py). */\n{FOREIGN_TYPES}",
        "cuda_types.h": f"{banner}\n{headers.types_text}",
        "driver_callbacks.h": _callbacks(headers, shim, banner),
        "driver_stubs.c": _stubs(headers, shim, banner),
        "driver_tables.c": _symbol_table(headers, shim, banner) + _driver_tables(headers),
        f"{shim.library}.map": _version_script(headers, shim, banner),
    }


def render_runtime_sources(headers: RuntimeHeaders, banner: str) -> dict[str, str]:
    """File name (in shim/generated/) -> contents, for libcudart."""
    shim = RUNTIME_SHIM
    return {
        "cudart_types.h": f"{banner}\n{headers.types_text}",
        "runtime_callbacks.h": _callbacks(headers, shim, banner),
        "runtime_stubs.c": _stubs(headers, shim, banner),
        "runtime_tables.c": _symbol_table(headers, shim, banner),
        f"{shim.library}.map": _version_script(headers, shim, banner),
    }


def _stubbed(headers: ApiHeaders, shim: ShimSpec) -> list[Prototype]:
    return [proto for proto in headers.prototypes.values() if proto.name not in shim.hand_written]


def _callback_restype(restype: str) -> str:
    return "signed char" if restype == "char" else restype


def _callbacks(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    """The callbacks' C declarations; read by the stubs, and by cffi as its cdef (which takes
    no preprocessor lines: hence no include guard)."""
    out = [banner,
           "/* Each stub's Python side: cffi defines these (extern \"Python+C\"), the shim's",
           "   boot attaches each to its implementation (shim/dispatch.py). */"]
    for proto in _stubbed(headers, shim):
        params = ", ".join(_declare(param.ctype, param.name) for param in proto.params)
        name = f"{CALLBACK_PREFIX}{proto.name}({params or 'void'})"
        out.append(f"{_declare(_callback_restype(proto.restype), name)};")
    return "\n".join(out) + "\n"


def _stubs(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    unknown = shim.released_at_exit - set(headers.prototypes)
    if unknown:
        raise ValueError(f"released_at_exit names calls the headers lack: {sorted(unknown)}")
    out = [banner, f'#include "{shim.prefix}_shim.h"', f'#include "{shim.prefix}_callbacks.h"', ""]
    for proto in _stubbed(headers, shim):
        call = f"{CALLBACK_PREFIX}{proto.name}({', '.join(p.name for p in proto.params)})"
        # A Python exception the caller has pending is set aside for the call (the runtime's
        # start included) and put back after it: Python must not see it, nor clear it. What a
        # signal handler of the program raised in the callback (KeyboardInterrupt) is passed
        # on to the program once the callback has returned (embedded_python.h).
        exiting = []  # what a call that is not ready because the program exits returns
        if proto.restype == "void":
            head, run, tail = [], f"        {call};", []
        else:
            failed = shim.not_ready if proto.restype == shim.error_type else "{0}"
            head = [f"    {_declare(proto.restype, 'vgpu_result')} = {failed};"]
            run, tail = f"        vgpu_result = {call};", ["    return vgpu_result;"]
            if proto.restype == shim.error_type:
                at_exit = shim.success if proto.name in shim.released_at_exit else shim.gone
                exiting = [f"    else if ({shim.gone_check}())",
                           f"        vgpu_result = {at_exit};"]
        body = [*head,
                "    struct vgpu_pending_exception vgpu_pending = vgpu_set_aside_exception();",
                f"    if ({shim.ready}())", run, *exiting,
                "    vgpu_end_call(vgpu_pending);", *tail]
        out += [proto.declaration.removesuffix(";"), "{", *body, "}", ""]
    return "\n".join(out)


def _declare(ctype: str, name: str) -> str:
    """A declaration of `name` with a type written as in a cast (`void **` -> `void **name`).
    Every type in the API headers is a plain or pointer type here (arrays decayed, function
    pointers typedef'd); anything else must fail the generator, not the build."""
    if "(" in ctype or "[" in ctype:
        raise ValueError(f"cannot declare {name!r} of type {ctype!r}")
    return f"{ctype}{name}" if ctype.endswith("*") else f"{ctype} {name}"


def _symbol_table(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    names = list(headers.prototypes)
    out = [banner, f'#include "{shim.prefix}_shim.h"', "",
           "/* Indexed by fn_id. */",
           f"const size_t vgpu_{shim.prefix}_symbol_count = {len(names)};",
           f"const char *const vgpu_{shim.prefix}_symbols[] = {{"]
    out += [f"    {_c_string(name)}," for name in names]
    out += ["};", "", f"void *const vgpu_{shim.prefix}_entries[] = {{"]
    out += [f"    (void *)&{name}," for name in names]
    out += ["};", ""]
    return "\n".join(out)


def _driver_tables(headers: DriverHeaders) -> str:
    flavours = {"": "VGPU_FLAVOUR_LEGACY", "_ptds": "VGPU_FLAVOUR_PER_THREAD",
                "_ptsz": "VGPU_FLAVOUR_PER_THREAD"}
    results = {value: member for member, value in
               next(e for e in headers.enums if e.name == "CUresult").members}
    entries = sorted(headers.proc_address,
                     key=lambda e: (e.base.encode(), flavours[e.flavour], e.version))
    out = ["",
           "/* Sorted by base name (strcmp order), then flavour, then version. */",
           f"const size_t vgpu_driver_proc_entry_count = {len(entries)};",
           "const struct vgpu_proc_entry vgpu_driver_proc_entries[] = {"]
    out += [f"    {{{_c_string(e.base)}, {e.version}, {flavours[e.flavour]}, "
            f"(void *)&{e.symbol}}}," for e in entries]
    out += ["};", "",
            "/* Sorted by value. */",
            f"const size_t vgpu_driver_result_count = {len(results)};",
            "const struct vgpu_result_text vgpu_driver_results[] = {"]
    out += [f"    {{{value}, {_c_string(name)}, {_c_string(_error_text(headers, value, name))}}},"
            for value, name in sorted(results.items())]
    out += ["};", ""]
    return "\n".join(out)


def _version_script(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    """Exports exactly the API's symbols (and the module's init, so Python can import it),
    under the symbol version the real library gives them, if any."""
    symbols = [*headers.prototypes, f"PyInit__{shim.library}"]
    return "\n".join([banner, f"{shim.version_node or ''} {{".lstrip(), "  global:",
                      *(f"    {s};" for s in symbols), "  local: *;", "};", ""])
