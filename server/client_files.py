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
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat

from .peers import Peer

__all__ = ["SegmentRefused", "map_client_file"]


class SegmentRefused(OSError):
    """The server will not map that file (the message says why)."""


def map_client_file(fd_number, size, peer: Peer, hello_pid: int) -> mmap.mmap:
    """Map the file the client at `peer` holds open as descriptor `fd_number`, if it is its
    own, of `size` bytes, and sealed against shrinking."""
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
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
