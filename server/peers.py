"""Peer: who is on the other end of a session's connection, as the server verified it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Peer", "LOCAL"]


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
        return self.transport in ("ipc", "inproc")


# Sessions whose connection says nothing about its peer (restored from an image, made by
# tests): one anonymous local peer, with no limits of its own.
LOCAL = Peer("inproc", name="local")
