"""How vgpu's sockets reach a server: CurveZMQ over tcp, kernel-checked credentials over ipc.

Over tcp every connection is encrypted and both ends authenticated (CurveZMQ): the client
proves its key (this user's `client.secret`, or VGPU_CLIENT_KEY names another file), and
checks that the server holds the secret of the public key it expects: the one given with the
address (`tcp://host:port#serverkey=KEY`) or else the one the known-servers file lists for
it (vgpu/keys.py). A server whose key is unknown is refused before anything is sent. Plain
tcp needs VGPU_INSECURE=1 (`vgpu run --insecure`), and says so on stderr.

A refused CurveZMQ handshake looks to a client like a silent server; a monitor on the socket
says what happened instead (the server refused our key, expects no encryption or does not
hold the key we expected), so that a hello that timed out can be explained.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import zmq

from .keys import KeyFileError, check_public, known_server_key, load_secret, vgpu_home

__all__ = ["TransportError", "split_address", "connect", "refusal", "wait_answer",
           "close_monitor", "INSECURE_ENV"]

INSECURE_ENV = "VGPU_INSECURE"
_warned: set[str] = set()
_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class TransportError(ValueError):
    """vgpu cannot connect to that server safely (no key for it, no key of ours, ...)."""


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
            secret_file: Path | None = None, watch: bool = False):
    """A socket of `kind` connected to the server at `address`, secured as its transport
    needs (`secret_file`: our key pair, default this user's client key); with `watch`,
    (socket, monitor) where `refusal(monitor)` explains a handshake that failed."""
    where, server_key = split_address(address)
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if where.startswith("tcp://"):
            _secure(sock, where, server_key, secret_file)
        monitor = sock.get_monitor_socket(_HANDSHAKE_EVENTS) if watch else None
        sock.connect(where)
    except BaseException:
        sock.close(linger=0)
        raise
    return (sock, monitor) if watch else sock


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


def refusal(monitor: zmq.Socket | None, address: str) -> str | None:
    """Why the server at `address` did not answer, when its handshake said so; None if the
    monitor saw no failed handshake (the server may just be gone or slow)."""
    from zmq.utils.monitor import recv_monitor_message

    if monitor is None:
        return None
    why = None
    while monitor.poll(0):
        event = recv_monitor_message(monitor)
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            why = None
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            why = (f"the vgpu server at {address} did not accept this client"
                   + ("'s user" if address.startswith("ipc") else
                      "'s key (or is not a vgpu server): add its public key (client.pub) to "
                      "the server's authorized-keys folder"))
        elif insecure():  # whether the server says which, or closes the connection
            why = (f"the server at {address} refused a plain (unencrypted) connection: it "
                   f"requires encryption (CurveZMQ); unset {INSECURE_ENV} and give its key")
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = (f"the server at {address} expects plain tcp, not encryption (a vgpu "
                   "server started with --insecure?)")
        else:
            why = (f"the server at {address} does not hold the key this client expects "
                   "for it (or is not a vgpu server)")
    return why


def wait_answer(sock: zmq.Socket, monitor: zmq.Socket | None, address: str,
                timeout_s: float) -> bool:
    """Wait up to `timeout_s` for something to read on `sock`; False if nothing came. A
    refused handshake raises TransportError at once, saying why, rather than after the
    timeout (libzmq would go on retrying it)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not sock.poll(50):
        why = refusal(monitor, address)
        if why:
            raise TransportError(why)
        if time.monotonic() >= deadline:
            return False
    return True


def close_monitor(sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
    if monitor is not None:
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass
        monitor.close(linger=0)
