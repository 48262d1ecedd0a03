"""Page-locked host memory, shared with the server when it runs on this host.

cuMemAllocHost/cuMemHostAlloc memory is placed in a memory file that the server maps too,
sealed at its size (vgpu.sealed_files). That buys two things: the server reads and writes it
directly (a copy from pinned memory costs one memcpy, none of it staged), and with unified
addressing the device pointer of such memory equals its host pointer, so kernels can use it,
as on a real GPU.
"""

from __future__ import annotations

import ctypes
import os
import stat

from vgpu.sealed_files import sealed_file

__all__ = ["map_shared", "map_anonymous", "unmap", "is_mapped", "page_range", "share_in_place",
           "unshare_in_place", "shared_file_at"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROT_READ_WRITE = 0x1 | 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MREMAP_MAYMOVE, MREMAP_FIXED = 0x1, 0x2
MAP_FAILED = ctypes.c_void_p(-1).value


def _check(address: int | None) -> int:
    if address in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return address


def map_shared(size: int, at: int | None = None) -> tuple[int, int]:
    """A new memory file of `size` bytes, sealed at that size, mapped here: (address, its
    descriptor). Close the descriptor once the server has mapped the file through it (or
    refused to). With `at`, the file replaces the pages there, keeping their contents."""
    fd = sealed_file("vgpu-host", size)
    try:
        address = _check(_libc.mmap(None, size, PROT_READ_WRITE, MAP_SHARED, fd, 0))
        if at is not None:
            ctypes.memmove(address, at, size)
            placed = _libc.mmap(at, size, PROT_READ_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            _libc.munmap(address, size)
            address = _check(placed)
    except OSError:
        os.close(fd)
        raise
    return address, fd


def page_range(address: int, size: int) -> tuple[int, int]:
    """(start, length) of the whole pages holding [address, address + size)."""
    start = address & ~(PAGE_SIZE - 1)
    return start, -(-(address + size - start) // PAGE_SIZE) * PAGE_SIZE


def _plain_anonymous(start: int, end: int) -> bool:
    """Whether [start, end) lies in private anonymous read-write mappings (the heap, malloc's
    and the program's own anonymous maps): memory no file, stack or library owns."""
    covered = start
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if high <= covered or low > covered:
                continue
            name = fields[5] if len(fields) > 5 else ""
            if fields[1] != "rw-p" or fields[4] != "0" or name not in ("", "[heap]"):
                return False
            covered = high
            if covered >= end:
                return True
    return False


def share_in_place(address: int, size: int) -> int | None:
    """Back the pages holding [address, address + size) by a new memory file (as map_shared's),
    keeping their contents and addresses, so that the server can map them too (registered host
    memory a kernel reads through its device pointer); returns the file's descriptor, or None
    when the pages are not plain anonymous memory. The pages are copied while other threads
    may write them: the program registers memory before it uses it concurrently, as it must
    with CUDA."""
    start, length = page_range(address, size)
    if not _plain_anonymous(start, start + length):
        return None
    return map_shared(length, at=start)[1]


def shared_file_at(start: int, end: int) -> tuple[int, int, int] | None:
    """Where [start, end) lies in a memory file this process maps shared, whole and from its
    first byte, and holds open: (its descriptor, its size, where it is mapped); else None.
    Such pages are shared with another process already (a vgpu server maps its clients'
    pinned buffers so, at the clients' addresses, and registers them with its driver, which
    may be vgpu's again): registering them shares that same file rather than a new one."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= start < high:
                break
        else:
            return None
    if (end > high or fields[1] != "rw-s" or int(fields[2], 16) != 0
            or len(fields) < 6 or not fields[5].startswith("/memfd:")):
        return None
    inode = int(fields[4])
    major, minor = (int(x, 16) for x in fields[3].split(":"))
    for name in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, or one closed meanwhile
            continue
        if (info.st_ino == inode and os.major(info.st_dev) == major
                and os.minor(info.st_dev) == minor and stat.S_ISREG(info.st_mode)
                and page_range(low, info.st_size) == (low, high - low)):
            return int(name), info.st_size, low
    return None


def unshare_in_place(address: int, size: int) -> None:
    """Make the pages of a share_in_place private anonymous memory again, keeping contents:
    a private copy replaces them in one step (mremap), so that no moment leaves them empty.
    They may hold the interpreter's own heap objects (a malloc'd buffer shares heap pages),
    which the Python code between two calls here reads."""
    start, length = page_range(address, size)
    saved = map_anonymous(length)
    try:
        ctypes.memmove(saved, start, length)
        _check(_libc.mremap(saved, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, start))
    except OSError:
        unmap(saved, length)
        raise


def map_anonymous(size: int) -> int:
    return _check(_libc.mmap(None, size, PROT_READ_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))


def unmap(address: int, size: int) -> None:
    _libc.munmap(address, size)


def is_mapped(address: int, size: int) -> bool:
    """Whether [address, address + size) is mapped in this process. A host copy touches host
    memory itself: a stale device pointer or a stray address there would crash the program
    rather than fail the call. mincore(2) fails with ENOMEM on any unmapped page."""
    start, length = page_range(address, size)
    count = length // PAGE_SIZE
    # What mincore writes (which pages are resident) is not read: threads may share a buffer.
    pages = _RESIDENCY if count <= len(_RESIDENCY) else (ctypes.c_ubyte * count)()
    return _mincore(start, length, pages) == 0


_RESIDENCY = (ctypes.c_ubyte * 256)()
_mincore = _libc.mincore
