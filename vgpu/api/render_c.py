"""Writes a shim's generated C: declarations, one stub per exported symbol, lookup tables.

A stub has the exact prototype the headers give its symbol. It packs pointers to its
arguments into `void *vgpu_args[]` and hands them, with the symbol's fn_id (its position in
the function table), to the shim's dispatch function, which reaches Python. A function whose
return type is not the API's error code (`void **__cudaRegisterFatBinary`, `void
__cudaRegisterFunction`, `const char *cudaGetErrorString`) also passes the address of a
zero-initialized result, which Python fills in; it stays zero when the call cannot run.
Functions that must work even when Python cannot start (cuGetProcAddress, cuGetErrorString,
...) are written by hand in shim/c/ and get no generated stub.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.api.driver_headers import FOREIGN_TYPES, DriverHeaders
from vgpu.api.header_parser import ApiHeaders
from vgpu.api.runtime_headers import RuntimeHeaders

__all__ = ["ShimSpec", "DRIVER_SHIM", "RUNTIME_SHIM", "render_driver_sources",
           "render_runtime_sources", "first_sentence"]


@dataclass(frozen=True, slots=True)
class ShimSpec:
    """What differs between the shims' generated C."""

    library: str                     # "libcuda": names the module (PyInit__libcuda), map file
    prefix: str                      # "driver": names the C files and tables
    error_type: str                  # the return type that is the call's result code
    hand_written: frozenset[str]     # symbols implemented in shim/c/, no generated stub
    version_node: str | None         # symbol version of every export (cudart: libcudart.so.13)

    @property
    def dispatch(self) -> str:
        return f"vgpu_{self.prefix}_dispatch"


DRIVER_SHIM = ShimSpec(
    library="libcuda",
    prefix="driver",
    error_type="CUresult",
    hand_written=frozenset({"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetErrorName",
                            "cuGetErrorString", "cuGetExportTable"}),
    version_node=None,  # real libcuda's symbols carry no version
)

RUNTIME_SHIM = ShimSpec(
    library="libcudart",
    prefix="runtime",
    error_type="cudaError_t",
    hand_written=frozenset(),
    version_node="libcudart.so.13",  # what nvcc -cudart shared binaries import
)


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def first_sentence(doc: str) -> str:
    """`cuGetErrorString`'s text: the first sentence of the error's doc comment."""
    end = doc.find(". ")
    return (doc[:end] if end >= 0 else doc).rstrip(".")


def render_driver_sources(headers: DriverHeaders, banner: str) -> dict[str, str]:
    """File name (in shim/generated/) -> contents, for libcuda."""
    shim = DRIVER_SHIM
    return {
        "cuda_types.h": f"{banner}\n{FOREIGN_TYPES}{headers.types_text}",
        "cuda_functions.h": _prototypes(headers, banner),
        "driver_stubs.c": _stubs(headers, shim, banner),
        "driver_tables.c": _symbol_table(headers, shim, banner) + _driver_tables(headers),
        f"{shim.library}.map": _version_script(headers, shim, banner),
    }


def render_runtime_sources(headers: RuntimeHeaders, banner: str) -> dict[str, str]:
    """File name (in shim/generated/) -> contents, for libcudart. Its types come twice: for
    C as the headers wrote them, for cffi without the alignment attributes it cannot read."""
    shim = RUNTIME_SHIM
    return {
        "cudart_types.h": f"{banner}\n{FOREIGN_TYPES}{headers.c_types_text}",
        "cudart_cdef.h": f"{banner}\n{FOREIGN_TYPES}{headers.types_text}",
        "cudart_functions.h": _prototypes(headers, banner),
        "runtime_stubs.c": _stubs(headers, shim, banner),
        "runtime_tables.c": _symbol_table(headers, shim, banner),
        f"{shim.library}.map": _version_script(headers, shim, banner),
    }


def _prototypes(headers: ApiHeaders, banner: str) -> str:
    return banner + "\n" + "".join(f"{proto.declaration}\n"
                                   for proto in headers.prototypes.values())


def _stubs(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    out = [banner, f'#include "{shim.prefix}_shim.h"', ""]
    for fn_id, proto in enumerate(headers.prototypes.values()):
        if proto.name in shim.hand_written:
            continue
        body = []
        if proto.params:
            pointers = ", ".join(f"&{param.name}" for param in proto.params)
            body.append(f"    void *vgpu_args[] = {{{pointers}}};")
        args = "vgpu_args" if proto.params else "NULL"
        if proto.restype == shim.error_type:
            body.append(f"    return ({proto.restype}){shim.dispatch}({fn_id}, {args}, NULL);")
        elif proto.restype == "void":
            body.append(f"    {shim.dispatch}({fn_id}, {args}, NULL);")
        else:
            body = [f"    {_declare(proto.restype, 'vgpu_result')} = {{0}};", *body,
                    f"    {shim.dispatch}({fn_id}, {args}, &vgpu_result);",
                    "    return vgpu_result;"]
        out += [proto.declaration.removesuffix(";"), "{", *body, "}", ""]
    return "\n".join(out)


def _declare(ctype: str, name: str) -> str:
    """A variable declaration of a type written as in a cast (`void **` -> `void **name`)."""
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
    out += [f"    {{{value}, {_c_string(name)}, "
            f"{_c_string(first_sentence(headers.result_docs.get(value, name)))}}},"
            for value, name in sorted(results.items())]
    out += ["};", ""]
    return "\n".join(out)


def _version_script(headers: ApiHeaders, shim: ShimSpec, banner: str) -> str:
    """Exports exactly the API's symbols (and the module's init, so Python can import it),
    under the symbol version the real library gives them, if any."""
    symbols = [*headers.prototypes, f"PyInit__{shim.library}"]
    return "\n".join([banner, f"{shim.version_node or ''} {{".lstrip(), "  global:",
                      *(f"    {s};" for s in symbols), "  local: *;", "};", ""])
