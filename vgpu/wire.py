"""The round trip's socket calls in C (vgpu/c/zmq_wire.c), on the libzmq that pyzmq loaded.

    recv(sock, parts, spin_s, plain_prefix) -> None | (part, ..., more, origin)
    send(sock, part, ...) -> bool (False: the socket would block, and took nothing)

`sock` is a pyzmq socket's `underlying` handle: the caller keeps the socket open while it
uses the handle. See zmq_wire.c for what each returns and why these exist.
"""

from __future__ import annotations

import zmq
from zmq.backend.cython import _zmq

from . import _zmq_wire

__all__ = ["recv", "send"]


def _libzmq_candidates() -> list[str]:
    """Where the libzmq pyzmq uses may be: a shared library mapped into this process (a
    wheel's bundled copy or the system's), else pyzmq's own extension (linked statically)."""
    with open("/proc/self/maps") as maps:
        found = {line.split(maxsplit=5)[-1].strip() for line in maps if "libzmq" in line}
    return [*sorted(path for path in found if path.startswith("/")), _zmq.__file__]


def _init() -> None:
    errors = []
    for path in _libzmq_candidates():
        try:
            _zmq_wire.init(path)
            return
        except ImportError as exc:
            errors.append(str(exc))
    raise ImportError("vgpu cannot find the libzmq pyzmq " + zmq.__version__ + " uses: "
                      + "; ".join(errors))


_init()
# recv(sock, parts, spin_s, plain_prefix) and send(sock, part, ...) -> bool: see zmq_wire.c.
send, recv = _zmq_wire.send, _zmq_wire.recv
