"""Journal: a session's live objects, each with what it takes to make it again.

A session records every object its state-changing calls create (contexts, allocations at
their addresses, modules with their images and their variables' addresses, functions,
streams, events, and the virtual memory API's reservations, physical allocations and
mappings) and forgets each one its calls destroy. The journal is therefore always
compacted: at any moment it is exactly the session's live objects, in the order they were
created, so replaying it in order recreates them with every parent before its children.

Recording costs one dict insertion per created object and one deletion per destroyed one;
launches and copies record nothing (memory contents are captured separately, by range).

Entries are plain lists of msgpack-able values, `[kind, *fields]`:

    ["context",  handle, device, flags, primary]
    ["alloc",    address, size, context]
    ["module",   handle, context, image, [variable addresses, in load order]]
    ["function", handle, module, name]
    ["stream",   handle, context, flags, priority]
    ["event",    handle, context, flags]
    ["reserve",  address, size]                             (cuMemAddressReserve)
    ["memory",   handle, size, properties, references]      (cuMemCreate; 0 references:
                                                             released, still mapped)
    ["mapping",  address, size, offset, memory handle, access flags]   (cuMemMap)
    ["graph",    handle, context, [[[op, args], ...] per segment], device launch]
                                      (an executable graph's calls, and whether kernels may
                                       launch it: server/graphs.py; older images have no
                                       last field)

A journal is restored by `vgpu.server.session.Session.restore`, which knows how to make each
kind; the format's version is the checkpoint image's (`vgpu.replay.image`).
"""

from __future__ import annotations

__all__ = ["Journal", "ENTRY_KINDS"]

ENTRY_KINDS = ("context", "alloc", "module", "function", "stream", "event", "reserve",
               "memory", "mapping", "graph")


class Journal:
    """The live objects of one session, keyed by (kind, handle or address)."""

    def __init__(self) -> None:
        self._live: dict[tuple[str, int], list] = {}

    def created(self, kind: str, key: int, *fields) -> None:
        """Object `key` of `kind` now exists; `fields` make it again (see the module doc)."""
        self._live[(kind, key)] = [kind, key, *fields]

    def destroyed(self, kind: str, key: int) -> None:
        self._live.pop((kind, key), None)

    def entries(self) -> list[list]:
        """The live objects, oldest first: what a restore replays."""
        return list(self._live.values())

    def __len__(self) -> int:
        return len(self._live)
