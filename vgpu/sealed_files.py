"""Memory files a local client shares with its server: its staging ring, pinned host memory.

The server maps such a file and reads and writes it for as long as the session lasts; if the
file could shrink under that mapping, the server's next access would be SIGBUS, ending every
session. So the file is a memfd sealed at its size: nobody, its maker included, can shrink or
grow it, or lift the seals. The server takes the file by descriptor number, through
/proc/<pid>/fd of the process the kernel says is connected, and maps only a file sealed
against shrinking (vgpu.server.client_files).
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["sealed_file"]


def sealed_file(name: str, size: int) -> int:
    """A descriptor of a new memory file of `size` bytes, sealed at that size; close it once
    the server has mapped it (or refused to)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except OSError:
        os.close(fd)
        raise
    return fd
