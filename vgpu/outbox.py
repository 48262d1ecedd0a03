"""What a client sent and may have to send again: the CALLS messages a server has not yet
made safe, by position.

Every CALLS message a client sends has a position, its 1-based count (the server counts the
same way). A session that moves to another server (a redirect) resumes there at a position
N, and the client resends the messages it holds after N; one whose server died resumes on a
standby at the position of its last checkpoint, and the client replays what it sent since.
So the client holds on to messages:

- normally until the server confirms them: the reply to a message at position p says that
  every message up to p has run (replies come in order). Their data needs no copy: bulk data
  staged in the shared-memory ring stays there until the server has confirmed the copy
  (vgpu.client's ring is not reused before), and a session that moves copies the ranges
  they name into its new ring.
- with a failover list (retain_all), until a checkpoint covers them ({"checkpointed": N}):
  a replay may come long after the ring was reused, so data staged there is copied into the
  retained message when it is sent.

A message resent after its reply was consumed (the application has its answer) goes without
a seq and without the calls that only read (their answers would go nowhere); one still
unanswered goes with its seq, so whoever waits for it is answered by the new server.
"""

from __future__ import annotations

import collections
import ctypes
from dataclasses import dataclass

__all__ = ["Outbox", "Sent", "SOURCE_ARG", "DEST_ARG", "READ_ONLY", "replay_form", "relocate",
           "staged_ranges"]

# Calls whose argument at this index says where their data comes from (a source spec: "shm",
# "seg", "frame", "inline" or "peer"), the size being the argument after it.
SOURCE_ARG = {"cuMemcpyHtoD": 1, "cuModuleLoadData": 2}
# Calls whose argument at this index says where their data goes (the size is argument 1).
DEST_ARG = {"cuMemcpyDtoH": 2}
# Calls that change nothing the server keeps: they only answer.
READ_ONLY = frozenset({"cuMemcpyDtoH", "vgpuDeviceWindow", "cuMemGetInfo", "vgpuQuery",
                       "vgpuSynchronize", "cuEventElapsedTime"})
QUERY = "vgpuQuery"
CUDA_ERROR_NOT_READY = 600


@dataclass(eq=False, slots=True)
class Sent:
    """One CALLS message as it may be sent again."""

    position: int
    seq: int  # 0: nobody waits for its reply
    calls: list
    frames: list
    answered: bool = False
    failed: bool = False  # its reply said the last call failed


class Outbox:
    """The messages sent and not yet safe, oldest first, with contiguous positions."""

    def __init__(self, retain_all: bool = False):
        self.retain_all = retain_all
        self.position = 0  # CALLS messages sent
        self.confirmed = 0  # the last position a reply confirmed
        self.retained_bytes = 0  # payload bytes of the held messages
        self.held: collections.deque[Sent] = collections.deque()
        self._waiting: dict[int, Sent] = {}  # seq -> the message that reply answers

    def sent(self, seq: int, calls: list, frames: list, ring_map=None) -> None:
        """A CALLS message went out. In retain_all mode its ring-staged data is copied out of
        `ring_map` (the staging ring) now: the ring is reused once the server confirms."""
        self.position += 1
        if self.retain_all and ring_map is not None:
            calls, frames = relocate(calls, frames, ring_map, has_ring=False, has_peer=True)
        entry = Sent(self.position, seq, calls, frames)
        self.held.append(entry)
        if frames:
            self.retained_bytes += sum(map(len, frames))
        if seq:
            self._waiting[seq] = entry

    def answered(self, seq: int, code: int) -> None:
        """The reply to `seq` arrived. It confirms everything up to its message, except a
        query's "not ready", which the server answers ahead of the work it is about."""
        entry = self._waiting.pop(seq, None)
        if entry is None:
            return
        entry.answered = True
        entry.failed = code != 0
        if code == CUDA_ERROR_NOT_READY and entry.calls and entry.calls[-1][0] == QUERY:
            return  # early: confirms nothing
        if entry.position > self.confirmed:
            self.confirmed = entry.position
        if not self.retain_all:
            self._drop_through(entry.position)

    def sent_answered(self, seq: int, calls: list, code: int) -> None:
        """sent() and answered() at once: a message without payloads went out and its reply
        (`code`) was the next message to arrive. Unless it must be held all the same (to
        wait for a checkpoint, or as a query's "not ready", which confirms nothing), it
        confirms everything up to it and is never held: a round trip's bookkeeping in few
        steps (see vgpu.client's _round_trip)."""
        if self.retain_all or (code == CUDA_ERROR_NOT_READY and calls and calls[-1][0] == QUERY):
            self.sent(seq, calls, [])
            self.answered(seq, code)
            return
        self.position = self.confirmed = self.position + 1
        if self.held:
            self._drop_through(self.position)

    def checkpointed(self, position: int) -> None:
        """A checkpoint a standby can restore covers the messages up to `position`."""
        if self.retain_all:
            self._drop_through(position)

    def stop_retaining(self) -> None:
        """Keep messages only until confirmed from now on (no failover any more)."""
        self.retain_all = False
        self._drop_through(self.confirmed)

    def _drop_through(self, position: int) -> None:
        held = self.held
        while held and held[0].position <= position:
            frames = held.popleft().frames
            if frames:
                self.retained_bytes -= sum(map(len, frames))

    @property
    def oldest(self) -> int:
        """The position of the oldest message held (the next to be sent when none is)."""
        return self.held[0].position if self.held else self.position + 1

    def after(self, position: int) -> list[Sent]:
        """The messages held after `position`, oldest first."""
        first = position + 1 - self.oldest
        return list(self.held)[max(first, 0):]

    def staged(self) -> list[tuple[int, int]]:
        """(offset, size) of the ring-staged data the held messages copy to the device."""
        return [r for entry in self.held for r in staged_ranges(entry.calls)]

    def waiting(self) -> list[int]:
        """The seqs whose replies are awaited."""
        return sorted(self._waiting)

    def forget_waits(self) -> None:
        """Replies still awaited will never come (the old server is gone); the resent
        messages are awaited again under their seqs."""
        self._waiting = {e.seq: e for e in self.held if e.seq and not e.answered}


