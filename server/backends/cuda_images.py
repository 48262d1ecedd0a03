"""What the cuda backend reads from module images itself, before and besides its driver: the
kernels that may call printf or assert (their launches are waited for, their output
captured), and the module variables an image defines, in the order emu's loader places them
(from the PTX, or from the cubins' symbol tables of an image without PTX)."""

from __future__ import annotations

import re
import struct

from vgpu.fatbin import EntryKind, FatbinError, parse_fatbin
from vgpu.module_image import ELF_MAGIC

__all__ = ["is_binary", "printing_kernels", "declared_variables", "cubin_variables"]

SHT_SYMTAB, STT_OBJECT = 2, 1  # ELF's section type of a symbol table, and a data symbol


def is_binary(image: bytes) -> bool:
    """A fatbin, cubin or vgpu's linked PTX: not PTX text."""
    return image[:1] not in (b".", b"/", b"\n", b"\r", b"\t", b" ")


# PTX functions and what they call: where a kernel's printf or assert may be.
_FUNCTION = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.(?:entry|func)\s+"
                       r"(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", re.MULTILINE)
_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$][\w$]*)")
_PRINTING = {"vprintf", "__assertfail"}


class _Everything(set):
    """Every kernel: where the image does not say (no PTX), each may print."""

    def __contains__(self, name) -> bool:
        return True


def printing_kernels(image: bytes, ptx: list[str]) -> set[str]:
    """The kernels that may call printf or assert (then each launch is waited for, its
    output captured): those whose PTX reaches vprintf or __assertfail through its calls.
    Without PTX, all of them if the image names either anywhere (or is compressed)."""
    if not ptx:
        if image.startswith(b"\x7fELF") and not any(n.encode() in image for n in _PRINTING):
            return set()
        return _Everything()
    calls: dict[str, set[str]] = {}
    for text in ptx:
        found = list(_FUNCTION.finditer(text))
        for i, match in enumerate(found):
            end = found[i + 1].start() if i + 1 < len(found) else len(text)
            calls.setdefault(match.group(1), set()).update(
                _CALL.findall(text, match.end(), end))
    printing, changed = set(_PRINTING), True
    while changed:  # what calls a printing function prints
        changed = False
        for name, callees in calls.items():
            if name not in printing and callees & printing:
                printing.add(name)
                changed = True
    return printing - _PRINTING


def declared_variables(ptx: list[str]) -> list[tuple[str, int, bool]]:
    """(name, size, whether __managed__) of the module-scope .global and .const variables
    the PTX defines, in the order emu's loader places them (so a session moving between
    backends finds each at its place); by their declarations alone (size 0: unknown, not
    managed) where emu's parser does not read the PTX."""
    from ..emu.errors import PtxError
    from ..emu.parser import parse_module

    found = []
    for text in ptx:
        try:
            module = parse_module(text)
        except PtxError:
            found += [(name, 0, False) for name in _VARIABLE.findall(text)]
            continue
        found += [(v.name, v.size, v.managed) for v in module.variables.values()
                  if v.space in ("global", "const") and v.linkage != "extern"]
    return found


def cubin_variables(image: bytes) -> list[tuple[str, int]]:
    """(name, 0: size unknown) of the variables an image without PTX defines: the data
    objects in its cubins' ELF symbol tables (a fatbin's, or the cubin itself)."""
    if image.startswith(ELF_MAGIC):
        cubins = [image]
    else:
        try:
            cubins = [e.payload() for e in parse_fatbin(image) if e.kind == EntryKind.CUBIN]
        except FatbinError:
            return []
    names: dict[str, int] = {}
    for cubin in cubins:
        names.update(dict.fromkeys(_elf_data_symbols(cubin), 0))
    return list(names.items())


def _elf_data_symbols(elf: bytes) -> list[str]:
    """Names of the defined data objects of an ELF64 file's symbol table (a cubin's module
    variables are local symbols unless -rdc makes them visible; all are the driver's to
    find by name)."""
    try:
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
                    for i in range(shnum)]
        names = []
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != SHT_SYMTAB or not entsize:
                continue
            strings_at = sections[link][4]
            for at in range(offset, offset + size, entsize):
                name, info, _, shndx = struct.unpack_from("<IBBH", elf, at)
                if info & 0xF == STT_OBJECT and shndx:
                    end = elf.index(b"\0", strings_at + name)
                    text = elf[strings_at + name:end].decode(errors="replace")
                    if "$" not in text and not text.startswith("__unnamed_"):  # the compiler's
                        names.append(text)
        return names
    except (struct.error, IndexError, ValueError):  # not a whole ELF file: no names from it
        return []


# A module-scope variable's declaration in PTX: `.visible .global .align 4 .u32 name[4];`
_VARIABLE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.(?:global|const)\s+"
                       r"(?:\.align\s+\d+\s+)?(?:\.v\d\s+)?\.\w+\s+([A-Za-z_$%][\w$]*)",
                       re.MULTILINE)
