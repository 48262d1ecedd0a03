"""Everything the runtime shim needs to know about NVIDIA's CUDA runtime, read in one go.

The exported set is NVIDIA's own libcudart.so.13's, symbol versions included: an nvcc
`-cudart shared` binary imports `cudaMalloc@libcudart.so.13` and resolves only against a
library that defines that version. Prototypes come from cuda_runtime_api.h, read twice with
gcc's preprocessor (as usual, and with CUDA_API_PER_THREAD_DEFAULT_STREAM for the `_ptds` and
`_ptsz` variants), plus the private entry points nvcc's generated code calls
(`__cudaRegisterFatBinary`, `__cudaLaunchKernel`, ...), which only C++-only internal headers
declare and are therefore declared here, copied from crt/host_runtime.h and
crt/device_functions.h.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pycparser import c_ast

from vgpu.api.driver_headers import FOREIGN_TYPES, foreign_include_dir
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
    strip_attributes,
)

__all__ = ["RuntimeHeaders", "read_runtime_headers", "read_exported_symbols",
           "PRIVATE_DECLARATIONS"]

# No deprecation attributes: one before a struct's alignment (`struct __attribute__((
# deprecated(...))) __attribute__((aligned(16))) long4`) would hide it from strip_attributes.
PUBLIC_DEFINES = ("CUDA_ENABLE_DEPRECATED", "__NV_NO_VECTOR_DEPRECATION_DIAG")
PER_THREAD_DEFINES = (*PUBLIC_DEFINES, "CUDA_API_PER_THREAD_DEFAULT_STREAM")
# Interop headers too: NVIDIA's libcudart exports their functions. vdpau.h must come first.
HEADERS = ("vdpau/vdpau.h", "cuda_runtime_api.h", "cuda_profiler_api.h", "cuda_gl_interop.h",
           "cuda_vdpau_interop.h", "cuda_egl_interop.h")
SOURCE = "".join(f"#include <{header}>\n" for header in HEADERS)

# The entry points of nvcc's generated host code, with their real prototypes (C++ headers
# declare them `extern "C"`), except that `hostFun`, the address of the host stub, is a
# `const void *` rather than a `const char *` (the same ABI), so no one reads it as text.
# Three exports appear in no header at all; their parameters are unknown, and a function
# declared without any can be called with any: they answer cudaErrorNotSupported.
PRIVATE_DECLARATIONS = """
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                              char *deviceAddress, const char *deviceName, int ext, size_t size,
                              int constant, int global);
char __cudaInitModule(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const void *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize);
unsigned int __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                         struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaRegisterHostVar(void);
cudaError_t __cudaGetProcAddress(void);
cudaError_t __cudaRegisterUnifiedTable(void);
"""

# `#define`d integers worth a Python name (flags such as cudaHostAllocMapped, versions).
_MACRO_PATTERN = r"cuda[A-Z][A-Za-z0-9_]*|CUDART_VERSION"


@dataclass
class RuntimeHeaders(ApiHeaders):
    """The runtime API, with NVIDIA's exported symbol versions. Its `types_text` keeps the
    alignment attributes (they are ABI), which cffi cannot read: see `_c_types`."""

    symbol_versions: dict[str, str] = field(default_factory=dict)


def read_exported_symbols(library: Path) -> dict[str, str]:
    """Function name -> symbol version, as `readelf --dyn-syms` lists NVIDIA's library."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True,
                         text=True, check=True).stdout
    exported = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[3] == "FUNC" and fields[6] != "UND":
            name, _, version = fields[7].partition("@@")
            exported[name] = version
    return dict(sorted(exported.items()))


def read_runtime_headers(include: Path, symbol_versions: dict[str, str]) -> RuntimeHeaders:
    with foreign_include_dir() as foreign:
        return _read(include, [foreign, include], symbol_versions)


def _read(include: Path, dirs: list[Path], symbol_versions: dict[str, str]) -> RuntimeHeaders:
    def declarations(defines: tuple[str, ...]) -> tuple[Declarations, str, list]:
        raw = keep_lines_from(preprocess(SOURCE, dirs, defines), include)
        text, attributed = strip_attributes(raw)
        # The per-thread view defines static inline forwarders (`cudaLaunchKernel` calls
        # `cudaLaunchKernel_ptsz`); pycparser knows `inline` but not GNU's spelling.
        decls = parse_declarations(re.sub(r"\b__inline__\b", "inline", text), FOREIGN_TYPES)
        fold_array_sizes(decls, "".join(f"#define {d}\n" for d in defines) + SOURCE, dirs)
        return decls, raw, attributed

    public, raw_types, attributed = declarations(PUBLIC_DEFINES)
    per_thread, _, _ = declarations(PER_THREAD_DEFINES)
    private = parse_declarations(PRIVATE_DECLARATIONS, prelude=FOREIGN_TYPES + render(public.types))
    found = {**per_thread.prototypes, **public.prototypes, **private.prototypes}
    missing = sorted(set(symbol_versions) - set(found))
    if missing:
        raise ValueError(f"exported by libcudart but declared nowhere: {missing}")
    prototypes = {name: found[name] for name in symbol_versions}

    c_types = f"#include <stddef.h>\n#include <stdint.h>\n{FOREIGN_TYPES}{raw_types}"
    c_source = c_types + "".join(f"{p.declaration}\n" for p in prototypes.values())
    check_same_types([], c_source, [])  # our prototypes agree with NVIDIA's declarations
    alignments = {name: attribute for name, attribute in attributed if "aligned" in attribute}
    return RuntimeHeaders(
        types_text=_c_types(public.types, alignments),
        prototypes=prototypes,
        enums=enum_types(public.types, c_source),
        macros=int_macros(SOURCE, dirs, _MACRO_PATTERN,
                          exclude=lambda value: _names_function(value, found)),
        symbol_versions=symbol_versions,
    )


def _names_function(expansion: str, functions: dict) -> bool:
    """A macro that renames a function (`cudaMemcpy` -> `__CUDART_API_PTDS(cudaMemcpy)`)."""
    return expansion in functions or expansion.startswith("__CUDART_API_PT")


def _c_types(types: list[c_ast.Node], alignments: dict[str, str]) -> str:
    """The declarations as C reads them. An over-aligned struct (`int2`, aligned to 8) keeps
    its attribute after its closing brace, where the shims' build finds it: cffi reads no
    attributes, so its cdef ends such a struct in `...;` and takes the layout from the
    compiler (shim/shim_builder.py)."""
    out = []
    for node in types:
        text = render([node])
        struct = getattr(node, "type", None)
        if isinstance(struct, (c_ast.Struct, c_ast.Union)) and struct.name in alignments \
                and struct.decls:
            head, _, tail = text.rpartition("}")
            text = f"{head}}} {alignments[struct.name]}{tail}"
        out.append(text)
    return re.sub(r"\n{3,}", "\n\n", "".join(out))
