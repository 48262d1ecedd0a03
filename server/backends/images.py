"""Turn a module image (PTX, fatbin, cubin, vgpu link output) into what the emulator loads."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from vgpu.fatbin import FatbinError, parse_fatbin, require_ptx
from vgpu.module_image import (
    ELF_MAGIC,
    FATBIN_CONTAINER_MAGIC,
    FATBIN_WRAPPER_MAGIC,
    LINKED_PTX_MAGIC,
    unpack_linked_ptx,
)

__all__ = ["ModuleImage", "decode_image"]


@dataclass
class ModuleImage:
    ptx: list[str]
    why_no_ptx: str = ""


def _text(ptx: bytes) -> str:
    return ptx.rstrip(b"\0").decode("utf-8", errors="replace")


def decode_image(image: bytes, device_arch: int | None = None) -> ModuleImage:
    """The PTX of `image`; from a fatbin, its newest PTX a device of `device_arch` (80 for
    compute capability 8.0; None: any) can run, as a GPU's driver picks it."""
    if len(image) < 8:
        return ModuleImage([], "the module image is empty or truncated")
    magic32 = struct.unpack_from("<I", image)[0]
    if image[:8] == LINKED_PTX_MAGIC:
        return ModuleImage([_text(p) for p in unpack_linked_ptx(image)])
    if magic32 in (FATBIN_CONTAINER_MAGIC, FATBIN_WRAPPER_MAGIC):
        try:
            ptx = require_ptx(parse_fatbin(image), device_arch)  # else says what it holds
        except FatbinError as exc:
            return ModuleImage([], str(exc))
        return ModuleImage([ptx])
    if image[:4] == ELF_MAGIC:
        if len(image) < 52:  # no whole ELF header: no architecture to name
            return ModuleImage([], "the module is a cubin (SASS only); the emu backend runs "
                                   "PTX: load PTX instead (e.g. compile with -ptx or keep "
                                   "compute_XX)")
        arch = _cubin_arch(image)
        return ModuleImage([], f"this module holds only SASS for sm_{arch}; the emu backend "
                               f"runs PTX: load PTX instead (nvcc -ptx, or keep PTX in the "
                               f"fatbin with -gencode arch=compute_{arch},code=compute_{arch})")
    return ModuleImage([_text(image)])


def _cubin_arch(image: bytes) -> int:
    """The SM a cubin was built for, from its ELF header's e_flags: bits 8-15 in the ABI
    nvcc 12.8 and later write (ELF ABI version 8 and up), the low byte before."""
    flags = struct.unpack_from("<I", image, 48)[0]
    return (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF
