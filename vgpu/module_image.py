"""Module images as applications hand them to cuModuleLoadData: find their length, tag them.

An image arrives as a bare pointer, so its extent has to be read from its own header: PTX is
NUL-terminated text, a fatbin (wrapper or container) records its size, a cubin is an ELF file
whose section table ends it, and vgpu's own linker output (what cuLinkComplete returns) starts
with a small header. Standard library only: this runs inside the application.
"""

from __future__ import annotations

import ctypes
import struct

__all__ = ["read_image", "mapped_file", "pack_linked_ptx", "unpack_linked_ptx",
           "LINKED_PTX_MAGIC", "FATBIN_WRAPPER_MAGIC", "FATBIN_CONTAINER_MAGIC", "ImageError"]

FATBIN_WRAPPER_MAGIC = 0x466243B1
FATBIN_CONTAINER_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
LINKED_PTX_MAGIC = b"VGPULNK1"
_LINKED_HEADER = struct.Struct("<8sQ")  # magic, total length
MAX_PTX_BYTES = 1 << 30


class ImageError(ValueError):
    """The pointer does not lead to a module image vgpu understands."""


def read_image(address: int) -> bytes:
    """Copy the module image at `address` out of this process's memory."""
    if not address:
        raise ImageError("the module image pointer is NULL")
    head = ctypes.string_at(address, 8)
    magic32 = struct.unpack_from("<I", head)[0]
    if magic32 == FATBIN_WRAPPER_MAGIC:
        data_ptr = struct.unpack("<Q", ctypes.string_at(address + 8, 8))[0]
        return _read_containers(data_ptr)
    if magic32 == FATBIN_CONTAINER_MAGIC:
        return _read_containers(address)
    if head == LINKED_PTX_MAGIC:
        _, length = _LINKED_HEADER.unpack(ctypes.string_at(address, _LINKED_HEADER.size))
        return ctypes.string_at(address, length)
    if head[:4] == ELF_MAGIC:
        return _read_elf(address)
    text = ctypes.string_at(address)  # PTX: up to the terminating NUL
    if len(text) > MAX_PTX_BYTES or b".version" not in text[:4096] and b".target" not in text:
        raise ImageError("the module image is neither PTX, a fatbin nor a cubin")
    return text


def mapped_file(address: int) -> str | None:
    """The file whose mapping in this process holds `address` (a library handing over an
    image it carries, as cuRAND's does), or None (the heap, say): what a refusal names."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                if start <= address < end:
                    path = fields[5].strip() if len(fields) == 6 else ""
                    return path if path.startswith("/") else None
    except (OSError, ValueError):
        pass
    return None


def _read_containers(address: int) -> bytes:
    """A fatbin container: header {u32 magic, u16 version, u16 header size, u64 size}."""
    magic, _, header_size, size = struct.unpack("<IHHQ", ctypes.string_at(address, 16))
    if magic != FATBIN_CONTAINER_MAGIC:
        raise ImageError(f"bad fatbin container magic 0x{magic:08x}")
    return ctypes.string_at(address, header_size + size)


def _read_elf(address: int) -> bytes:
    header = ctypes.string_at(address, 64)
    if header[4] != 2:
        raise ImageError("only 64-bit ELF cubins are supported")
    shoff, = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    return ctypes.string_at(address, shoff + shentsize * shnum)


def pack_linked_ptx(ptx_modules: list[bytes]) -> bytes:
    """The image cuLinkComplete hands back: every PTX module added, to be linked at load."""
    body = b"".join(struct.pack("<Q", len(p)) + p for p in ptx_modules)
    return _LINKED_HEADER.pack(LINKED_PTX_MAGIC, _LINKED_HEADER.size + len(body)) + body


def unpack_linked_ptx(image: bytes) -> list[bytes]:
    magic, length = _LINKED_HEADER.unpack_from(image)
    if magic != LINKED_PTX_MAGIC or length != len(image):
        raise ImageError("corrupt vgpu linker image")
    out, pos = [], _LINKED_HEADER.size
    while pos < length:
        (n,) = struct.unpack_from("<Q", image, pos)
        out.append(image[pos + 8:pos + 8 + n])
        pos += 8 + n
    return out
