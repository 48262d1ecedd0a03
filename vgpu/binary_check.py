"""Look inside a program before `vgpu run` starts it.

vgpu replaces libcudart.so.13 and libcuda.so.1. A program may also carry NVIDIA's CUDA runtime
statically (what nvcc links by default); that runtime reaches the driver through private
export tables, which vgpu's libcuda provides, so such a program runs too. It is still told
apart here, for whoever needs to know which runtime a program uses:
- the symbol table defines `__cudaRegisterFatBinary`, the entry point of NVIDIA's runtime that
  nvcc's generated code calls (the static runtime binds its symbols locally, so only `.symtab`
  shows them; a `-cudart shared` program has it as an undefined import instead);
- a stripped executable keeps the runtime's private strings in `.rodata`: the names of its
  shared-memory segments (`/cudart.shm.`), which no program writes itself.

The ELF reader here is small and standard-library only: sections by name, symbols with their
GNU version names, NEEDED entries. Files are memory-mapped, so only the parts read are paged in.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

__all__ = [
    "BinaryCheckError",
    "BinaryReport",
    "ElfFile",
    "ElfSection",
    "ElfSymbol",
    "check_executable",
]

ELF_MAGIC = b"\x7fELF"
_SHT_NOBITS = 8
_SHN_UNDEF = 0
_DT_NEEDED = 1
_VERSYM_HIDDEN = 0x8000
_STATIC_CUDART_SYMBOLS = frozenset({"__cudaRegisterFatBinary"})
_STATIC_CUDART_STRINGS = (b"/cudart.shm.",)


class BinaryCheckError(ValueError):
    """The file cannot be read, or claims to be ELF but is damaged."""


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    address: int  # where the section is loaded (relative to the load base for PIE and .so)
    offset: int
    size: int
    link: int  # index of the associated section (a string table, for symbol tables)
    entsize: int


@dataclass(frozen=True)
class ElfSymbol:
    name: str
    defined: bool  # False for an import (section index SHN_UNDEF)
    binding: int  # 0 local, 1 global, 2 weak
    type: int  # 0 none, 1 object, 2 function, ...
    version: str | None = None  # GNU symbol version ("GLIBC_2.2.5", "libcudart.so.13")
    other: int = 0  # st_other: visibility, and in a cubin whether a function is a kernel


@dataclass(frozen=True)
class _Layout:
    """Struct layouts for one ELF class and byte order."""

    header: struct.Struct  # the part of the ELF header after e_ident
    section: struct.Struct
    symbol: struct.Struct
    dyn: struct.Struct
    verneed: struct.Struct
    vernaux: struct.Struct
    verdef: struct.Struct
    verdaux: struct.Struct
    half: struct.Struct


def _layout(is64: bool, order: str) -> _Layout:
    addr = "Q" if is64 else "I"
    return _Layout(
        # type, machine, version, entry, phoff, shoff, flags, ehsize, phentsize, phnum,
        # shentsize, shnum, shstrndx
        header=struct.Struct(f"{order}HHI{addr}{addr}{addr}IHHHHHH"),
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        section=struct.Struct(f"{order}II{addr}{addr}{addr}{addr}II{addr}{addr}"),
        # 64: name, info, other, shndx, value, size; 32: name, value, size, info, other, shndx
        symbol=struct.Struct(f"{order}IBBHQQ" if is64 else f"{order}IIIBBH"),
        dyn=struct.Struct(f"{order}q{addr}" if is64 else f"{order}i{addr}"),
        verneed=struct.Struct(f"{order}HHIII"),  # version, cnt, file, aux, next
        vernaux=struct.Struct(f"{order}IHHII"),  # hash, flags, other (index), name, next
        verdef=struct.Struct(f"{order}HHHHIII"),  # version, flags, ndx, cnt, hash, aux, next
        verdaux=struct.Struct(f"{order}II"),  # name, next
        half=struct.Struct(f"{order}H"),
    )


class ElfFile:
    """An ELF file's sections, symbols and dynamic entries, read on demand."""

    def __init__(self, data: bytes | mmap.mmap, name: str = "<ELF data>"):
        self._data = data
        self.name = name
        if len(data) < 16 or data[:4] != ELF_MAGIC:
            raise BinaryCheckError(f"{name}: not an ELF file")
        if data[4] not in (1, 2) or data[5] not in (1, 2):
            raise BinaryCheckError(f"{name}: damaged ELF file: unknown class {data[4]} or "
                                   f"byte order {data[5]}")
        self._layout = _layout(data[4] == 2, "<" if data[5] == 1 else ">")
        header = self._unpack(self._layout.header, 16, "ELF header")
        shoff, shentsize, shnum, shstrndx = header[5], header[10], header[11], header[12]
        self.sections: list[ElfSection] = []
        if shoff == 0 or shnum == 0:
            return  # no section table (e.g. sstrip-ed): nothing this reader can see
        if shentsize < self._layout.section.size:
            raise BinaryCheckError(f"{name}: damaged ELF file: section header size {shentsize}")
        raw = [self._unpack(self._layout.section, shoff + i * shentsize, "section table")
               for i in range(shnum)]
        if shstrndx >= shnum:
            raise BinaryCheckError(f"{name}: damaged ELF file: section name table index "
                                   f"{shstrndx} of {shnum}")
        names = raw[shstrndx]
        for s in raw:
            self.sections.append(ElfSection(
                name=self._string(names[4], names[5], s[0]), type=s[1], address=s[3], offset=s[4],
                size=s[5], link=s[6], entsize=s[9]))

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ElfFile:
        """Map the file at `path`; use as a context manager, or call close()."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 16:
                raise BinaryCheckError(f"{path}: not an ELF file ({size} bytes)")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return cls(data, str(path))
        except BinaryCheckError:
            data.close()
            raise

    def close(self) -> None:
        if isinstance(self._data, mmap.mmap):
            self._data.close()

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unpack(self, st: struct.Struct, offset: int, what: str) -> tuple:
        if offset < 0 or offset + st.size > len(self._data):
            raise BinaryCheckError(f"{self.name}: damaged ELF file: {what} at offset {offset} "
                                   f"runs past the end of the file ({len(self._data)} bytes)")
        return st.unpack_from(self._data, offset)

    def _string(self, table_offset: int, table_size: int, index: int) -> str:
        start = table_offset + index
        end = min(table_offset + table_size, len(self._data))
        stop = self._data.find(b"\0", start, end) if start < end else -1
        if stop < 0:
            raise BinaryCheckError(f"{self.name}: damaged ELF file: string {index} lies "
                                   f"outside its string table")
        return self._data[start:stop].decode("utf-8", errors="replace")

    def section(self, name: str) -> ElfSection | None:
        return next((s for s in self.sections if s.name == name), None)

    def section_data(self, name: str) -> bytes:
        """The bytes of the named section (empty for .bss-like sections)."""
        section = self.section(name)
        if section is None:
            raise BinaryCheckError(f"{self.name}: no section {name}")
        if section.type == _SHT_NOBITS:
            return b""
        if section.offset + section.size > len(self._data):
            raise BinaryCheckError(f"{self.name}: damaged ELF file: section {name} runs past "
                                   f"the end of the file")
        return bytes(self._data[section.offset:section.offset + section.size])

    def section_contains(self, name: str, needle: bytes) -> bool:
        section = self.section(name)
        if section is None or section.type == _SHT_NOBITS:
            return False
        return self._data.find(needle, section.offset, section.offset + section.size) >= 0

    def symbols(self) -> list[ElfSymbol]:
        """The full symbol table (`.symtab`; empty when the file is stripped)."""
        return self._symbols(".symtab", {})

    def dynamic_symbols(self) -> list[ElfSymbol]:
        """`.dynsym`, each symbol with its GNU version name where it has one."""
        return self._symbols(".dynsym", self._version_names())

    def _symbols(self, table: str, versions: dict[int, str]) -> list[ElfSymbol]:
        section = self.section(table)
        if section is None or section.size == 0:
            return []
        strings = self._linked(section)
        st = self._layout.symbol
        versym = self._versym() if versions else []
        out = []
        for i in range(section.size // st.size):
            fields = self._unpack(st, section.offset + i * st.size, table)
            if st.size == 24:  # ELF64 order: name, info, other, shndx, value, size
                name, info, other, shndx = fields[0], fields[1], fields[2], fields[3]
            else:  # ELF32 order: name, value, size, info, other, shndx
                name, info, other, shndx = fields[0], fields[3], fields[4], fields[5]
            index = versym[i] & ~_VERSYM_HIDDEN if i < len(versym) else 0
            out.append(ElfSymbol(
                name=self._string(strings.offset, strings.size, name),
                defined=shndx != _SHN_UNDEF, binding=info >> 4, type=info & 0xF,
                version=versions.get(index), other=other))
        return out

    def _linked(self, section: ElfSection) -> ElfSection:
        """The section `section` links to (its string table)."""
        if not 0 <= section.link < len(self.sections):
            raise BinaryCheckError(f"{self.name}: damaged ELF file: {section.name} links to "
                                   f"section {section.link} of {len(self.sections)}")
        return self.sections[section.link]

    def _versym(self) -> list[int]:
        section = self.section(".gnu.version")
        if section is None:
            return []
        half = self._layout.half
        return [self._unpack(half, section.offset + 2 * i, ".gnu.version")[0]
                for i in range(section.size // 2)]

    def _version_names(self) -> dict[int, str]:
        """Version index -> name, from the versions needed (`.gnu.version_r`) and defined
        (`.gnu.version_d`); indices 0 and 1 mean local and global, with no name."""
        names: dict[int, str] = {}
        lay = self._layout
        needed = self.section(".gnu.version_r")
        if needed is not None:
            strings = self._linked(needed)
            pos = needed.offset
            while True:
                _, count, _, aux, nxt = self._unpack(lay.verneed, pos, ".gnu.version_r")
                apos = pos + aux
                for _ in range(count):
                    _, _, index, name, anext = self._unpack(lay.vernaux, apos, ".gnu.version_r")
                    names[index] = self._string(strings.offset, strings.size, name)
                    apos += anext
                if nxt == 0:
                    break
                pos += nxt
        defined = self.section(".gnu.version_d")
        if defined is not None:
            strings = self._linked(defined)
            pos = defined.offset
            while True:
                _, _, index, _, _, aux, nxt = self._unpack(lay.verdef, pos, ".gnu.version_d")
                name, _ = self._unpack(lay.verdaux, pos + aux, ".gnu.version_d")
                names[index] = self._string(strings.offset, strings.size, name)
                if nxt == 0:
                    break
                pos += nxt
        return names

    def needed(self) -> list[str]:
        """The shared libraries the dynamic loader must load first (DT_NEEDED, in order)."""
        section = self.section(".dynamic")
        if section is None:
            return []
        strings = self._linked(section)
        st = self._layout.dyn
        out = []
        for i in range(section.size // st.size):
            tag, value = self._unpack(st, section.offset + i * st.size, ".dynamic")
            if tag == 0:  # DT_NULL ends the table
                break
            if tag == _DT_NEEDED:
                out.append(self._string(strings.offset, strings.size, value))
        return out


@dataclass
class BinaryReport:
    path: str
    is_elf: bool
    needed: list[str] = field(default_factory=list)
    uses_cudart_shared: bool = False  # NEEDED names libcudart.so.*
    has_static_cudart: bool = False  # carries NVIDIA's runtime itself (linked statically)
    has_fatbin: bool = False  # embeds device code (a .nv_fatbin section)


def check_executable(path: str | os.PathLike[str]) -> BinaryReport:
    """What `vgpu run` needs to know about a program before starting it.

    Scripts and other non-ELF files give `is_elf=False`. An unreadable file, or an ELF file
    too damaged to read, raises BinaryCheckError with a message naming the file.
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise BinaryCheckError(f"cannot read {path}: {exc.strerror or exc}") from None
    if magic != ELF_MAGIC:
        return BinaryReport(path=str(path), is_elf=False)
    try:
        with ElfFile.open(path) as elf:
            return _report(elf, str(path))
    except OSError as exc:
        raise BinaryCheckError(f"cannot read {path}: {exc.strerror or exc}") from None


def _report(elf: ElfFile, path: str) -> BinaryReport:
    needed = elf.needed()
    uses_shared = any(lib.startswith("libcudart.so") for lib in needed)
    return BinaryReport(
        path=path, is_elf=True, needed=needed, uses_cudart_shared=uses_shared,
        has_static_cudart=not uses_shared and _carries_cudart(elf),
        has_fatbin=elf.section(".nv_fatbin") is not None)


def _carries_cudart(elf: ElfFile) -> bool:
    if any(elf.section_contains(".rodata", s) for s in _STATIC_CUDART_STRINGS):
        return True
    return any(s.defined and s.name in _STATIC_CUDART_SYMBOLS
               for s in elf.symbols() + elf.dynamic_symbols())
