"""Everything the driver shim needs to know about NVIDIA's driver API headers, read in one go.

Reads cuda.h and the headers real libcuda also serves (cudaProfiler.h, cudaGL.h, cudaVDPAU.h,
cudaEGL.h) twice: once as an application sees them (versioned names: `cuMemAlloc_v2`) and
once as the driver itself compiles them (`__CUDA_API_VERSION_INTERNAL`: the old unversioned
symbols it still exports, such as `cuMemAlloc` taking `unsigned int`, and the per-thread
default stream variants `_ptds`/`_ptsz`). The union of the two is the exported symbol set.
The `*Typedefs.h` headers supply the CUDA version at which each symbol became the answer of
`cuGetProcAddress` (see proc_address.py).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cffi
from pycparser import c_ast

from vgpu.api.header_parser import (
    Prototype,
    evaluate_int_expressions,
    fold_array_sizes,
    int_macro_names,
    keep_lines_from,
    parse_declarations,
    preprocess,
    render,
)
from vgpu.api.proc_address import ProcAddressEntry, map_pfn_typedefs

__all__ = ["DriverHeaders", "EnumType", "read_driver_headers"]

HEADERS = ("cuda.h", "cudaProfiler.h", "cudaGL.h", "cudaVDPAU.h", "cudaEGL.h")
TYPEDEF_HEADERS = ("cudaTypedefs.h", "cudaProfilerTypedefs.h", "cudaGLTypedefs.h",
                   "cudaVDPAUTypedefs.h", "cudaEGLTypedefs.h")
PUBLIC_DEFINES = ("CUDA_ENABLE_DEPRECATED",)  # no deprecation attributes
INTERNAL_DEFINES = ("__CUDA_API_VERSION_INTERNAL",
                    "__CUDA_API_VERSION_INTERNAL_ODR")  # no internal `*_MAX` enum members

# The window-system types cudaGL.h, cudaEGL.h and cudaVDPAU.h take from GL, EGL and VDPAU
# headers, which a build machine need not have. Their ABI is fixed by those APIs.
FOREIGN_HEADERS = {
    "GL/gl.h": "typedef unsigned int GLuint;\ntypedef unsigned int GLenum;\n",
    "EGL/egl.h": ("typedef void *EGLImageKHR;\ntypedef void *EGLStreamKHR;\n"
                  "typedef void *EGLSyncKHR;\ntypedef int32_t EGLint;\n"),
    "EGL/eglext.h": "",
    "vdpau/vdpau.h": (
        "typedef uint32_t VdpDevice;\ntypedef uint32_t VdpVideoSurface;\n"
        "typedef uint32_t VdpOutputSurface;\ntypedef uint32_t VdpChromaType;\n"
        "typedef uint32_t VdpRGBAFormat;\ntypedef uint32_t VdpFuncId;\ntypedef int VdpStatus;\n"
        "typedef VdpStatus VdpGetProcAddress(VdpDevice device, VdpFuncId function_id,\n"
        "                                    void **function_pointer);\n"),
}
FOREIGN_TYPES = "".join(FOREIGN_HEADERS.values())

# `#define`d integers worth a Python name (flags, sizes, pointer constants given as ints).
_MACRO_PATTERN = r"CUDA_VERSION|CU_[A-Z0-9_]+|CUDA_[A-Z0-9_]+"


@dataclass(frozen=True, slots=True)
class EnumType:
    """A C enum under its typedef name, members in header order, and the typedefs aliasing it."""

    name: str
    members: tuple[tuple[str, int], ...]
    aliases: tuple[str, ...]


@dataclass
class DriverHeaders:
    """The driver API as the headers declare it."""

    types_text: str                      # typedefs, structs, unions, enums (cffi-parsable C)
    prototypes: dict[str, Prototype]     # every exported symbol, sorted by name
    proc_address: list[ProcAddressEntry]
    enums: list[EnumType]
    macros: dict[str, int]
    result_docs: dict[int, str]          # CUresult value -> its doc comment in cuda.h

    def enum_of(self, ctype: str) -> str | None:
        """The enum a parameter type names (through aliases), if it is one."""
        for enum in self.enums:
            if ctype == enum.name or ctype in enum.aliases:
                return enum.name
        return None


def read_driver_headers(include: Path) -> DriverHeaders:
    with tempfile.TemporaryDirectory() as tmp:
        foreign = Path(tmp)
        for name, text in FOREIGN_HEADERS.items():
            (foreign / name).parent.mkdir(parents=True, exist_ok=True)
            (foreign / name).write_text(f"#include <stdint.h>\n{text}")
        dirs = [foreign, include]
        return _read(include, dirs)


def _includes(headers: tuple[str, ...], defines: tuple[str, ...] = ()) -> str:
    """Source including `headers`; cudaVDPAU.h expects vdpau.h to be included before it."""
    return "".join([*(f"#define {d}\n" for d in defines),
                    *(f"#include <{h}>\n" for h in (*FOREIGN_HEADERS, *headers))])


def _read(include: Path, dirs: list[Path]) -> DriverHeaders:
    def declarations(headers: tuple[str, ...], defines: tuple[str, ...]):
        own = keep_lines_from(preprocess(_includes(headers), dirs, defines), include)
        return parse_declarations(own, FOREIGN_TYPES)

    public = declarations(HEADERS, PUBLIC_DEFINES)
    internal = declarations(HEADERS, INTERNAL_DEFINES)
    fold_array_sizes(internal, _includes(HEADERS, INTERNAL_DEFINES), dirs)
    prototypes = dict(internal.prototypes)
    for name, proto in public.prototypes.items():
        if name in prototypes and prototypes[name].signature != proto.signature:
            raise ValueError(f"{name} differs between the public and internal views")
        prototypes[name] = proto  # the public view has the documented parameter names
    prototypes = dict(sorted(prototypes.items()))

    types_text = internal.types_text()
    ffi = cffi.FFI()
    ffi.cdef(FOREIGN_TYPES + types_text)

    typedefs = declarations(TYPEDEF_HEADERS, INTERNAL_DEFINES)
    fold_array_sizes(typedefs, _includes(TYPEDEF_HEADERS, INTERNAL_DEFINES), dirs)
    pfns = [node for node in typedefs.types
            if isinstance(node, c_ast.Typedef) and node.name.startswith("PFN_")]
    ffi.cdef(render(pfns))
    proc_address = map_pfn_typedefs(
        [node.name for node in pfns], prototypes,
        lambda pfn, symbol: ffi.typeof(pfn) is ffi.typeof(_pointer_type(prototypes[symbol])))

    macro_source = _includes(HEADERS)
    macros = evaluate_int_expressions(
        macro_source, dirs, int_macro_names(macro_source, dirs, _MACRO_PATTERN))
    return DriverHeaders(
        types_text=types_text,
        prototypes=prototypes,
        proc_address=proc_address,
        enums=_enums(internal.types, ffi),
        macros=macros,
        result_docs=_result_docs((include / "cuda.h").read_text()),
    )


def _pointer_type(proto: Prototype) -> str:
    return f"{proto.restype} (*)({', '.join(p.ctype for p in proto.params) or 'void'})"


def _enums(types: list[c_ast.Node], ffi: cffi.FFI) -> list[EnumType]:
    """Enums with a body, named by the typedef that declares them; other typedefs are aliases."""
    primary: dict[str, list[str]] = {}  # typedef name -> member names, in header order
    for node in types:
        if (isinstance(node, c_ast.Typedef) and isinstance(node.type, c_ast.TypeDecl)
                and isinstance(node.type.type, c_ast.Enum) and node.type.type.values):
            primary[node.name] = [e.name for e in node.type.type.values.enumerators]
    by_ctype = {ffi.typeof(name): name for name in primary}
    aliases: dict[str, list[str]] = {name: [] for name in primary}
    for node in types:
        if isinstance(node, c_ast.Typedef) and node.name not in primary:
            target = by_ctype.get(ffi.typeof(node.name))
            if target is not None:
                aliases[target].append(node.name)
    enums = []
    for name, members in primary.items():
        values = ffi.typeof(name).relements
        enums.append(EnumType(name, tuple((m, values[m]) for m in members),
                              tuple(aliases[name])))
    return enums


_RESULT_DOC = re.compile(r"/\*\*(.*?)\*/\s*(CUDA_[A-Z0-9_]+)\s*=\s*(\d+)", re.DOTALL)


def _result_docs(cuda_h: str) -> dict[int, str]:
    """CUresult value -> the doc comment above it in cuda.h, as one plain-text paragraph."""
    start = cuda_h.index("typedef enum cudaError_enum")
    body = cuda_h[start:cuda_h.index("} CUresult;", start)]
    docs = {}
    for comment, _, value in _RESULT_DOC.findall(body):
        text = " ".join(line.strip().lstrip("*").strip() for line in comment.splitlines())
        text = text.replace("::", "").replace("\\deprecated", "Deprecated:")
        text = re.sub(r"\\[a-z]+ ", "", text)  # doxygen markup: \p name, \e word
        docs[int(value)] = re.sub(r"\s+", " ", text).strip()
    return docs
