"""Peer: who is on the other end of a session's connection, as the server verified it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Peer", "parse_size"]

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Peer:
    transport: str            # "ipc" | "curve" | "plain" (tcp --insecure) | "inproc"
    uid: int | None = None    # ipc only: kernel-verified
    gid: int | None = None
    pid: int | None = None    # ipc only: kernel-verified pid of the connecting process
    key: str | None = None    # curve only: the client's public key (z85)
    name: str = ""            # who, for ps/logs/quotas: "uid 1000", "key alice", "tcp 10.0.0.2"
    options: dict = field(default_factory=dict)  # from the authorized-keys entry, e.g.
    # {"mem-limit": 4 << 30, "sessions": 4, "admin": True}

    @property
    def local(self) -> bool:
        """May share memory and segments with the server, and be probed."""
        return self.transport in ("ipc", "inproc") and self.pid is not None


def parse_size(text: str) -> int:
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].isalpha() else (text, "")
    if unit not in _SIZE_UNITS or not number.isdigit():
        raise ValueError(f"{text!r} is not a size (like 512M or 4G)")
    return int(number) * _SIZE_UNITS[unit]
