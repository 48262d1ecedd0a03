"""Bell: wakes the server's I/O thread from other threads (session workers, admin tasks) and
from signal handlers.

The I/O thread sleeps in one poll over the clients' socket and the bell; whoever hands it
work (a finished batch, a task to run, a request to stop) puts the work where the I/O
thread finds it, then rings. One pipe for all of them keeps the poll to two descriptors:
every descriptor more costs each message's round trip a few microseconds.
"""

from __future__ import annotations

import os

__all__ = ["Bell"]


class Bell:
    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)

    def ring(self) -> None:
        """Wake the I/O thread (any thread, or a signal handler)."""
        try:
            os.write(self._write_fd, b"\0")
        except (BlockingIOError, OSError):  # the pipe is full: already rung; or closed
            pass

    def quiet(self) -> None:
        """Take the rings so far (the I/O thread, before it looks for the work)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write_fd)
