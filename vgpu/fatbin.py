"""NVIDIA fatbins as nvcc embeds them: find the containers, list their entries, unpack them.

Both sides read fatbins: the shims inside the application (`__cudaRegisterFatBinary`,
`cuModuleLoadData`) and the server (the emu backend takes the PTX out of a loaded module).
Because it loads into the application's process it imports only the standard library, plus
`zstandard` or `lz4` when an entry compressed with them is unpacked.

Layout, all little-endian, as measured on nvcc 13.0 output (see tests/test_fatbin.py):

- Wrapper, the argument of `__cudaRegisterFatBinary` (NVIDIA's `fatbinary_section.h`,
  section `.nvFatBinSegment`): `{u32 magic 0x466243B1; u32 version; u64 data;
  u64 filename_or_fatbins}`. Version 1 is a translation unit's own image; version 2 is the
  device-link image, whose last field points at a (runtime-filled) list of prelinked fatbins.
- `data` points at ONE container in section `.nv_fatbin`: `{u32 magic 0xBA55ED50;
  u16 version (1); u16 header size (16); u64 size of the entries that follow}`. The section
  holds the containers of all wrappers back to back with no padding: first the device-link
  image (cubin only, no PTX, even in a default build), then one per translation unit. Several
  gencodes never produce several containers: they add entries to the one container. `-rdc`
  builds register the nvlink-ed image (cubin only) and keep each object's relocatable
  container (cubin + PTX) in section `__nv_relfatbin`, one wrapper each. So a wrapper's data is
  read as exactly one container: the next one in memory belongs to another wrapper.
- Entries follow the container header back to back: `{u16 kind; u16 (0x0101); u32 header
  size; u64 stored size (padded to 8); u32 compressed size (0 if stored plain); u32 offset of
  an options block in this header (0 if none); u16 minor, u16 major; u32 arch; ...; u64 flags
  at +0x28; ...; u64 uncompressed size at +0x38}` then the stored payload. Header sizes seen:
  0x40 (cubin), 0x48 (-G cubin), 0x50 (PTX), 0x60 (PTX of -rdc), 0x70 (sm_100f cubin),
  0x78 (LTO-IR). The options block is `{u32 text offset, u32 text length, text}`, e.g. the
  ptxas options "--compile-only" of -rdc PTX. For PTX the version is the PTX ISA (9.0), for
  cubins the ELF code version (1.8).
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag

__all__ = [
    "CONTAINER_MAGIC",
    "WRAPPER_MAGIC",
    "EntryFlags",
    "EntryKind",
    "FatbinEntry",
    "FatbinError",
    "FatbinWrapper",
    "parse_fatbin",
    "prelinked_ptx",
    "read_container_at",
    "read_wrapper_at",
    "require_ptx",
    "select_for_device",
    "select_ptx",
]

WRAPPER_MAGIC = 0x466243B1
CONTAINER_MAGIC = 0xBA55ED50

_WRAPPER = struct.Struct("<IIQQ")
_CONTAINER = struct.Struct("<IHHQ")
# kind, (0x0101), header size, stored size, compressed size, options offset, minor, major, arch
_ENTRY = struct.Struct("<HHIQIIHHI")
_ENTRY_FLAGS = struct.Struct("<Q")  # at +0x28
_ENTRY_UNCOMPRESSED = struct.Struct("<Q")  # at +0x38
_ENTRY_MIN_HEADER = 0x40
# Reading raw memory: refuse sizes no real image has rather than copy gigabytes of garbage.
_MAX_CONTAINER = 1 << 32
WRAPPER_VERSION_LINKED = 2  # the device-link image, with the list of prelinked containers
_MAX_PRELINKED = 1 << 16  # no real program has more objects: stop at corrupt lists
# LZ4 cannot expand a block by more than 255x, so a larger declared size is corruption.
_LZ4_MAX_RATIO = 255
# The most one compressed entry may unpack to: the largest PTX of real programs (CUB, thrust,
# whole libraries) is tens of MiB; a few bytes must not become gigabytes in the server.
MAX_ENTRY_BYTES = 256 << 20


class FatbinError(ValueError):
    """The bytes are not a fatbin vgpu can read, or hold no code usable here."""


class EntryKind(IntEnum):
    PTX = 1
    CUBIN = 2
    LTO_IR = 8  # NVVM IR from -dlto / code=lto_XX, linked by nvJitLink


class EntryFlags(IntFlag):
    """Entry flag bits; values seen: 0x11 plain, 0x8011 zstd, 0x2011 LZ4, 0x8013 with -G."""

    ADDRESS_64BIT = 0x1
    DEBUG = 0x2  # nvcc -G
    HOST_LINUX = 0x10
    COMPRESSED_LZ4 = 0x2000  # nvcc --compress-mode=speed: raw LZ4 block
    COMPRESSED_ZSTD = 0x8000  # nvcc 13's default and --compress-mode=size: zstd frame
    # Seen only on compressed LTO-IR, with a 32-bit value at +0x30: the compressed bytes are
    # further encoded (neither zstd nor LZ4 reads them), so vgpu cannot unpack such entries.
    ENCODED = 0x10000
    ARCH_SPECIFIC = 0x100000  # sm_90a / compute_90a: runs on exactly that arch
    FAMILY_SPECIFIC = 0x200000  # sm_100f / compute_100f


@dataclass(frozen=True)
class FatbinEntry:
    """One piece of device code in a container."""

    kind: int  # an EntryKind value, or a kind this module does not know
    arch: int  # 75 for sm_75 / compute_75
    version: tuple[int, int]  # (major, minor): PTX ISA version for PTX, ELF code version else
    flags: EntryFlags
    uncompressed_size: int  # 0 when the entry is stored plain
    stored: bytes = field(repr=False)  # as stored: compressed, or plain with NUL padding

    @property
    def compressed(self) -> bool:
        return bool(self.flags & (EntryFlags.COMPRESSED_LZ4 | EntryFlags.COMPRESSED_ZSTD))

    def describe(self) -> str:
        prefix = {EntryKind.PTX: "compute", EntryKind.LTO_IR: "lto"}.get(self.kind, "sm")
        suffix = "a" if self.flags & EntryFlags.ARCH_SPECIFIC else ""
        suffix += "f" if self.flags & EntryFlags.FAMILY_SPECIFIC else ""
        name = {EntryKind.PTX: "PTX", EntryKind.CUBIN: "cubin", EntryKind.LTO_IR: "LTO-IR"}
        return f"{name.get(self.kind, f'kind {self.kind}')} {prefix}_{self.arch}{suffix}"

    def payload(self) -> bytes:
        """The entry's code, decompressed (plain entries keep their trailing NUL padding)."""
        if self.flags & EntryFlags.ENCODED:
            raise FatbinError(f"{self.describe()}: payload is stored encoded (flag 0x10000), "
                              f"which vgpu cannot unpack")
        if self.compressed and self.uncompressed_size > MAX_ENTRY_BYTES:
            raise FatbinError(f"{self.describe()}: its header says it holds "
                              f"{self.uncompressed_size} bytes; vgpu unpacks at most "
                              f"{MAX_ENTRY_BYTES}")
        if self.flags & EntryFlags.COMPRESSED_ZSTD:
            data = _zstd_decompress(self.stored, self.uncompressed_size)
        elif self.flags & EntryFlags.COMPRESSED_LZ4:
            data = _lz4_decompress(self.stored, self.uncompressed_size)
        else:
            return self.stored
        if len(data) != self.uncompressed_size:
            raise FatbinError(f"{self.describe()}: decompressed to {len(data)} bytes, the "
                              f"entry header says {self.uncompressed_size}")
        return data

    def ptx_text(self) -> str:
        """PTX source text, without the NUL terminator and padding."""
        if self.kind != EntryKind.PTX:
            raise FatbinError(f"{self.describe()} is not PTX")
        try:
            return self.payload().rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FatbinError(f"{self.describe()}: PTX text is not UTF-8 ({exc})") from None


