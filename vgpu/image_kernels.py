"""The names of the kernels a module image declares, read without loading it: what a library
accepted without code the device runs still reports (cuLibraryGetKernelCount), and names
when one of them is asked for.

A cubin marks a kernel as a function symbol with STO_CUDA_ENTRY in its st_other; PTX declares
one with `.entry`. From a fatbin, the newest cubin's kernels (each entry of a fatbin holds the
same source's kernels), else the newest PTX's. Standard library only: this runs inside the
application.
"""

from __future__ import annotations

import re
import struct

from vgpu.binary_check import BinaryCheckError, ElfFile
from vgpu.fatbin import EntryKind, FatbinError, parse_fatbin
from vgpu.module_image import ELF_MAGIC, FATBIN_CONTAINER_MAGIC

__all__ = ["kernel_names"]

_STO_CUDA_ENTRY = 0x10
_STT_FUNC = 2
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%.]*)")


def kernel_names(image: bytes) -> list[str]:
    """The kernels of `image` (PTX, a cubin or a fatbin), in the image's order; none where it
    cannot be read."""
    if image[:4] == ELF_MAGIC:
        return _cubin_kernels(image)
    if len(image) >= 4 and struct.unpack_from("<I", image)[0] == FATBIN_CONTAINER_MAGIC:
        return _fatbin_kernels(image)
    return _ptx_kernels(image)


def _cubin_kernels(cubin: bytes) -> list[str]:
    try:
        symbols = ElfFile(cubin, "cubin").symbols()
    except BinaryCheckError:
        return []
    return [s.name for s in symbols
            if s.type == _STT_FUNC and s.defined and s.other & _STO_CUDA_ENTRY]


def _ptx_kernels(ptx: bytes) -> list[str]:
    return [name.decode(errors="replace") for name in _PTX_ENTRY.findall(ptx)]


def _fatbin_kernels(image: bytes) -> list[str]:
    try:
        entries = parse_fatbin(image)
        for kind, read in ((EntryKind.CUBIN, _cubin_kernels), (EntryKind.PTX, _ptx_kernels)):
            newest = max((e for e in entries if e.kind == kind), key=lambda e: e.arch,
                         default=None)
            if newest is not None:
                return read(newest.payload())
    except FatbinError:
        pass
    return []
