"""Writes the generated Python modules: the enum modules (cudadefs.py, cudartdefs.py) and
the function tables."""

from __future__ import annotations

import textwrap

from vgpu.api.driver_headers import DriverHeaders
from vgpu.api.header_parser import ApiHeaders
from vgpu.api.runtime_headers import RuntimeHeaders

__all__ = ["render_cudadefs", "render_cudartdefs", "render_driver_table",
           "render_runtime_table"]


def _wrapped_string(text: str, indent: str) -> str:
    """A long string as implicitly concatenated literals, so the module stays ruff-clean."""
    lines = textwrap.wrap(text, width=80, break_long_words=False, break_on_hyphens=False)
    chunks = [line + " " for line in lines[:-1]] + lines[-1:]
    if len(chunks) == 1:
        return repr(chunks[0])
    inner = "".join(f"{indent}    {chunk!r}\n" for chunk in chunks)
    return f"(\n{inner}{indent})"


def _enum_module(headers: ApiHeaders, banner: str, docstring: list[str],
                 extra_names: list[str], extra: list[str]) -> str:
    names = [enum.name for enum in headers.enums]
    names += [alias for enum in headers.enums for alias in enum.aliases]
    names += [*extra_names, *headers.macros]
    out = [banner, *docstring, "", "from vgpu.api.lazy_enums import lazy_enums", "",
           "__all__ = [",
           *(f'    "{name}",' for name in names), "]", "",
           "# Each enum's members, in cuda.h's order (equal values make aliases).",
           "_MEMBERS: dict[str, tuple[tuple[str, int], ...]] = {"]
    for enum in headers.enums:
        out.append(f'    "{enum.name}": (')
        out += [f'        ("{member}", {value}),' for member, value in enum.members]
        out.append("    ),")
    out += ["}", "_ALIASES: dict[str, str] = {"]
    out += [f'    "{alias}": "{enum.name}",' for enum in headers.enums for alias in enum.aliases]
    out += ["}", "# Each enum is made on first use (vgpu/api/lazy_enums.py).",
            "__getattr__, __dir__ = lazy_enums(globals(), _MEMBERS, _ALIASES)", "", *extra]
    out += [f"{name} = {value}" for name, value in sorted(headers.macros.items())]
    return "\n".join(out) + "\n"


def render_cudadefs(headers: DriverHeaders, banner: str) -> str:
    docstring = [
        '"""The CUDA driver API\'s enums and integer constants, from NVIDIA\'s cuda.h.',
        "",
        "Each enum is an `enum.IntEnum` named like its C typedef, members named like C's",
        "(`CUresult.CUDA_ERROR_INVALID_VALUE`); typedefs that alias an enum are aliases here too.",
        "`#define`d integers keep their names; pointer constants (`CU_LAUNCH_PARAM_END`,",
        "`CU_STREAM_LEGACY`) are given as the integers they cast. `CURESULT_DOC` maps each",
        "CUresult value to its doc comment in cuda.h.",
        '"""',
    ]
    docs = ["CURESULT_DOC: dict[int, str] = {"]
    docs += [f"    {value}: {_wrapped_string(doc, '    ')},"
             for value, doc in sorted(headers.result_docs.items())]
    docs += ["}", ""]
    return _enum_module(headers, banner, docstring, ["CURESULT_DOC"], docs)


def render_cudartdefs(headers: RuntimeHeaders, banner: str) -> str:
    docstring = [
        '"""The CUDA runtime API\'s enums and integer constants, from cuda_runtime_api.h.',
        "",
        "Each enum is an `enum.IntEnum` named like its C enum tag (`cudaError`, members",
        "`cudaError.cudaErrorInvalidValue`); typedefs of it (`cudaError_t`) are aliases.",
        "`#define`d integers (`cudaHostAllocMapped`, `CUDART_VERSION`) keep their names.",
        '"""',
    ]
    return _enum_module(headers, banner, docstring, [], [])


def _function_rows(headers: ApiHeaders, base_of: dict[str, str]) -> list[str]:
    rows = []
    for proto in headers.prototypes.values():
        params = tuple((p.ctype, p.name, headers.enum_of(p.ctype)) for p in proto.params)
        rows.append(f"    {(proto.name, base_of[proto.name], proto.restype, params)!r},")
    return rows


def render_driver_table(headers: DriverHeaders, banner: str) -> str:
    out = [
        banner,
        '"""Every function libcuda.so.1 exports, as cuda.h declares it.',
        "",
        "Read it through vgpu.api.table.",
        "",
        "FUNCTIONS: (symbol, base name, return type, ((C type, name, enum or None), ...)); the",
        "position of a function in this tuple is its fn_id in the C stubs.",
        "PROC_ADDRESS: (base name, CUDA version, flavour, symbol) for cuGetProcAddress.",
        '"""',
        "",
        "FUNCTIONS = (",
    ]
    base_of = {entry.symbol: entry.base for entry in headers.proc_address}
    out += _function_rows(headers, base_of)
    out += [")", "", "PROC_ADDRESS = ("]
    out += [f"    {(e.base, e.version, e.flavour, e.symbol)!r}," for e in headers.proc_address]
    out += [")", ""]
    return "\n".join(out)


def render_runtime_table(headers: RuntimeHeaders, banner: str) -> str:
    out = [
        banner,
        '"""Every function NVIDIA\'s libcudart.so.13 exports, as its headers declare it.',
        "",
        "Read it through vgpu.api.table.",
        "",
        "FUNCTIONS: (symbol, base name, return type, ((C type, name, enum or None), ...)); the",
        "position of a function in this tuple is its fn_id in the C stubs.",
        "SYMBOL_VERSIONS: symbol -> the ELF symbol version NVIDIA's library gives it.",
        '"""',
        "",
        "FUNCTIONS = (",
    ]
    # The runtime's per-thread variants are `cudaMemcpy_ptds`, `cudaMemcpyAsync_ptsz`.
    base_of = {name: name.removesuffix("_ptds").removesuffix("_ptsz")
               for name in headers.prototypes}
    out += _function_rows(headers, base_of)
    out += [")", "", "SYMBOL_VERSIONS = {"]
    out += [f"    {name!r}: {version!r}," for name, version in headers.symbol_versions.items()]
    out += ["}", ""]
    return "\n".join(out)