@dataclass(frozen=True)
class FatbinWrapper:
    """What `__cudaRegisterFatBinary` receives, with the container it points at copied out."""

    version: int  # 1: a translation unit's image; 2: the device-link image
    data_address: int
    container: bytes = field(repr=False)


def _zstd_decompress(data: bytes, size: int) -> bytes:
    import zstandard  # only when an entry needs it: keeps the application's import light

    # Read at most one byte more than the entry says it holds: a frame that would expand
    # further (zstd reaches ratios of 30,000:1) is refused before it costs more memory, and a
    # lying size field in the frame header allocates nothing.
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            out = bytearray()
            while len(out) <= size:
                piece = reader.read(size + 1 - len(out))
                if not piece:
                    break
                out += piece
    except zstandard.ZstdError as exc:
        raise FatbinError(f"corrupt zstd-compressed fatbin entry: {exc}") from None
    if len(out) > size:
        raise FatbinError(f"corrupt zstd-compressed fatbin entry: it unpacks to more than "
                          f"the {size} bytes its header says")
    return bytes(out)


def _lz4_decompress(data: bytes, size: int) -> bytes:
    import lz4.block

    if size > _LZ4_MAX_RATIO * len(data) + 16:
        raise FatbinError(f"corrupt LZ4-compressed fatbin entry: {len(data)} bytes cannot "
                          f"expand to the {size} its header says")
    try:
        return lz4.block.decompress(data, uncompressed_size=size)
    except lz4.block.LZ4BlockError as exc:
        raise FatbinError(f"corrupt LZ4-compressed fatbin entry: {exc}") from None


