"""Writes the generated Python modules: cudadefs.py (enums, constants) and the function table."""

from __future__ import annotations

import textwrap

from vgpu.api.driver_headers import DriverHeaders

__all__ = ["render_cudadefs", "render_function_table"]


def _wrapped_string(text: str, indent: str) -> str:
    """A long string as implicitly concatenated literals, so the module stays ruff-clean."""
    lines = textwrap.wrap(text, width=80, break_long_words=False, break_on_hyphens=False)
    chunks = [line + " " for line in lines[:-1]] + lines[-1:]
    if len(chunks) == 1:
        return repr(chunks[0])
    inner = "".join(f"{indent}    {chunk!r}\n" for chunk in chunks)
    return f"(\n{inner}{indent})"


def render_cudadefs(headers: DriverHeaders, banner: str) -> str:
    names = [enum.name for enum in headers.enums]
    names += [alias for enum in headers.enums for alias in enum.aliases]
    names += ["CURESULT_DOC", *headers.macros]
    out = [
        banner,
        '"""The CUDA driver API\'s enums and integer constants, from NVIDIA\'s cuda.h.',
        "",
        "Each enum is an `enum.IntEnum` named like its C typedef, members named like C's",
        "(`CUresult.CUDA_ERROR_INVALID_VALUE`); typedefs that alias an enum are aliases here too.",
        "`#define`d integers keep their names; pointer constants (`CU_LAUNCH_PARAM_END`,",
        "`CU_STREAM_LEGACY`) are given as the integers they cast. `CURESULT_DOC` maps each",
        "CUresult value to its doc comment in cuda.h.",
        '"""',
        "",
        "import enum",
        "",
        "__all__ = [",
        *(f'    "{name}",' for name in names),
        "]",
    ]
    for enum in headers.enums:
        out += ["", "", f"class {enum.name}(enum.IntEnum):"]
        out += [f"    {member} = {value}" for member, value in enum.members]
        out += [f"{alias} = {enum.name}" for alias in enum.aliases]
    out += ["", "", "CURESULT_DOC: dict[int, str] = {"]
    out += [f"    {value}: {_wrapped_string(doc, '    ')},"
            for value, doc in sorted(headers.result_docs.items())]
    out += ["}", ""]
    out += [f"{name} = {value}" for name, value in sorted(headers.macros.items())]
    return "\n".join(out) + "\n"


def render_function_table(headers: DriverHeaders, banner: str) -> str:
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
    for proto in headers.prototypes.values():
        params = tuple((p.ctype, p.name, headers.enum_of(p.ctype)) for p in proto.params)
        out.append(f"    {(proto.name, base_of[proto.name], proto.restype, params)!r},")
    out += [")", "", "PROC_ADDRESS = ("]
    out += [f"    {(e.base, e.version, e.flavour, e.symbol)!r}," for e in headers.proc_address]
    out += [")", ""]
    return "\n".join(out)
