"""Connections that drop and come back: the server's side of a network blip.

A client reaches us through one zmq connection, and the ROUTER names each connection with a
routing identity of its own; a session is bound to the identity of its client's connection.
A TCP connection can drop while both ends live (a network blip, a proxy that cuts it). Then:

- The client opens a new connection and says hello with its session token and "resume"
  (see vgpu.protocol). A live session with that token is rebound to the new identity: its
  worker's replies to come go there, and the hello's answer says the position the session
  has reached (the CALLS messages received), so the client resends only what never
  arrived. A message is counted only when it arrives from the identity the session is bound
  to, so none runs twice: what was still queued on the dead connection is dropped.
- Replies sent on the dead connection may have been lost. The session keeps its recent
  replies (ReplyLog), and the resuming hello names the seqs the client still waits for;
  those that were sent are sent again, after the hello's answer.
- A connection that drops and is not resumed within the grace period (`--reconnect-grace`)
  ends its session. That is also how a client that vanished (a remote host powered off, a
  cable pulled) is noticed, whose pid we cannot watch: ZMTP heartbeats make zmq close a
  connection whose peer stopped answering, and a socket monitor tells us (libzmq's
  ROUTER_NOTIFY would too, but it is a draft API that released builds lack). The monitor
  names connections by file descriptor; each message's source descriptor (zmq's SRCFD)
  ties a session's identity to its descriptor.
"""

from __future__ import annotations

import collections
import logging
import time

import zmq

from vgpu.transport import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS

__all__ = ["ConnectionsMixin", "ReplyLog", "DEFAULT_RECONNECT_GRACE_S"]

log = logging.getLogger("vgpu.server")

CUDA_ERROR_NOT_PERMITTED = 800
# How long a session whose connection dropped waits for its client to come back.
DEFAULT_RECONNECT_GRACE_S = 5.0
# Replies a session keeps for a client that may have lost them (over TCP: a local socket
# does not drop while both ends live). vgpu's client waits for a few at a time (its marks in
# flight, its synchronizing call, the four 2 MiB chunks of a copy it streams back) and asks
# for nothing more before it has those; so the newest REPLIES_KEPT replies, or
# REPLY_BYTES_KEPT of their data (the newest is kept whatever its size), hold every reply it
# may be waiting for.
REPLIES_KEPT = 64
REPLY_BYTES_KEPT = 16 << 20


class ReplyLog:
    """A session's recent replies (header and payload frames), by seq, oldest first."""

    def __init__(self):
        self._replies: collections.OrderedDict[int, tuple[list, tuple]] = \
            collections.OrderedDict()
        self._bytes = 0

    def keep(self, seq: int, header: list, payloads) -> None:
        # (Every reply of a tcp session passes here: the common one, without payloads,
        # costs a store and a length check.)
        payloads = tuple(payloads) if payloads else ()
        replies = self._replies
        replies[seq] = (header, payloads)
        if payloads:
            self._bytes += _size(payloads)
        while len(replies) > REPLIES_KEPT or \
                (self._bytes > REPLY_BYTES_KEPT and len(replies) > 1):
            _, (_, old) = replies.popitem(last=False)
            if old:
                self._bytes -= _size(old)

    def replies(self, seqs) -> list[tuple[list, tuple]]:
        """The kept replies to `seqs`, in the order they were sent."""
        wanted = {s for s in seqs if type(s) is int}
        return [reply for seq, reply in self._replies.items() if seq in wanted]


def _size(payloads) -> int:
    return sum(len(p) for p in payloads)