def parse_fatbin(data: bytes) -> list[FatbinEntry]:
    """All entries of the containers in `data` (one, or several back to back as in a
    `.nv_fatbin` section or an `nvcc -fatbin` file). Trailing NUL padding is allowed."""
    view = memoryview(data)
    if len(view) >= 4 and struct.unpack_from("<I", view)[0] == WRAPPER_MAGIC:
        raise FatbinError("this is a fatbin wrapper (magic 0x466243B1), which only points at "
                          "the fatbin: read it from memory with read_wrapper_at()")
    entries: list[FatbinEntry] = []
    offset = 0
    while True:
        entries.extend(_parse_container(view, offset))
        offset += _container_length(view, offset)
        if not any(view[offset:]):
            return entries


def _container_length(view: memoryview, offset: int) -> int:
    _, _, header_size, size = _CONTAINER.unpack_from(view, offset)
    return header_size + size


def _parse_container(view: memoryview, offset: int) -> list[FatbinEntry]:
    where = f"fatbin container at offset {offset}"
    if len(view) - offset < _CONTAINER.size:
        raise FatbinError(f"{where}: truncated header ({len(view) - offset} of "
                          f"{_CONTAINER.size} bytes)")
    magic, version, header_size, size = _CONTAINER.unpack_from(view, offset)
    if magic != CONTAINER_MAGIC:
        raise FatbinError(f"{where}: bad magic 0x{magic:08x} (expected 0x{CONTAINER_MAGIC:08x})")
    if version != 1 or header_size < _CONTAINER.size:
        raise FatbinError(f"{where}: unsupported container version {version} with header "
                          f"size {header_size} (vgpu reads version 1, header size 16)")
    end = offset + header_size + size
    if end > len(view):
        raise FatbinError(f"{where}: truncated: it declares {header_size + size} bytes, "
                          f"{len(view) - offset} are present")
    entries = []
    pos = offset + header_size
    while pos < end:
        entry, pos = _parse_entry(view, pos, end, where)
        entries.append(entry)
    return entries


