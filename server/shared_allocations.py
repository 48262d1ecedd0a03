"""Device allocations that a local client maps, so that it copies to and from them itself.

A copy between pageable host memory and device memory is one memcpy at best. Done by the
kernel for us (process_vm_readv/writev, see peer_memory.py) it is a slow one: the kernel
pins the application's 4 KiB pages a few at a time and copies with its own routine, which
on CPUs that do not advertise fast `rep movs` (ERMS/FSRM; this machine's virtual CPUs) is a
plain word loop. Profiled with perf on 64 MiB copies: half the time in that loop, a fifth
pinning pages; 0.5-0.8x of numpy's copy, against 0.86-0.93x for a memcpy in user space
from the same 4 KiB pages.

So, for a client whose memory the server may read (the session's peer-memory probe: the same
host, and the same user or one that let us in) and a backend whose device memory is host
RAM, allocations of SHARED_BYTES and more live in memfd files. The client opens one through
/proc/<server pid>/fd/<fd> (the kernel lets only a process allowed to ptrace the server do
that: it could read all of the server's memory anyway) and copies with its own memcpy, after
a round trip that orders the copy after the work queued before it (`window`). A serial per
file tells the client when a mapping it kept is of an allocation freed since.
"""

from __future__ import annotations

import fcntl
import mmap
import os

__all__ = ["SharedAllocations", "SHARED_BYTES"]

SHARED_BYTES = 1 << 20


class SharedAllocations:
    """The memfd files behind one session's large allocations, by base address."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[int, mmap.mmap, int]] = {}  # base -> (fd, map, serial)
        self._serial = 0

    def create(self, base: int, size: int) -> memoryview | None:
        """A zero-filled shared buffer for the allocation at `base`; None if the system
        refuses one (out of file descriptors: the allocation is then a private one)."""
        try:
            fd = os.memfd_create("vgpu-device-memory", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:
            return None
        try:
            os.ftruncate(fd, size)
            # The client opens this file read-write: sealed at its size, it cannot shrink it
            # under the server's map (whose next access would kill the server with SIGBUS).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            buffer = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            return None
        self._serial += 1
        self._files[base] = (fd, buffer, self._serial)
        return memoryview(buffer)

    def window(self, base: int) -> list | None:
        """What a client needs to map the allocation at `base`: [server pid, fd, serial,
        inode]; the inode lets it check that it opened this very file (a client in another
        pid namespace would name another process)."""
        entry = self._files.get(base)
        if entry is None:
            return None
        return [os.getpid(), entry[0], entry[2], os.fstat(entry[0]).st_ino]

    def release(self, base: int) -> None:
        """The allocation was freed (and unmapped from the backend)."""
        entry = self._files.pop(base, None)
        if entry is not None:
            fd, buffer, _ = entry
            _close(buffer)
            os.close(fd)

    def close(self) -> None:
        for base in list(self._files):
            self.release(base)


def _close(buffer: mmap.mmap) -> None:
    try:
        buffer.close()
    except BufferError:  # a view of it is still alive somewhere: it goes when that does
        pass
