"""Bell: wakes the server's I/O thread from other threads (session workers, admin tasks) and
from signal handlers.

The I/O thread sleeps in a blocking receive on the clients' socket: one call into zmq per
message, where a poll over the socket and a second descriptor cost each round trip a poll
and a receive besides (a Python echo server polling a socket and a pipe spent about 8 us
more CPU per round trip than one blocking in a receive, 26 against 18). So the bell is a
message on that same socket: a DEALER connected to it over inproc, under a routing id no
client can know (and which, connected first, no client can take). Whoever hands the I/O
thread work (a finished batch, a task to run, a request to stop) puts the work where the
I/O thread finds it, then rings.
"""

from __future__ import annotations

import secrets
import threading

import zmq

from vgpu.transport import NOBLOCK

__all__ = ["Bell"]


class Bell:
    def __init__(self, context: zmq.Context, router: zmq.Socket) -> None:
        """A bell heard on `router` (the I/O thread's socket, bound before any client can
        connect), as a message whose routing id is `identity`."""
        self.identity = secrets.token_bytes(16)
        address = f"inproc://vgpu-bell-{self.identity.hex()}"
        router.bind(address)
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.ROUTING_ID, self.identity)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(address)
        # zmq sockets are not thread-safe: rings from several threads take turns.
        self._lock = threading.Lock()

    def ring(self, wait: bool = True) -> None:
        """Wake the I/O thread (any thread). A signal handler, which may have interrupted
        a ring on the I/O thread itself, passes wait=False: if the bell is busy, the ring
        under way wakes the I/O thread, or the I/O thread was not asleep."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            self._socket.send(b"", NOBLOCK)
        except zmq.ZMQError:  # full: rings wait unheard already; or closed at shutdown
            pass
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._socket.close(0)
