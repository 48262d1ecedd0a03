"""Server addresses as users type them (`--listen`, `--server`, VGPU_SERVER) and the ipc
socket files behind them.

An address is checked before zmq sees it, so that a typo is one clear line rather than a zmq
error, and a port out of range is refused rather than wrapped around to another port. An ipc
socket file is probed before a server takes it: zmq would silently replace the socket of a
running server, leaving that server alive and unreachable.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import struct

__all__ = ["AddressError", "check_address", "ipc_path", "listener_pid", "socket_folder",
           "folder_turn", "claim_ipc_socket", "remove_socket_file"]

# sockaddr_un holds 108 bytes, the terminating NUL included.
MAX_IPC_PATH_BYTES = 107
_FORMS = "ipc:///path/to/socket or tcp://host:port"


class AddressError(ValueError):
    """An address vgpu cannot use; the message gives the reason (callers name the address)."""


def check_address(address: str, *, listen: bool = False) -> str:
    """The address unchanged if it is one vgpu can connect to (or, with `listen`, bind). A
    tcp address may carry the server's key (`tcp://host:port#serverkey=KEY`, see
    vgpu.transport)."""
    if "#" in address:
        from vgpu.transport import TransportError, split_address

        if listen:
            raise AddressError("a listening address takes no #serverkey (the server's key "
                               "is its --key)")
        try:
            check_address(split_address(address)[0])
        except TransportError as exc:
            raise AddressError(str(exc).removeprefix(f"{address}: ")) from None
        return address
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in ("ipc", "tcp") or not rest:
        raise AddressError(f"not a server address: use {_FORMS}")
    if scheme == "ipc":
        if len(os.fsencode(rest)) > MAX_IPC_PATH_BYTES:
            raise AddressError(f"the socket path is longer than {MAX_IPC_PATH_BYTES} bytes, "
                               "the most a unix socket allows")
        return address
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise AddressError("a tcp address needs a host and a port (tcp://host:port)")
    if listen and port == "*":  # any free port; the server prints the one it got
        return address
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise AddressError(f"{port!r} is not a port number (1 to 65535)")
    return address


def ipc_path(address: str) -> str | None:
    """The socket file of an ipc address; None for other transports."""
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def listener_pid(path: str) -> int | None:
    """The pid of the process listening on the unix socket `path`, or None when nobody does
    (no file, or the stale file of a process that is gone)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(mode):
        raise AddressError("the file exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except OSError as exc:
        raise AddressError(f"cannot probe the socket: {exc.strerror}") from None
    try:
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]  # the listener's pid, as of its listen()
    finally:
        probe.close()


def socket_folder(path: str, own_folder: str) -> str:
    """The folder a server's socket goes in. Only vgpu's own runtime folder (`own_folder`) is
    created; any other must exist."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder == os.path.abspath(own_folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    elif not os.path.isdir(folder):
        raise AddressError(f"the folder {folder} does not exist")
    return folder


@contextlib.contextmanager
def folder_turn(folder: str):
    """Hold an exclusive lock on `folder` while inside (flock works on a folder's descriptor):
    servers starting together in one folder take turns from the probe of their socket to its
    bind, so that the second finds the first's socket in use."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim_ipc_socket(path: str) -> None:
    """Make `path` free for a new server: refuse one in use, remove a stale one."""
    pid = listener_pid(path)
    if pid is not None:
        raise AddressError(f"already served by pid {pid}")
    remove_socket_file(path)


def remove_socket_file(path: str) -> None:
    """Remove a socket file nobody listens on any more (a no-op if it is gone)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
