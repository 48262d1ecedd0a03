"""Admin requests to a running vgpu server, as `vgpu checkpoint`, `suspend`, `resume` and
`migrate` send them: one request, the progress notices the server sends while it works on
it, and its answer."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["AdminError", "request"]


class AdminError(Exception):
    """The server refused the request (its message), went away, or did not answer."""


def request(address: str, op: str, args: list,
            progress: Callable[[str, int, int], None] | None = None,
            timeout_s: float | None = None) -> object:
    """Send ADMIN [op, args] to the server at `address` and return its result. While it works
    the server sends progress notices, passed to `progress(phase, done, total)`; a silence
    longer than `timeout_s` (default: VGPU_TIMEOUT, else the protocol's) is an AdminError, as
    is a refusal (the server's message) or a server that shuts down meanwhile."""
    import zmq

    from vgpu.protocol import ADMIN, DEFAULT_TIMEOUT_S, KEEPALIVE_SEQ, ProtocolError, pack, unpack
    from vgpu.transport import TransportError, connect, wait_answer

    if timeout_s is None:
        timeout_s = float(os.environ.get("VGPU_TIMEOUT") or DEFAULT_TIMEOUT_S)
    ctx = zmq.Context()
    try:
        sock, watch = connect(ctx, zmq.DEALER, address, watch=True)
    except TransportError as exc:
        ctx.term()
        raise AdminError(f"cannot connect to {address}: {exc}") from None
    seq = 1
    try:
        sock.send_multipart([pack([ADMIN, seq, [op, args]])])
        while True:
            try:
                if not wait_answer(sock, watch, timeout_s):
                    raise AdminError(f"no answer from {address} in {timeout_s:g} s")
            except TransportError as exc:
                raise AdminError(str(exc)) from None
            try:
                header = unpack(sock.recv_multipart()[0])
                reply_seq, code, result = header[:3]
            except (ProtocolError, TypeError, ValueError):
                raise AdminError(f"{address} answered, but not as a vgpu server") from None
            if reply_seq == KEEPALIVE_SEQ:
                if code:  # the server is going away
                    raise AdminError(f"the server at {address} stopped: {result}")
                _report(result, progress)
            elif reply_seq == seq:
                if code:
                    raise AdminError(str(result))
                return result
    finally:
        watch.close()
        sock.close()
        ctx.term()


def _report(notice, progress) -> None:
    """A notice's progress, if it has any: others (keepalives) say only that it works."""
    if progress is None or not isinstance(notice, dict):
        return
    step = notice.get("progress")
    if (isinstance(step, list) and len(step) == 3 and isinstance(step[0], str)
            and all(isinstance(n, int) for n in step[1:])):
        progress(*step)
