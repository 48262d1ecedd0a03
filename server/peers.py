"""Who is on the other end of each connection, as the server verified it (never as the client
says).

zmq asks a ZAP handler (RFC 27, a thread here) about every new connection before any message
of it is delivered:
- over ipc, libzmq passes the peer's credentials, read by the kernel (SO_PEERCRED), in the
  request's address: "localhost:UID:GID:PID". A peer is admitted when its uid is the
  server's, root, or (`vgpu server --group G`) one of G's members;
- over tcp with CurveZMQ (the default), the client's public key, which the handshake proved
  it holds: admitted when a file of the authorized-keys folder names it (`NAME.key`, its
  first line `PUBLICKEY [mem-limit=SIZE] [sessions=N] [admin]`);
- over plain tcp (`--insecure`), the peer's IP address: everybody is admitted.
The handler's answer names the Peer (as JSON, its "User-Id"), and libzmq stamps it on every
message of that connection, so the server reads who sent a message from the message itself.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85

from vgpu.keys import KeyFileError, check_public, load_secret

__all__ = ["Peer", "Access", "AccessError", "read_authorized_keys", "parse_size", "peer_of"]

log = logging.getLogger("vgpu.server")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"vgpu"
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Peer:
    transport: str            # "ipc" | "curve" | "plain" (tcp --insecure) | "inproc"
    uid: int | None = None    # ipc only: kernel-verified
    gid: int | None = None
    pid: int | None = None    # ipc only: kernel-verified pid of the connecting process
    key: str | None = None    # curve only: the client's public key (z85)
    name: str = ""            # who, for ps/logs/quotas: "uid 1000", "key alice", "tcp 10.0.0.2"
    options: dict = field(default_factory=dict)  # from the authorized-keys entry

    @property
    def local(self) -> bool:
        """Whether it runs on this host as a process the kernel named: it may share memory
        and segments with the server, and be probed for direct copies."""
        return self.transport in ("ipc", "inproc") and self.pid is not None

    @property
    def admin(self) -> bool:
        """Whether it may act on every session (ps, checkpoint, move, hand sessions over):
        the server's own user or root on this host, or a key the server marked `admin`."""
        if self.transport in ("ipc", "inproc"):
            return self.uid in (os.getuid(), 0)
        return self.transport == "curve" and bool(self.options.get("admin"))

    def owns(self, other: Peer | None) -> bool:
        """Whether sessions opened by `other` are this peer's own (same user or same key)."""
        if other is None or other.transport != self.transport:
            return False
        if self.transport in ("ipc", "inproc"):
            return self.uid == other.uid
        return self.name == other.name and bool(self.name)

    def user_id(self) -> str:
        return json.dumps(asdict(self))


# A message on a connection the ZAP handler did not see: fail closed (admitted to nothing).
UNKNOWN = Peer("unknown", name="unknown peer")


def peer_of(origin: tuple[str | None, int], inproc: bool) -> Peer:
    """The verified peer that sent a message of a ROUTER socket of ours, from its origin
    (vgpu.wire.recv: the ZAP handler's User-Id, None where no ZAP ran, and a descriptor)."""
    user_id = origin[0]
    if user_id is None:  # no ZAP on this connection: only inproc skips it
        if inproc:
            return Peer("inproc", uid=os.getuid(), gid=os.getgid(), pid=os.getpid(),
                        name="local")
        return UNKNOWN
    try:
        fields = json.loads(user_id)
        return Peer(**fields)
    except (ValueError, TypeError):
        return UNKNOWN


class AccessError(ValueError):
    """A server cannot listen as asked (no key, no authorized-keys folder, no such group)."""


def parse_size(text: str) -> int:
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].isalpha() else (text, "")
    if unit not in _SIZE_UNITS or not number.isdigit():
        raise ValueError(f"{text!r} is not a size (like 512M or 4G)")
    return int(number) * _SIZE_UNITS[unit]


def _parse_entry(line: str, where: str) -> tuple[str, dict]:
    key, *words = line.split()
    check_public(key, where)
    options: dict = {}
    for word in words:
        name, eq, value = word.partition("=")
        if name == "admin" and not eq:
            options["admin"] = True
        elif name == "mem-limit" and eq:
            options["mem-limit"] = parse_size(value)
        elif name == "sessions" and eq and value.isdigit():
            options["sessions"] = int(value)
        else:
            raise ValueError(f"unknown option {word!r} (known: mem-limit=SIZE, sessions=N, "
                             "admin)")
    return key, options


def read_authorized_keys(folder: Path) -> dict[str, tuple[str, dict]]:
    """public key -> (name, options) of every `NAME.key` in `folder`. An entry that does not
    parse is left out (and logged): it admits nobody, rather than somebody by mistake."""
    keys: dict[str, tuple[str, dict]] = {}
    try:
        entries = sorted(folder.glob("*.key"))
    except OSError as exc:
        log.warning("cannot read the authorized-keys folder %s: %s", folder, exc)
        return keys
    for path in entries:
        try:
            first = path.read_text().splitlines()[0].strip()
            key, options = _parse_entry(first, str(path))
        except (OSError, IndexError, ValueError) as exc:
            log.warning("ignoring %s: %s", path, exc or "it is empty")
            continue
        keys[key] = (path.name[:-len(".key")], options)
    return keys