def _parse_entry(view: memoryview, pos: int, end: int, where: str) -> tuple[FatbinEntry, int]:
    where = f"{where}, entry at offset {pos}"
    if end - pos < _ENTRY_MIN_HEADER:
        raise FatbinError(f"{where}: truncated entry header ({end - pos} bytes left)")
    kind, _, header_size, stored_size, compressed_size, _, minor, major, arch = \
        _ENTRY.unpack_from(view, pos)
    (flags,) = _ENTRY_FLAGS.unpack_from(view, pos + 0x28)
    (uncompressed,) = _ENTRY_UNCOMPRESSED.unpack_from(view, pos + 0x38)
    if header_size < _ENTRY_MIN_HEADER:
        raise FatbinError(f"{where}: entry header size {header_size} is below the "
                          f"{_ENTRY_MIN_HEADER} bytes every entry has")
    start = pos + header_size
    if start > end or stored_size > end - start:
        raise FatbinError(f"{where}: payload of {stored_size} bytes runs past the container end")
    if compressed_size > stored_size:
        raise FatbinError(f"{where}: compressed size {compressed_size} exceeds the stored "
                          f"size {stored_size}")
    flags = EntryFlags(flags)
    compressed = flags & (EntryFlags.COMPRESSED_LZ4 | EntryFlags.COMPRESSED_ZSTD)
    if compressed_size and not compressed:
        raise FatbinError(f"{where}: entry is compressed with a scheme vgpu does not know "
                          f"(flags 0x{int(flags):x}; known: LZ4 0x2000, zstd 0x8000)")
    stored_end = start + (compressed_size if compressed else stored_size)
    entry = FatbinEntry(
        kind=_known_kind(kind), arch=arch, version=(major, minor), flags=flags,
        uncompressed_size=uncompressed if compressed else 0,
        stored=bytes(view[start:stored_end]))
    return entry, start + stored_size


def _known_kind(kind: int) -> int:
    try:
        return EntryKind(kind)
    except ValueError:
        return kind


def read_container_at(address: int) -> bytes:
    """Copy the fatbin container at `address` in this process's memory (one container: its
    header's size says where it ends)."""
    if not address:
        raise FatbinError("the fatbin pointer is NULL")
    header = ctypes.string_at(address, _CONTAINER.size)
    magic, _, header_size, size = _CONTAINER.unpack(header)
    if magic != CONTAINER_MAGIC:
        raise FatbinError(f"no fatbin container at 0x{address:x}: magic 0x{magic:08x} "
                          f"(expected 0x{CONTAINER_MAGIC:08x})")
    if header_size + size > _MAX_CONTAINER:
        raise FatbinError(f"fatbin container at 0x{address:x} declares {header_size + size} "
                          f"bytes, more than any real image: corrupt header")
    return ctypes.string_at(address, header_size + size)


def read_wrapper_at(address: int) -> FatbinWrapper:
    """Read the wrapper `__cudaRegisterFatBinary(void *w)` receives, and its container."""
    if not address:
        raise FatbinError("the fatbin wrapper pointer is NULL")
    magic, version, data, _ = _WRAPPER.unpack(ctypes.string_at(address, _WRAPPER.size))
    if magic != WRAPPER_MAGIC:
        raise FatbinError(f"no fatbin wrapper at 0x{address:x}: magic 0x{magic:08x} "
                          f"(expected 0x{WRAPPER_MAGIC:08x})")
    return FatbinWrapper(version=version, data_address=data, container=read_container_at(data))


def _best(entries: list[FatbinEntry]) -> FatbinEntry | None:
    return max(entries, key=lambda e: e.arch, default=None)


def _runnable_ptx(entries: list[FatbinEntry], device_arch: int | None) -> list[FatbinEntry]:
    """The PTX entries a device of `device_arch` (None: any device) can JIT-compile: those
    not newer than it, arch-specific ones (compute_90a) only on exactly their arch."""
    ptx = [e for e in entries if e.kind == EntryKind.PTX]
    if device_arch is None:
        return ptx
    return [e for e in ptx if e.arch <= device_arch
            and (e.arch == device_arch or not e.flags & EntryFlags.ARCH_SPECIFIC)]


def select_ptx(entries: list[FatbinEntry], device_arch: int | None = None) -> str | None:
    """The PTX text of the highest-arch PTX entry (what the emu backend loads) that a device
    of `device_arch` (e.g. 80) can run, or None."""
    best = _best(_runnable_ptx(entries, device_arch))
    return best.ptx_text() if best else None


