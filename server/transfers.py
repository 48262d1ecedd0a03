"""Large copies over the network, as `vgpu ps` shows them while they stream.

A client without shared memory (on another host) sends a large copy as a stream of chunks,
each a message of its own (vgpu.client), and announces it first with the call
`vgpuTransfer(direction, total bytes)`. The server counts the bytes as they move: those of
host-to-device chunks as their messages arrive, those of device-to-host chunks as their
replies leave; `vgpu ps` shows the count against the total until the copy is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .session import op

__all__ = ["Transfers", "TRANSFER"]

TRANSFER = "vgpuTransfer"
DIRECTIONS = ("HtoD", "DtoH")
HTOD = "cuMemcpyHtoD"


@op(TRANSFER)
def _announced(session, direction: str, total: int) -> None:
    """Nothing to run: the server's I/O thread reads the announcement as it arrives."""


@dataclass
class _Transfer:
    direction: str
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)


class Transfers:
    """The copy each session has under way, by session id."""

    def __init__(self):
        self._under_way: dict[int, _Transfer] = {}

    def arrived(self, session, body: tuple) -> None:
        """A CALLS message of `session` arrived: an announcement, or chunks to count."""
        if type(body) is not tuple or not body:
            return
        first = body[0]
        announced = type(first) is tuple and len(first) == 2 and first[0] == TRANSFER
        if not (announced or self._under_way):
            return  # (most messages: no copy streams, and none is announced)
        if announced:
            args = first[1]
            if type(args) is tuple and len(args) == 2 and args[0] in DIRECTIONS and \
                    type(args[1]) is int and args[1] > 0:
                self._under_way[session.id] = _Transfer(args[0], args[1])
        transfer = self._under_way.get(session.id)
        if transfer is not None and transfer.direction == "HtoD":
            for call in body:
                if type(call) is tuple and len(call) == 2 and call[0] == HTOD and \
                        type(call[1]) is tuple and len(call[1]) >= 3 and type(call[1][2]) is int:
                    self._advance(session, transfer, call[1][2])

    def sent(self, session, payloads) -> None:
        """A reply of `session` left with `payloads`."""
        transfer = self._under_way.get(session.id)
        if transfer is not None and transfer.direction == "DtoH":
            self._advance(session, transfer, sum(len(p) for p in payloads))

    def _advance(self, session, transfer: _Transfer, n: int) -> None:
        transfer.done += n
        if transfer.done >= transfer.total:
            del self._under_way[session.id]

    def describe(self, session) -> dict | None:
        """{"direction", "done", "total", "seconds"} of the copy under way, or None."""
        transfer = self._under_way.get(session.id)
        if transfer is None:
            return None
        return {"direction": transfer.direction, "done": transfer.done,
                "total": transfer.total, "seconds": time.monotonic() - transfer.started}

    def forget(self, session) -> None:
        self._under_way.pop(session.id, None)
