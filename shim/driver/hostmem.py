"""Page-locked host memory, shared with the server when it runs on this host.

cuMemAllocHost/cuMemHostAlloc memory is placed in a shared-memory file that the server maps
too. That buys two things: the server reads and writes it directly (a copy from pinned memory
costs one memcpy, none of it staged), and with unified addressing the device pointer of such
memory equals its host pointer, so kernels can use it, as on a real GPU.
"""

from __future__ import annotations

import ctypes
import os
import secrets

__all__ = ["map_shared", "map_anonymous", "unmap", "is_mapped"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROT_READ_WRITE = 0x1 | 0x2
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS = 0x01, 0x02, 0x20
MAP_FAILED = ctypes.c_void_p(-1).value


def _check(address: int | None) -> int:
    if address in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return address


def map_shared(size: int) -> tuple[int, str]:
    """A new shared-memory file of `size` bytes mapped here: (address, path). Unlink the path
    once the server has mapped it too."""
    path = f"/dev/shm/vgpu-{os.getpid()}-host-{secrets.token_hex(4)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        address = _check(_libc.mmap(None, size, PROT_READ_WRITE, MAP_SHARED, fd, 0))
    except OSError:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return address, path


def map_anonymous(size: int) -> int:
    return _check(_libc.mmap(None, size, PROT_READ_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))


def unmap(address: int, size: int) -> None:
    _libc.munmap(address, size)


def is_mapped(address: int, size: int) -> bool:
    """Whether [address, address + size) is mapped in this process. A host copy touches host
    memory itself: a stale device pointer or a stray address there would crash the program
    rather than fail the call. mincore(2) fails with ENOMEM on any unmapped page."""
    start = address & ~(PAGE_SIZE - 1)
    length = address + size - start
    pages = (ctypes.c_ubyte * ((length + PAGE_SIZE - 1) // PAGE_SIZE))()
    return _libc.mincore(start, length, pages) == 0