def prelinked_ptx(wrapper_address: int, device_arch: int | None = None) -> list[str]:
    """The PTX of each object an -rdc program's device-link image was linked from, `[]`
    where `wrapper_address` holds no such image. That image (a version-2 wrapper) carries
    only the nvlink-ed cubin; its last field points at the NULL-terminated list of the
    objects' own containers (cubin + PTX), which the program's `__cudaRegisterLinkedBinary_*`
    stubs fill before it is registered. Raises FatbinError where an object has no PTX a
    device of `device_arch` runs."""
    # The magic first: a short PTX text may end within a wrapper's size.
    if struct.unpack("<II", ctypes.string_at(wrapper_address, 8)) != (WRAPPER_MAGIC,
                                                                      WRAPPER_VERSION_LINKED):
        return []
    _, _, _, array = _WRAPPER.unpack(ctypes.string_at(wrapper_address, _WRAPPER.size))
    ptx = []
    for i in range(_MAX_PRELINKED if array else 0):
        entry = ctypes.c_uint64.from_address(array + 8 * i).value
        if entry == 0:
            break
        ptx.append(require_ptx(parse_fatbin(read_container_at(entry)), device_arch))
    return ptx


def require_ptx(entries: list[FatbinEntry], device_arch: int | None = None) -> str:
    """Like select_ptx, but a binary without PTX for the device is an error that says how
    to rebuild it. Where a GPU of `device_arch` would run one of the binary's cubins (built
    with cubins for each GPU and PTX only for the newest, as `-arch=all` does), the newest
    PTX, compiled from the same source, stands in for that cubin."""
    text = select_ptx(entries, device_arch)
    if text is not None:
        return text
    if not entries:
        raise FatbinError("this binary embeds no device code at all")
    found = ", ".join(sorted({e.describe() for e in entries}))
    if any(e.kind == EntryKind.PTX for e in entries):
        try:
            if select_for_device(entries, device_arch).kind == EntryKind.CUBIN:
                return select_ptx(entries)
        except FatbinError:
            pass
        raise FatbinError(
            f"this binary's PTX ({found}) is for architectures newer than the device's "
            f"(compute_{device_arch}): rebuild with -gencode arch=compute_{device_arch},"
            f"code=compute_{device_arch} (or an older compute_XX) added")
    arch = max(e.arch for e in entries)
    raise FatbinError(
        f"this binary embeds no PTX (only {found}); the emu backend needs PTX: rebuild with "
        f"-gencode arch=compute_{arch},code=compute_{arch} added, or without -gencode")


def select_for_device(entries: list[FatbinEntry], sm: int) -> FatbinEntry:
    """The entry a GPU of compute capability `sm` (e.g. 90) runs, chosen as CUDA does:
    a cubin for exactly this arch; else a cubin of the same major and a lower minor (cubins
    are forward compatible within a major, except arch-specific `sm_XXa` ones); else the
    highest PTX not newer than the device, to be JIT-compiled."""
    cubins = [e for e in entries if e.kind == EntryKind.CUBIN]
    exact = [e for e in cubins if e.arch == sm]
    if exact:
        return exact[0]
    compatible = _best([e for e in cubins if e.arch // 10 == sm // 10 and e.arch < sm
                        and not e.flags & EntryFlags.ARCH_SPECIFIC])
    if compatible:
        return compatible
    ptx = _best([e for e in entries if e.kind == EntryKind.PTX and e.arch <= sm
                 and (e.arch == sm or not e.flags & EntryFlags.ARCH_SPECIFIC)])
    if ptx:
        return ptx
    found = ", ".join(sorted({e.describe() for e in entries})) or "nothing"
    raise FatbinError(f"no code in this binary runs on sm_{sm} (it embeds {found}): rebuild "
                      f"with -gencode arch=compute_{sm},code=sm_{sm} or with PTX for an "
                      f"arch <= {sm}")
