"""Whether a process still runs: for a client watching its local server, and a server
watching its local clients."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its parent, does not:
    it holds no more GPU work and will answer nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel, which counts a zombie as alive
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
