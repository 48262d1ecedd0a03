"""How vgpu's sockets reach a server: CurveZMQ over tcp, kernel-checked credentials over ipc.

Over tcp every connection is encrypted and both ends authenticated (CurveZMQ): the client
proves its key (this user's `client.secret`, or VGPU_CLIENT_KEY names another file), and
checks that the server holds the secret of the public key it expects: the one given with the
address (`tcp://host:port#serverkey=KEY`) or else the one the known-servers file lists for
it (vgpu/keys.py). A server whose key is unknown is refused before anything is sent. Plain
tcp needs VGPU_INSECURE=1 (`vgpu run --insecure`), and says so on stderr.

A refused CurveZMQ handshake looks to a client like a silent server; a monitor on the socket
says what happened instead (the server refused our key, expects no encryption or does not
hold the key we expected), so that a hello that timed out can be explained. A refusal that
libzmq takes for a protocol error (a plain client at a CurveZMQ server, or the other way
round) also ends the connection for good: libzmq stops reconnecting and drops the socket's
queue, after which a blocking send waits forever; send_within sends without that risk, and
vgpu.client sends so every message the socket does not take at once.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path

import zmq

from .keys import KeyFileError, check_public, known_server_key, load_secret, vgpu_home

__all__ = ["TransportError", "ConnectionDropped", "Watch", "split_address", "connect",
           "wait_answer", "send_within", "INSECURE_ENV", "HEARTBEAT_IVL_MS",
           "HEARTBEAT_TIMEOUT_MS", "EVENTS", "POLLIN", "RCVMORE", "NOBLOCK", "SNDMORE", "SRCFD"]

INSECURE_ENV = "VGPU_INSECURE"
# zmq's constants as plain ints: its enums' own operators cost microseconds a call, and
# these are asked while a round trip waits.
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
RCVMORE = int(zmq.RCVMORE)
NOBLOCK, SNDMORE, SRCFD = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.SRCFD)
# ZMTP heartbeats on tcp connections (both ends): a peer silent this long (no data, no PONG)
# loses its connection. zmq's I/O threads answer them, so a client busy computing on its
# host, or a server busy running kernels, still answers.
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 4000
# How long handshakes must go on failing without detail before that is taken for a refusal
# (see Watch.refusal): a network that cuts connections, on a loaded machine whose handshakes
# are slow, may cut several in a row, but not for this long.
REFUSAL_AFTER_S = 2.0
_warned: set[str] = set()
_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class TransportError(ValueError):
    """vgpu cannot connect to that server safely (no key for it, no key of ours, ...)."""


class ConnectionDropped(TransportError):
    """The connection dropped while an answer was awaited: what was sent may be lost."""


def split_address(address: str) -> tuple[str, str | None]:
    """(what zmq connects to, the server key given with the address, if any)."""
    where, sep, fragment = address.partition("#")
    if not sep:
        return address, None
    name, _, value = fragment.partition("=")
    if name != "serverkey" or not where.startswith("tcp://"):
        raise TransportError(f"{address}: only a tcp address takes a suffix, "
                             "#serverkey=PUBLICKEY")
    try:
        return where, check_public(value, "#serverkey")
    except KeyFileError as exc:
        raise TransportError(str(exc)) from None


def insecure() -> bool:
    return os.environ.get(INSECURE_ENV, "") not in ("", "0")


def connect(context: zmq.Context, kind: int, address: str, *,
            secret_file: Path | None = None, watch: bool = False, drops: bool = False):
    """A socket of `kind` connected to the server at `address`, secured as its transport
    needs (`secret_file`: our key pair, default this user's client key); with `watch`,
    (socket, Watch): what its connection went through, a refused handshake above all, and
    with `drops` its connection dropping."""
    where, server_key = split_address(address)
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if where.startswith("tcp://"):
            _secure(sock, where, server_key, secret_file)
        if drops:  # a silent connection is closed, and so seen to drop
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        watcher = Watch(sock, address, drops) if watch else None
        sock.connect(where)
    except BaseException:
        sock.close(linger=0)
        raise
    return (sock, watcher) if watch else sock


def _secure(sock: zmq.Socket, where: str, server_key: str | None,
            secret_file: Path | None) -> None:
    if insecure():
        if where not in _warned:
            _warned.add(where)
            print(f"vgpu: warning: {where} without encryption or authentication "
                  f"({INSECURE_ENV}): anyone on the network path can read and change what "
                  "this program sends", file=sys.stderr)
        return
    try:
        server_key = server_key or known_server_key(where)
        if server_key is None:
            raise TransportError(
                f"the key of the server at {where} is unknown: give it with the address "
                f"({where}#serverkey=PUBLICKEY) or add `{where} PUBLICKEY` to "
                f"{vgpu_home() / 'known-servers'} (its server.pub holds it); "
                f"{INSECURE_ENV}=1 connects without encryption")
        public, secret = load_secret(secret_file or _client_key_file())
    except KeyFileError as exc:
        raise TransportError(str(exc)) from None
    sock.curve_serverkey = server_key.encode()
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def _client_key_file() -> Path:
    named = os.environ.get("VGPU_CLIENT_KEY")
    return Path(named) if named else vgpu_home() / "client.secret"


class Watch:
    """A monitor of a socket's connection: why its handshake failed, if it did, and whether
    it dropped since last asked (zmq reconnects by itself, but as a new connection, which a
    server does not know)."""

    def __init__(self, sock: zmq.Socket, address: str, drops: bool):
        self.sock, self.address = sock, address
        events = _HANDSHAKE_EVENTS | (zmq.EVENT_DISCONNECTED if drops else 0)
        self.monitor = sock.get_monitor_socket(events)
        self._why: str | None = None
        # Handshakes failed without detail since the last one that succeeded, and since when.
        self._silent_failures = 0
        self._failing_since = 0.0
        self._dropped = False

    def _read(self) -> None:
        while self.monitor.poll(0):
            # A monitor's message: the event (u16) and its value (u32), then the endpoint.
            # Read here, not with zmq.utils.monitor, which imports asyncio: in a C program,
            # whose Python must leave SIGINT alone, importing `signal` would take it over.
            kind = struct.unpack_from("=H", self.monitor.recv_multipart()[0])[0]
            if kind == zmq.EVENT_DISCONNECTED:
                self._dropped = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._why, self._silent_failures = None, 0
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                if not self._silent_failures:
                    self._failing_since = time.monotonic()
                self._silent_failures += 1
            else:
                self._why = _refusal(kind, self.address)

    def refusal(self, final: bool = False) -> str | None:
        """Why the server did not answer, when its handshakes said so; None if none failed
        (the server may just be gone or slow). A server that does not hold the key we
        expect closes the connection without a word, as a connection cut during its
        handshake fails it; and zmq connects again by itself. So handshakes failing without
        detail say it only once they have failed for REFUSAL_AFTER_S, or, when the caller
        gives up waiting (`final`), at once, but two in a row at least."""
        self._read()
        if self._why is None and self._silent_failures > 1 and (
                final or time.monotonic() - self._failing_since >= REFUSAL_AFTER_S):
            return _refusal(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, self.address)
        return self._why

    def dropped(self) -> bool:
        """Whether the connection dropped since the last time this was asked."""
        self._read()
        dropped, self._dropped = self._dropped, False
        return dropped

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)


def _refusal(kind: int, address: str) -> str:
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the vgpu server at {address} did not accept this client"
                + ("'s user" if address.startswith("ipc") else
                   "'s key (or is not a vgpu server): add its public key (client.pub) to "
                   "the server's authorized-keys folder"))
    if insecure():  # whether the server says which, or closes the connection
        return (f"the server at {address} refused a plain (unencrypted) connection: it "
                f"requires encryption (CurveZMQ); unset {INSECURE_ENV} and give its key")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return (f"the server at {address} expects plain tcp, not encryption (a vgpu "
                "server started with --insecure?)")
    return (f"the server at {address} does not hold the key this client expects for it "
            "(or is not a vgpu server)")


def wait_answer(sock: zmq.Socket, watch: Watch | None, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for something to read on `sock`; False if nothing came. A
    refused handshake raises TransportError at once, saying why, rather than after the
    timeout (libzmq would go on retrying it); a connection watched for drops that dropped
    raises ConnectionDropped (zmq connects again by itself, but what was sent is lost)."""
    return _wait(sock, watch, time.monotonic() + timeout_s, POLLIN)


def send_within(sock: zmq.Socket, watch: Watch | None, parts: list, timeout_s: float,
                copy: bool = True) -> bool:
    """Send `parts` as one message once `sock` takes it, within `timeout_s`; False if it did
    not. Raises as wait_answer does: a socket whose handshake was refused as a protocol error
    takes nothing ever again (see above), and the refusal says why."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.send_multipart(parts, NOBLOCK, copy=copy)
            return True
        except zmq.Again:
            if not _wait(sock, watch, deadline, POLLOUT):
                return False


def _wait(sock: zmq.Socket, watch: Watch | None, deadline: float, event: int) -> bool:
    while not sock.poll(50, event):
        why = watch.refusal() if watch is not None else None
        if why:
            raise TransportError(why)
        if watch is not None and watch.dropped():
            raise ConnectionDropped(f"the connection to {watch.address} dropped")
        if time.monotonic() >= deadline:
            return False
    return True