class ConnectionsMixin:
    """ProxyServer's connection bookkeeping; the attributes it uses are ProxyServer's."""

    def _init_connections(self, grace_s: float) -> None:
        self.reconnect_grace = grace_s
        self._keeps_replies = self.endpoint.startswith("tcp://")
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        # The last message's origin (vgpu.wire.recv: User-Id, descriptor), None for CALLS.
        self.last_origin: tuple[str | None, int] | None = None
        self._identity_of_fd: dict[int, bytes] = {}
        self._fd_of_identity: dict[bytes, int] = {}
        self._dropped: dict[bytes, float] = {}  # identity -> when its connection dropped
        self._reply_logs: dict[int, ReplyLog] = {}  # session id -> its recent replies

    def _close_connections(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(0)

    def _bind_connection(self, identity: bytes) -> None:
        """The client at `identity` (saying hello) came through the current message's
        descriptor.
        The monitor's news is read first: a descriptor that closed may be reused at once,
        and its old connection's end must not be taken for the new one's."""
        self._connection_events()
        fd = self.last_origin[1]  # the descriptor the hello came through
        if fd >= 0:
            earlier = self._identity_of_fd.get(fd)
            if earlier is not None and earlier != identity:
                self._fd_of_identity.pop(earlier, None)
            self._identity_of_fd[fd] = identity
            self._fd_of_identity[identity] = fd

    def _forget_connection(self, identity: bytes) -> None:
        fd = self._fd_of_identity.pop(identity, None)
        if fd is not None and self._identity_of_fd.get(fd) == identity:
            del self._identity_of_fd[fd]
        self._dropped.pop(identity, None)

    def _connection_events(self) -> None:
        """Read the monitor: a session whose connection dropped starts its grace period."""
        while True:
            try:
                event = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int.from_bytes(event[0][2:6], "little")  # [u16 event, u32 value], endpoint
            identity = self._identity_of_fd.pop(fd, None)
            if identity is None:
                continue
            self._fd_of_identity.pop(identity, None)
            if identity in self.sessions:
                self._dropped[identity] = time.monotonic()
                log.info("session %d: its connection dropped; waiting %g s for its client",
                         self.sessions[identity].id, self.reconnect_grace)

    def _end_dropped_sessions(self) -> None:
        now = time.monotonic()
        for identity, since in list(self._dropped.items()):
            if now - since >= self.reconnect_grace:
                self._close_session(identity, f"its connection dropped {now - since:.1f} s "
                                              "ago and its client did not come back")

    def _keep_reply(self, identity: bytes, header: list, payloads) -> None:
        session = self.sessions.get(identity) if self._keeps_replies else None
        if session is not None:
            log_ = self._reply_logs.get(session.id)
            if log_ is None:
                log_ = self._reply_logs[session.id] = ReplyLog()
            log_.keep(header[0], header, payloads)

    def _forget_replies(self, session) -> None:
        self._reply_logs.pop(session.id, None)

    def _rebind(self, identity: bytes, seq, hello: dict, peer) -> bool:
        """A resuming hello from a new connection, for a session served here: bind the
        session to `identity`, answer the hello, and send again the replies its client still
        waits for. False when no session served here has the hello's token. The token alone
        is not enough: the new connection must be the session's own client (the same user
        or key, see peers.Peer.owns), or it is refused."""
        token = hello.get("token")
        old = next((i for i, s in self.sessions.items()
                    if s.token == token and i != identity), None) \
            if isinstance(token, str) else None
        if old is None:
            return False
        if not peer.owns(self.sessions[old].peer):
            log.warning("refused %s a session of %s (it presented the session's token)",
                        peer.name, self.sessions[old].peer.name)
            self._reply(identity, seq, CUDA_ERROR_NOT_PERMITTED,
                        "the session belongs to another client")
            return True
        if identity in self.sessions:  # this connection's own session gives way
            self._close_session(identity, "its client took another session back")
        session = self.sessions.pop(old)
        self.sessions[identity] = session
        self.slots[identity] = self.slots.pop(old)
        worker = self.workers.pop(old)
        worker.identity = identity
        self.workers[identity] = worker
        self._forget_connection(old)
        self._bind_connection(identity)
        log.info("session %d: its client reconnected at message %d", session.id,
                 session.position)
        self._welcome(identity, seq, session)
        resume = hello.get("resume")
        waiting = resume.get("waiting") if isinstance(resume, dict) else None
        log_ = self._reply_logs.get(session.id)
        if log_ is not None and isinstance(waiting, (list, tuple)):
            for header, payloads in log_.replies(waiting):
                self._send_reply(identity, header, payloads)
        return True

