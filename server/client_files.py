"""Memory files a local client hands the server: its staging ring, pinned host memory.

The server maps such a file read-write for the session's life, so it must be the client's
own and unable to shrink under that mapping (SIGBUS at the server's next access would end
every session). A client names only a descriptor number; the server takes the file
- only from a peer on this host whose pid the kernel verified (server/peers.py) and whose
  hello gave that same pid;
- through /proc/PID/fd/N, PID that verified pid: a path the server builds, so the file is
  one the client's process holds open, never one it names;
- a regular file owned by the peer's uid, exactly the size the client stated, and sealed
  against shrinking (a memfd with F_SEAL_SHRINK: see vgpu.sealed_files).
The checks are made on the opened file (fstat and the seals of its descriptor), so nothing
can be swapped in between.

A backend whose kernels reach host memory through the host's own addresses (a GPU's unified
addressing) needs a client's pinned buffer at the client's own address in the server too:
`at` places the map there, if nothing of the server's is (MAP_FIXED_NOREPLACE).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import stat

from .peers import Peer

__all__ = ["SegmentRefused", "map_client_file", "PlacedFile", "mapped_bytes"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_READ_WRITE, _MAP_SHARED, _MAP_FIXED_NOREPLACE = 0x3, 0x01, 0x100000
_MAP_FAILED = ctypes.c_void_p(-1).value


class SegmentRefused(OSError):
    """The server will not map that file (the message says why)."""


def map_client_file(fd_number, size, peer: Peer, hello_pid: int, at: int | None = None
                    ) -> mmap.mmap | PlacedFile:
    """Map the file the client at `peer` holds open as descriptor `fd_number`, if it is its
    own, of `size` bytes, and sealed against shrinking. With `at`, a PlacedFile: at that
    address where it is free, else anywhere (keeping the descriptor, which a backend in
    another process maps the file by)."""
    if not peer.local:
        raise SegmentRefused("shared memory is only for clients on the server's host, "
                             "connected through its local socket")
    if peer.pid != hello_pid:
        raise SegmentRefused(f"the connection is from pid {peer.pid}, not pid {hello_pid} "
                             "as the hello said")
    if (type(fd_number) is not int or not 0 <= fd_number < 1 << 31
            or type(size) is not int or size <= 0):
        raise SegmentRefused("not a file descriptor number and a size")
    path = f"/proc/{peer.pid}/fd/{fd_number}"
    try:
        target = os.stat(path)
    except OSError as exc:
        raise SegmentRefused(f"descriptor {fd_number}: {exc.strerror}") from None
    # Opening a device or a FIFO can do things of its own: only a regular file is opened.
    if not stat.S_ISREG(target.st_mode):
        raise SegmentRefused(f"descriptor {fd_number} is not a regular file")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise SegmentRefused(f"descriptor {fd_number}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SegmentRefused(f"descriptor {fd_number} is not a regular file")
        if info.st_uid != peer.uid:
            raise SegmentRefused(f"descriptor {fd_number}'s file belongs to uid {info.st_uid}, "
                                 f"not to the client (uid {peer.uid})")
        if info.st_size != size:
            raise SegmentRefused(f"descriptor {fd_number}'s file holds {info.st_size} bytes, "
                                 f"not {size}")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:  # a file system without seals
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise SegmentRefused(f"descriptor {fd_number}'s file is not sealed against "
                                 "shrinking (a memfd with F_SEAL_SHRINK)")
        if at is not None:
            placed = PlacedFile.place(fd, size, at) or PlacedFile.place(fd, size)
            if placed is not None:
                fd = -1  # the placed map keeps it
                return placed
        return mmap.mmap(fd, size)
    finally:
        if fd >= 0:
            os.close(fd)


def mapped_bytes(mapped: mmap.mmap | PlacedFile) -> memoryview:
    """The bytes of what map_client_file gave, as a view."""
    return memoryview(mapped.buffer if isinstance(mapped, PlacedFile) else mapped)


class PlacedFile:
    """A file mapped shared at an address of the caller's choice: `buffer` is the bytes
    there. The descriptor stays open while the file is mapped, because a CUDA driver that
    itself shares registered memory with another process (vgpu's own, when this server runs
    under vgpu) finds the file of a mapping through the process's descriptors."""

    def __init__(self, fd: int, size: int, address: int) -> None:
        self.fd, self.address, self._size = fd, address, size
        self.buffer = (ctypes.c_char * size).from_address(address)

    @classmethod
    def place(cls, fd: int, size: int, at: int | None = None) -> PlacedFile | None:
        """`fd` mapped at `at` (None: anywhere), or None where something of this process's
        is mapped there already."""
        flags = _MAP_SHARED if at is None else _MAP_SHARED | _MAP_FIXED_NOREPLACE
        got = _libc.mmap(at or 0, size, _PROT_READ_WRITE, flags, fd, 0)
        if got in (None, _MAP_FAILED):
            return None
        if at is not None and got != at:  # a kernel older than 4.17 takes the flag for a hint
            _libc.munmap(got, size)
            return None
        return cls(fd, size, got)

    def __len__(self) -> int:
        return self._size

    def close(self) -> None:
        """Unmap it; nothing may use `buffer` afterwards."""
        if self.fd >= 0:
            _libc.munmap(self.address, self._size)
            os.close(self.fd)
            self.fd = -1
