"""What the vgpu linker takes from host objects and static libraries (CU_JIT_INPUT_OBJECT,
CU_JIT_INPUT_LIBRARY): the PTX of the fatbins nvcc embeds in them (`-rdc=true -c`
objects, `ar` archives of them).

libcudadevrt.a is the exception. numba-cuda links it for cooperative groups' grid sync, and
programs with device-side launches need it; its functions are the device runtime, which the
emulator provides itself (server/emu/device_runtime.py), so its own code (written against a
GPU's system calls) is left out of the link.
"""

from __future__ import annotations

import struct

from vgpu.fatbin import CONTAINER_MAGIC, FatbinError, parse_fatbin, select_ptx

__all__ = ["ptx_from_library", "ptx_from_object"]

_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60
_CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, data size
DEVICE_RUNTIME_MEMBER = "cuda_device_runtime.o"


def _members(data: bytes, what: str):
    """(name, contents) of each member of an `ar` archive."""
    if not data.startswith(_AR_MAGIC):
        raise ValueError(f"{what}: not a static library (ar archive)")
    pos = len(_AR_MAGIC)
    long_names = b""
    while pos + _AR_HEADER <= len(data):
        header = data[pos:pos + _AR_HEADER]
        name = header[:16].decode(errors="replace").rstrip()
        size = int(header[48:58].decode().strip() or 0)
        body = data[pos + _AR_HEADER:pos + _AR_HEADER + size]
        pos += _AR_HEADER + size + (size & 1)
        if name == "//":  # the GNU table of long member names
            long_names = body
            continue
        if name in ("/", "/SYM64/"):  # symbol tables
            continue
        if name.startswith("/") and name[1:].isdigit():
            start = int(name[1:])
            name = long_names[start:long_names.index(b"\n", start)].decode(errors="replace")
        yield name.rstrip("/"), body


def ptx_from_object(data: bytes, what: str) -> list[bytes]:
    """The PTX of every fatbin container inside a host object."""
    found = []
    at = data.find(CONTAINER_MAGIC.to_bytes(4, "little"))
    while at >= 0 and at + _CONTAINER_HEADER.size <= len(data):
        _, _, header, size = _CONTAINER_HEADER.unpack_from(data, at)
        try:
            ptx = select_ptx(parse_fatbin(data[at:at + header + size]))
        except FatbinError as exc:
            raise ValueError(f"{what}: {exc}") from None
        if ptx is not None:
            found.append(ptx.encode())
        at = data.find(CONTAINER_MAGIC.to_bytes(4, "little"), at + header + size)
    return found


def ptx_from_library(data: bytes, what: str) -> list[bytes]:
    """The PTX of every object of a static library (none from the device runtime)."""
    found = []
    for name, body in _members(data, what):
        if name != DEVICE_RUNTIME_MEMBER:
            found += ptx_from_object(body, f"{what}({name})")
    return found
