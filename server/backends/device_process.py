"""A session's device process: one backend, run for the server in a process of its own
(isolated.py starts it: `python -m vgpu.server.backends.device_process SOCKET_FD BACKEND
STAGING_FD STAGING_BYTES`).

It serves the backend's calls over the channel (process_channel.py), and a few of its own
that need this process's side: copies through the staging file both processes map, and a
client's pinned buffer mapped here at the client's address (where a GPU's kernels reach
it). Before its first call it loads what the backend needs (modules, the driver), so that a
spare process started ahead of a session has done so by the time the session comes. It
ends when the server closes the channel, or dies (its end of the socket closes with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import socket
import sys

from ..client_files import PlacedFile
from . import open_backend
from .base import Backend, FileDescriptor
from .process_channel import ChannelClosed, Endpoint


class DeviceProcess:
    """The channel's root: the backend's methods, and the calls that only this side can do."""

    def __init__(self, name: str, staging: mmap.mmap) -> None:
        self._name = name
        self._running = contextlib.ExitStack()
        self.backend: Backend | None = None
        self._staging = memoryview(staging)
        self._placed: dict[int, PlacedFile] = {}  # address -> a client's mapped buffer

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def open(self) -> dict:
        """Make the backend (its error, such as a missing driver, is the server's), and
        tell what the server's side needs to know of it besides its calls."""
        self.backend = backend = open_backend(self._name)
        # This process's one thread runs every call: what the device needs set up on the
        # thread (a GPU's current context) is set up once, for the process's life.
        self._running.enter_context(backend.running())
        if backend.host_buffers_at_client_addresses:
            # A GPU copies page-locked memory by DMA: the staging file is registered as
            # such, so that copies through it need no copy of the driver's own.
            base = ctypes.addressof(ctypes.c_char.from_buffer(self._staging))
            backend.map_host(base, len(self._staging), self._staging)
        return {"launches_run_inline": backend.launches_run_inline,
                "shares_address_space": backend.shares_address_space,
                "own_device_runtime": backend.own_device_runtime,
                "pid": os.getpid()}

    def write_staged(self, address: int, size: int) -> None:
        self.backend.write(address, self._staging[:size])

    def write_from_host(self, address: int, host: int, size: int) -> None:
        """Copy from a client's page-locked buffer mapped here (map_host_file)."""
        self.backend.write(address, self._host_bytes(host, size))

    def read_to_host(self, address: int, host: int, size: int) -> None:
        self.backend.read_into(address, self._host_bytes(host, size))

    def _host_bytes(self, host: int, size: int) -> memoryview:
        for start, placed in self._placed.items():
            if start <= host and host + size <= start + len(placed):
                return memoryview(placed.buffer).cast("B")[host - start:host - start + size]
        raise ValueError(f"0x{host:x}+{size} is not in a host buffer mapped here")

    def read_bytes(self, address: int, size: int) -> bytes:
        out = bytearray(size)
        self.backend.read_into(address, memoryview(out))
        return bytes(out)

    def read_staged(self, address: int, size: int) -> None:
        self.backend.read_into(address, self._staging[:size])

    def write_physical_staged(self, physical: object, offset: int, size: int) -> None:
        self.backend.write_physical(physical, offset, self._staging[:size])

    def read_physical_staged(self, physical: object, offset: int, size: int) -> None:
        self.backend.read_physical(physical, offset, self._staging[:size])

    def map_host_file(self, address: int, size: int, file: FileDescriptor
                      ) -> tuple[bool, str | None]:
        """A client's pinned buffer (the memory file `file`), mapped here at `address` where
        nothing else is, and shown to the device there: (whether it is mapped here, None
        when kernels reach it or else why they do not)."""
        placed = PlacedFile.place(file.fd, size, address)
        if placed is None:
            file.close()
            return False, (f"the client's address 0x{address:x} is not free in the "
                           "session's device process, where the device would have to see "
                           "the buffer")
        file.take()  # the placed map keeps it
        try:
            unreached = self.backend.map_host(address, size, memoryview(placed.buffer))
        except BaseException:
            placed.close()
            raise
        self._placed[address] = placed
        return True, unreached

    def close(self) -> None:
        if self.backend is not None:
            self._running.close()
            self.backend.close()

    def unmap(self, address: int) -> None:
        self.backend.unmap(address)
        placed = self._placed.pop(address, None)
        if placed is not None:
            placed.close()


def warm_up(name: str) -> None:
    """Load the backend's code, and a GPU's driver, ahead of the session."""
    if name == "cuda":
        from .cuda import cuda_usable

        cuda_usable()  # its failure is open()'s to report
    else:
        from . import emu  # noqa: F401


def main(argv: list[str]) -> int:
    sock_fd, name, staging_fd, staging_bytes = argv
    # The server's process group gets a terminal's Ctrl-C: the server ends its sessions,
    # and with them this process, itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warm_up(name)
    sock = socket.socket(fileno=int(sock_fd))
    # (its descriptor stays open: a driver that shares registered memory with another
    # process, as vgpu's own does, finds the file of a mapping through it)
    staging = mmap.mmap(int(staging_fd), int(staging_bytes))
    process = DeviceProcess(name, staging)
    try:
        Endpoint(sock, process).serve()
    except ChannelClosed:
        pass
    finally:
        process.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