def staged_ranges(calls: list) -> list[tuple[int, int]]:
    """(offset, size) of the ring-staged data `calls` copy to the device."""
    ranges = []
    for op, args in calls:
        index = SOURCE_ARG.get(op)
        if index is not None and args[index][0] == "shm":
            ranges.append((int(args[index][1]), int(args[index + 1])))
    return ranges


def replay_form(entry: Sent, ring_map, has_ring: bool, has_peer: bool) -> tuple[int, list, list]:
    """(seq, calls, frames) to send `entry` again, to a new server.

    A message whose reply was consumed goes without a seq, without the calls that only read,
    and without its last call if that failed (it changed nothing, and its error was
    reported). See relocate for the data."""
    calls, seq = entry.calls, entry.seq
    if entry.answered:
        seq = 0
        if entry.failed:
            calls = calls[:-1]
        calls = [c for c in calls if c[0] not in READ_ONLY]
    calls, frames = relocate(calls, entry.frames, ring_map, has_ring, has_peer)
    return seq, calls, frames


def relocate(calls: list, frames: list, ring_map, has_ring: bool,
             has_peer: bool) -> tuple[list, list]:
    """`calls` (and their `frames`) for a new server: `ring_map` is the old staging ring (or
    None); `has_ring`/`has_peer` say whether the new server shares a staging ring (holding a
    copy of the old one) and reads this process's memory. A copy it cannot do that way gets
    its data in a frame, or sends it back in one (the waiting code then takes the data from
    the reply's frames)."""
    out, frames = [], list(frames)
    for call in calls:
        op, args = call
        index = SOURCE_ARG.get(op)
        if index is not None:
            spec, size = args[index], args[index + 1]
            data = None
            if spec[0] == "shm" and not has_ring:
                data = ring_map[int(spec[1]):int(spec[1]) + size]
            elif spec[0] == "peer" and not has_peer:
                # Only a call still unanswered holds a peer spec: the application waits in it,
                # so its buffer is still there.
                data = ctypes.string_at(int(spec[1]), size)
            if data is not None:
                frames.append(data)
                call = [op, (*args[:index], ["frame", len(frames) - 1], *args[index + 1:])]
        index = DEST_ARG.get(op)
        if index is not None:
            kind = args[index][0]
            if (kind == "shm" and not has_ring) or (kind == "peer" and not has_peer):
                call = [op, (*args[:index], ["frame"], *args[index + 1:])]
        out.append(call)
    return out, frames
