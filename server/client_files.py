"""Shared-memory files a local client hands the server: its staging ring, pinned host memory.

The server maps such a file read-write, so it must be one the client made for vgpu and
nothing else: a path is only a claim, and mapping whatever a client names would give it
every file the server's user can open. A file is taken only
- from a peer on this host whose pid the kernel verified (server/peers.py) and whose hello
  gave that same pid;
- at /dev/shm/vgpu-PID-TOKEN-..., PID that pid and TOKEN the session's secret token
  (sent only at hello, over the peer's own connection), so the name was made for this session;
- opened without following a symlink, a regular file, owned by the peer's uid, readable and
  writable by its owner only (mode 0600), and exactly the size the client stated.
The checks are made on the opened file (fstat of its descriptor), so nothing can be swapped
in between.
"""

from __future__ import annotations

import mmap
import os
import stat

from .peers import Peer

__all__ = ["SegmentRefused", "map_client_file", "client_file_prefix"]

SHM_FOLDER = "/dev/shm"


class SegmentRefused(OSError):
    """The server will not map that file (the message says why)."""


def client_file_prefix(pid: int, token: str) -> str:
    """What the name of every file of the session's client begins with (vgpu.client makes
    the same)."""
    return f"vgpu-{pid}-{token}-"


def map_client_file(path, size, peer: Peer, hello_pid: int, token: str) -> mmap.mmap:
    """Map the file the client at `peer` named, if it is one it made for this session."""
    if not peer.local:
        raise SegmentRefused("shared memory is only for clients on the server's host, "
                             "connected through its local socket")
    if peer.pid != hello_pid:
        raise SegmentRefused(f"the connection is from pid {peer.pid}, not pid {hello_pid} "
                             "as the hello said")
    if not isinstance(path, str) or not isinstance(size, int) or size <= 0:
        raise SegmentRefused("not a file path and a size")
    folder, name = os.path.split(path)
    if folder != SHM_FOLDER or not name.startswith(client_file_prefix(hello_pid, token)):
        raise SegmentRefused(f"{path!r:.120} is not a vgpu file of this session "
                             f"({SHM_FOLDER}/{client_file_prefix(hello_pid, token)}...)")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SegmentRefused(f"{path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SegmentRefused(f"{path} is not a regular file")
        if info.st_uid != peer.uid:
            raise SegmentRefused(f"{path} belongs to uid {info.st_uid}, not to the client "
                                 f"(uid {peer.uid})")
        if stat.S_IMODE(info.st_mode) != 0o600:
            raise SegmentRefused(f"{path} has mode {stat.S_IMODE(info.st_mode):o}, not 600")
        if info.st_size != size:
            raise SegmentRefused(f"{path} holds {info.st_size} bytes, not {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
