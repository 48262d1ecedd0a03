"""Where running vgpu servers announce themselves, so `vgpu ps` can find them all, and how
to ask one whether it answers.

Each server writes its address to `<runtime dir>/servers/<pid>` while it runs; entries of
servers that are gone are ignored and removed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .processes import pid_alive

__all__ = ["runtime_dir", "announce", "withdraw", "live_servers", "ask_sessions"]


def runtime_dir() -> Path:
    """vgpu's folder of the user's sockets, created owner-only. One another user made (in
    /tmp, anybody can make the user's folder first) is refused: its owner could replace the
    sockets in it."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/vgpu-{os.getuid()}"
    path = Path(base) / "vgpu"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (path, path.parent):
        info = folder.lstat()
        if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
            raise RuntimeError(f"{folder} belongs to another user (uid {info.st_uid}) or is "
                               "not a folder: vgpu keeps its sockets in folders of the user's "
                               "own (set XDG_RUNTIME_DIR)")
    return path


def _servers_dir() -> Path:
    path = runtime_dir() / "servers"
    path.mkdir(exist_ok=True)
    return path


def announce(address: str) -> None:
    (_servers_dir() / str(os.getpid())).write_text(address)


def withdraw() -> None:
    (_servers_dir() / str(os.getpid())).unlink(missing_ok=True)


def live_servers() -> list[tuple[int, str]]:
    found = []
    for entry in _servers_dir().iterdir():
        try:
            pid = int(entry.name)
        except ValueError:
            entry.unlink(missing_ok=True)
            continue
        if not pid_alive(pid):  # a server that died without withdrawing
            entry.unlink(missing_ok=True)
            continue
        try:
            found.append((pid, entry.read_text().strip()))
        except OSError:
            continue
    return sorted(found)


def ask_sessions(address: str, timeout_s: float) -> list[dict] | None:
    """The sessions the server at `address` serves, or None if it does not answer in time.
    A server that cannot be reached safely, or refuses us, is an AddressError saying why."""
    import zmq

    from vgpu.addresses import AddressError
    from vgpu.protocol import ADMIN, pack, unpack
    from vgpu.transport import TransportError, connect, wait_answer

    ctx = zmq.Context()
    try:
        sock, watch = connect(ctx, zmq.DEALER, address, watch=True)
    except TransportError as exc:
        ctx.term()
        raise AddressError(str(exc)) from None
    try:
        sock.send_multipart([pack([ADMIN, 1, ["ps", []]])])
        if not wait_answer(sock, watch, timeout_s):
            return None
        _, _, sessions, *_ = unpack(sock.recv_multipart()[0])
        return list(sessions or [])
    except TransportError as exc:
        raise AddressError(str(exc)) from None
    except (ValueError, TypeError):  # something answered, but not a vgpu server
        return None
    finally:
        watch.close()
        sock.close()
        ctx.term()
