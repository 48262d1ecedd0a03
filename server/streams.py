"""StreamLanes: a session's streams run beside each other, each in its own order.

On a backend whose launches run to completion inside the launcher (the emulator), a kernel
launched on a stream would otherwise hold up every later call of the session, and a kernel
that waits for one launched after it on another stream would never finish. So each stream
a program creates (and the per-thread default stream) is a lane: a queue of the stream's
work and a thread that runs it in order, waiting where the work must (an event recorded on
another lane, a host function the client has not finished). Lanes run concurrently with each
other and with the session's own thread, which runs everything else in arrival order.

The legacy default stream (0, CU_STREAM_LEGACY) is not a lane: its work runs on the
session's thread once the blocking lanes have finished what was queued on them before
(`blocking_points`), as CUDA's legacy stream waits for every blocking stream; what is queued
on a lane later starts after it, since it is queued after the session's thread ran it.

A point is (lane, ticket): reached once the lane has finished its first `ticket` items.
Events are points, and so are the waits a synchronization makes.

A backend that runs launches asynchronously itself (a GPU's streams) gets no lanes: work
runs as it arrives, on the session's thread (`concurrent` False).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["StreamLanes", "Point", "LEGACY_STREAMS"]

Point = tuple[int, int]
# The legacy default stream (the NULL stream and CU_STREAM_LEGACY): the session's thread.
LEGACY_STREAMS = frozenset({0, 1})
# How long an idle lane's thread waits for more work before it exits (a loop of launches
# and synchronizations keeps its thread).
IDLE_THREAD_S = 0.5


@dataclass
class _Item:
    work: Callable[[], None] | None  # None: the item only waits
    after: tuple[Point, ...]         # points reached before it starts
    gate: int | None = None          # a host function's gate, opened by the client


@dataclass
class _Lane:
    nonblocking: bool = False
    destroyed: bool = False  # its stream is gone: the lane goes once its work is done
    items: collections.deque = field(default_factory=collections.deque)
    queued: int = 0  # items ever queued: the ticket of the last
    done: int = 0    # items finished
    thread: threading.Thread | None = None


class StreamLanes:
    def __init__(self, concurrent: bool, run: Callable[[Callable[[], None]], None],
                 reached_gate: Callable[[int], None]):
        """`run(work)` runs a lane's work on the lane's thread (setting up the backend
        there and handling its errors); `reached_gate(gate)` tells the client that a host
        function's turn came."""
        self.concurrent = concurrent
        self._run = run
        self._reached_gate = reached_gate
        self._cond = threading.Condition()
        self._lanes: dict[int, _Lane] = {}
        self._gates: set[int] = set()  # host functions queued and not yet run
        self._open_gates: set[int] = set()  # of those, the ones the client has run
        self._cancelled = False

    # ----------------------------------------------------------------- lanes

    def is_lane(self, stream: int) -> bool:
        """Does work on `stream` go to a lane (not the session's thread)?"""
        return self.concurrent and stream not in LEGACY_STREAMS

    def created(self, stream: int, nonblocking: bool) -> None:
        with self._cond:
            self._lane(stream).nonblocking = nonblocking

    def destroyed(self, stream: int) -> None:
        """A destroyed stream's queued work still runs (CUDA's rule); its lane goes when
        empty."""
        with self._cond:
            lane = self._lanes.get(stream)
            if lane is not None:
                lane.destroyed = True
                if lane.thread is None:
                    del self._lanes[stream]

    def _lane(self, stream: int) -> _Lane:
        lane = self._lanes.get(stream)
        if lane is None:
            lane = self._lanes[stream] = _Lane()
        return lane

    def submit(self, stream: int, work: Callable[[], None] | None,
               after: tuple[Point, ...] = (), gate: int | None = None) -> Point:
        """Queue `work` on `stream`'s lane, to start once `after` are reached; returns
        the point its end is."""
        with self._cond:
            lane = self._lane(stream)
            lane.items.append(_Item(work, tuple(p for p in after if p[0] != stream), gate))
            lane.queued += 1
            if lane.thread is None:
                lane.thread = threading.Thread(target=self._serve, args=(stream, lane),
                                               name=f"vgpu-stream-{stream}", daemon=True)
                lane.thread.start()
            else:
                self._cond.notify_all()
            return stream, lane.queued

    def _serve(self, stream: int, lane: _Lane) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: lane.items or self._cancelled, IDLE_THREAD_S)
                if self._cancelled or not lane.items:
                    lane.thread = None
                    if lane.destroyed and self._lanes.get(stream) is lane:
                        del self._lanes[stream]
                    return
                item = lane.items[0]
                self._cond.wait_for(lambda after=item.after: self._cancelled or
                                    all(map(self._reached, after)))
            if not self._cancelled:
                if item.work is not None:
                    self._run(item.work)
                if item.gate is not None:
                    self._pass_gate(item.gate)
            with self._cond:
                lane.items.popleft()
                lane.done += 1
                self._cond.notify_all()

    # ----------------------------------------------------------------- host functions

    def _pass_gate(self, gate: int) -> None:
        """Tell the client a host function may run, then hold the lane until it did."""
        self._reached_gate(gate)
        with self._cond:
            self._cond.wait_for(lambda: self._cancelled or gate in self._open_gates)
            self._open_gates.discard(gate)
            self._gates.discard(gate)

    def host_function(self, stream: int, gate: int) -> None:
        """A host function on `stream` (cuLaunchHostFunc): on a lane, its turn comes once
        the lane's earlier work is done; on the session's thread (the legacy stream, or no
        lanes), once every blocking lane's is. Later work on the stream waits for it."""
        with self._cond:
            if gate in self._gates:
                raise ValueError(f"host function gate {gate} is in use")
            self._gates.add(gate)
        if self.is_lane(stream):
            self.submit(stream, None, gate=gate)
            return
        self.wait(self.blocking_points() if self.concurrent else ())
        if not self._cancelled:
            self._pass_gate(gate)

    def open_gate(self, gate) -> None:
        """The client finished host function `gate` (any thread; one not queued is
        ignored)."""
        with self._cond:
            if gate in self._gates:
                self._open_gates.add(gate)
                self._cond.notify_all()

    # ----------------------------------------------------------------- points

    def _reached(self, point: Point) -> bool:
        lane = self._lanes.get(point[0])
        return lane is None or lane.done >= point[1]

    def reached(self, points) -> bool:
        with self._cond:
            return all(map(self._reached, points))

    def tail(self, stream: int) -> Point:
        """The end of what `stream` has queued so far."""
        with self._cond:
            lane = self._lanes.get(stream)
            return stream, lane.queued if lane is not None else 0

    def blocking_points(self) -> tuple[Point, ...]:
        """What the legacy stream waits for: every blocking lane's queued work."""
        if not self._lanes:  # (most sessions: nothing to wait for, no lock to take)
            return ()
        with self._cond:
            return tuple((s, lane.queued) for s, lane in self._lanes.items()
                         if not lane.nonblocking and lane.done < lane.queued)

    def all_points(self) -> tuple[Point, ...]:
        if not self._lanes:  # (see blocking_points)
            return ()
        with self._cond:
            return tuple((s, lane.queued) for s, lane in self._lanes.items()
                         if lane.done < lane.queued)

    def wait(self, points, timeout: float | None = None) -> bool:
        """Wait until `points` are reached (False: `timeout` passed first, or the session
        ended)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._cancelled or all(map(self._reached, points)),
                timeout) and not self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def busy(self) -> bool:
        """Is any lane's work unfinished?"""
        if not self._lanes:  # (asked of every message: most sessions have no lane)
            return False
        with self._cond:
            return any(lane.done < lane.queued for lane in self._lanes.values())

    def cancel(self) -> None:
        """The session ended: lanes drop what they have not started."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds each) for the lanes' threads to exit."""
        with self._cond:
            threads = [lane.thread for lane in self._lanes.values() if lane.thread]
        for thread in threads:
            thread.join(timeout)
