"""Device-memory quotas: what each session, each client key, and the server as a whole may hold.

Every byte of device memory a session makes resident (allocations, stream-ordered pool
allocations, which are allocations here, and module `.global` variables) is charged to the
session's MemoryAccount before it is placed, and given back when it is freed. A charge that
would take the session past its own limit (`vgpu server --mem-limit`), its key's limit (the
`mem-limit` of its authorized-keys entry, shared by all the key's sessions) or the server's
(`--server-mem-limit`, by default the device's memory) fails with CUDA_ERROR_OUT_OF_MEMORY,
as an allocation on a full device does, and the session goes on. `cuMemGetInfo` answers from
the same figures: the session sees a device the size of its limit, less what it (and its key's
other sessions) hold.

Charges are in the arena's granules (what an allocation really takes), and accounts are
charged from sessions' worker threads: one lock guards the shared figures.
"""

from __future__ import annotations

import threading

from vgpu.errors import CudaError

from .arena import ALLOCATION_ALIGNMENT
from .peers import Peer, parse_size

__all__ = ["MemoryQuotas", "MemoryAccount"]

CUDA_ERROR_OUT_OF_MEMORY = 2

def _granules(size: int) -> int:
    return (max(size, 1) + ALLOCATION_ALIGNMENT - 1) // ALLOCATION_ALIGNMENT * \
        ALLOCATION_ALIGNMENT


class MemoryQuotas:
    """The server's budget: its total, the per-session limit, and each key's use."""

    def __init__(self, total: int, session_limit: int | None = None):
        self.total = total
        self.session_limit = session_limit
        self.used = 0
        self.key_used: dict[str, int] = {}
        self.lock = threading.Lock()

    def account(self, peer: Peer) -> MemoryAccount:
        key_limit = peer.options.get("mem-limit")
        if isinstance(key_limit, str):  # as the authorized-keys entry writes it: 4G
            key_limit = parse_size(key_limit)
        return MemoryAccount(self, peer.name, self.session_limit,
                             int(key_limit) if key_limit else None)


class MemoryAccount:
    """One session's share of a MemoryQuotas."""

    def __init__(self, quotas: MemoryQuotas, key: str, limit: int | None,
                 key_limit: int | None):
        self.quotas = quotas
        self.key = key
        self.limit = limit
        self.key_limit = key_limit
        self.used = 0

    def charge(self, size: int) -> None:
        """Take `size` bytes of device memory, or raise CUDA_ERROR_OUT_OF_MEMORY saying
        whose limit it would pass."""
        size = _granules(size)
        q = self.quotas
        with q.lock:
            key_used = q.key_used.get(self.key, 0)
            if self.limit is not None and self.used + size > self.limit:
                why = f"the session's limit of {_mib(self.limit)}"
            elif self.key_limit is not None and key_used + size > self.key_limit:
                why = f"the limit of {_mib(self.key_limit)} for {self.key}"
            elif q.used + size > q.total:
                why = f"the {_mib(q.total)} this server's sessions may hold together"
            else:
                self.used += size
                q.used += size
                q.key_used[self.key] = key_used + size
                return
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                        f"out of device memory: {size} more bytes would pass {why}")

    def release(self, size: int) -> None:
        self._give_back(min(_granules(size), self.used))

    def release_all(self) -> None:
        """The session ended: whatever it still holds goes back."""
        self._give_back(self.used)

    def _give_back(self, size: int) -> None:
        q = self.quotas
        with q.lock:
            self.used -= size
            q.used -= size
            left = q.key_used.get(self.key, 0) - size
            if left > 0:
                q.key_used[self.key] = left
            else:
                q.key_used.pop(self.key, None)

    def info(self) -> tuple[int, int]:
        """(free, total) as cuMemGetInfo reports them to the session: its limit is the
        device's size, and free is what its own limits leave it. Other principals' use is
        not shown (it would tell one user what another does, and make a recorded session's
        answers depend on who else ran beside it); past the server's total an allocation
        still fails, as one may on a shared GPU whose free memory someone else just took."""
        q = self.quotas
        with q.lock:
            total = min(x for x in (self.limit, self.key_limit, q.total) if x is not None)
            free = total - self.used
            if self.key_limit is not None:  # the key's other sessions are its own principal's
                free = min(free, self.key_limit - q.key_used.get(self.key, 0))
        return max(free, 0), total


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
