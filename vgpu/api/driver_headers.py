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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pycparser import c_ast

from vgpu.api.header_parser import (
    ApiHeaders,
    Declarations,
    check_same_types,
    enum_types,
    fold_array_sizes,
    int_macros,
    keep_lines_from,
    parse_declarations,
    preprocess,
    render,
)
from vgpu.api.proc_address import ProcAddressEntry, map_pfn_typedefs, pfn_name

__all__ = ["DriverHeaders", "read_driver_headers", "foreign_include_dir", "FOREIGN_HEADERS",
           "FOREIGN_TYPES"]

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


@dataclass
class DriverHeaders(ApiHeaders):
    """The driver API as the headers declare it, with what only the driver needs."""

    proc_address: list[ProcAddressEntry] = field(default_factory=list)
    result_docs: dict[int, str] = field(default_factory=dict)  # CUresult -> cuda.h's comment


@contextmanager
def foreign_include_dir() -> Iterator[Path]:
    """A temporary include dir holding FOREIGN_HEADERS (GL/gl.h, EGL/egl.h, vdpau/vdpau.h)."""
    with tempfile.TemporaryDirectory() as tmp:
        foreign = Path(tmp)
        for name, text in FOREIGN_HEADERS.items():
            (foreign / name).parent.mkdir(parents=True, exist_ok=True)
            (foreign / name).write_text(f"#include <stdint.h>\n{text}")
        yield foreign


def read_driver_headers(include: Path) -> DriverHeaders:
    with foreign_include_dir() as foreign:
        return _read(include, [foreign, include])


def _includes(headers: tuple[str, ...], defines: tuple[str, ...] = ()) -> str:
    """Source including `headers`; cudaVDPAU.h expects vdpau.h to be included before it."""
    return "".join([*(f"#define {d}\n" for d in defines),
                    *(f"#include <{h}>\n" for h in (*FOREIGN_HEADERS, *headers))])


def _read(include: Path, dirs: list[Path]) -> DriverHeaders:
    def declarations(headers: tuple[str, ...], defines: tuple[str, ...]) -> Declarations:
        source = _includes(headers, defines)
        decls = parse_declarations(keep_lines_from(preprocess(source, dirs), include),
                                   FOREIGN_TYPES)
        fold_array_sizes(decls, source, dirs)
        return decls

    public = declarations(HEADERS, PUBLIC_DEFINES)
    internal = declarations(HEADERS, INTERNAL_DEFINES)
    prototypes = dict(internal.prototypes)
    for name, proto in public.prototypes.items():
        if name in prototypes and prototypes[name].signature != proto.signature:
            raise ValueError(f"{name} differs between the public and internal views")
        prototypes[name] = proto  # the public view has the documented parameter names
    prototypes = dict(sorted(prototypes.items()))
    types_text = internal.types_text()
    # What the shim's C compiles: if gcc accepts it, the declarations are complete.
    c_source = ("#include <stdint.h>\n#include <stddef.h>\n" + FOREIGN_TYPES + types_text
                + "".join(f"{proto.declaration}\n" for proto in prototypes.values()))

    pfns = [node for node in declarations(TYPEDEF_HEADERS, INTERNAL_DEFINES).types
            if isinstance(node, c_ast.Typedef) and node.name.startswith("PFN_")]
    proc_address = map_pfn_typedefs([node.name for node in pfns], prototypes)
    check_same_types([(pfn_name(e), f"&{e.symbol}") for e in proc_address],
                     c_source + render(pfns), [])

    return DriverHeaders(
        types_text=types_text,
        prototypes=prototypes,
        enums=enum_types(internal.types, c_source),
        macros=int_macros(_includes(HEADERS), dirs, _MACRO_PATTERN),
        proc_address=proc_address,
        result_docs=_result_docs((include / "cuda.h").read_text()),
    )


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