@dataclass
class Access:
    """Who a server admits, and how its socket is secured (see the module's docstring)."""

    insecure: bool = False                # plain tcp (`--insecure`)
    secret_file: Path | None = None       # the server's key pair (tcp)
    authorized_keys: Path | None = None   # the clients' public keys (tcp)
    group: str | None = None              # local users admitted besides the server's
    public_key: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._gid = None
        if self.group is not None:
            try:
                self._gid = grp.getgrnam(self.group).gr_gid
            except KeyError:
                raise AccessError(f"--group: no group {self.group!r}") from None

    def secure(self, context: zmq.Context, socket: zmq.Socket, address: str) -> None:
        """Set `socket` (not yet bound to `address`) up and start answering ZAP requests."""
        if address.startswith("tcp://") and not self.insecure:
            if self.authorized_keys is None or not self.authorized_keys.is_dir():
                raise AccessError(f"no authorized-keys folder {self.authorized_keys}: create "
                                  "it and put the public key (client.pub) of each client "
                                  "there as NAME.key")
            try:
                public, secret = load_secret(self.secret_file)
            except KeyFileError as exc:
                raise AccessError(f"{exc} (a tcp server needs its key pair: "
                                  "`vgpu keygen --server`)") from None
            socket.curve_server = True
            socket.curve_secretkey = secret
            self.public_key = public.decode()
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        # Without an answer from the handler a connection is refused, not let through.
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        handler = context.socket(zmq.REP)
        handler.setsockopt(zmq.LINGER, 0)
        handler.bind(ZAP_ENDPOINT)
        threading.Thread(target=self._answer, args=(handler,), name="vgpu-zap",
                         daemon=True).start()

    def link_key(self) -> Path | None:
        """The key pair this server connects to others with (handing a session over): its
        own, if it has one; else (None) its user's client key."""
        if self.secret_file is not None and self.secret_file.exists():
            return self.secret_file
        return None

    def open_socket_file(self, path: str) -> None:
        """The ipc socket at `path`, bound: owner-only, or its group's with --group (whose
        folder then lets the group through too)."""
        if self._gid is None:
            os.chmod(path, 0o600)
            return
        folder = os.path.dirname(path)
        for where, mode in ((path, 0o660), (folder, os.stat(folder).st_mode & 0o777 | 0o010)):
            os.chown(where, -1, self._gid)
            os.chmod(where, mode)

    def _answer(self, handler: zmq.Socket) -> None:
        """The ZAP handler: answer until the context is terminated."""
        try:
            while True:
                request = handler.recv_multipart()
                handler.send_multipart(self._verdict(request))
        except zmq.ContextTerminated:
            pass
        finally:
            handler.close(linger=0)

    def _verdict(self, request: list[bytes]) -> list[bytes]:
        version, request_id = request[0], request[1]
        try:
            address, mechanism = request[3].decode(), request[5]
            peer, refusal = self._admit(address, mechanism, request[6:])
        except Exception as exc:  # refuse, and keep answering: a dead handler admits nobody
            log.error("ZAP request %.200r failed: %s", request, exc)
            peer, refusal = None, f"internal error: {exc}"
        if peer is None:
            log.warning("refused a connection: %s", refusal)
            return [version, request_id, b"400", refusal.encode(), b"", b""]
        return [version, request_id, b"200", b"OK", peer.user_id().encode(), b""]

    def _admit(self, address: str, mechanism: bytes, credentials: list[bytes]
               ) -> tuple[Peer | None, str]:
        if mechanism == b"CURVE":
            key = z85.encode(credentials[0]).decode()
            entry = read_authorized_keys(self.authorized_keys).get(key)
            if entry is None:
                return None, f"key {key} from {address} is not in {self.authorized_keys}"
            name, options = entry
            return Peer("curve", key=key, name=f"key {name}", options=options), ""
        if mechanism != b"NULL":
            return None, f"mechanism {mechanism!r} from {address}"
        host, sep, creds = address.partition(":")
        if host == "localhost" and sep and creds.count(":") == 2:  # ipc: SO_PEERCRED
            uid, gid, pid = (int(n) for n in creds.split(":"))
            if not self._local_user_admitted(uid, gid):
                return None, f"local uid {uid} (pid {pid}) is not admitted"
            return Peer("ipc", uid=uid, gid=gid, pid=pid, name=f"uid {uid}"), ""
        if self.insecure:
            return Peer("plain", name=f"tcp {address}"), ""
        return None, f"an unencrypted connection from {address}"

    def _local_user_admitted(self, uid: int, gid: int) -> bool:
        if uid in (os.getuid(), 0):
            return True
        if self._gid is None:
            return False
        if gid == self._gid:
            return True
        try:
            user = pwd.getpwuid(uid)
            return user.pw_gid == self._gid or user.pw_name in grp.getgrgid(self._gid).gr_mem
        except KeyError:
            return False
