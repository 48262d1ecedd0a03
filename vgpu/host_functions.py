"""HostFunctions: a process's host functions (cuLaunchHostFunc, cuStreamAddCallback) run on
a thread of vgpu's, in stream order, as CUDA runs them on a thread of its own.

Queuing one sends `vgpuHostFunc(stream, gate)`; the server holds the stream at that gate
and, once the stream's earlier work is done, says so in a notice ({"host_functions":
[gate]}). This thread then runs the function and answers HOSTFN, which lets the stream go
on. So a function may wait for something its program does after queuing it, and later work
on its stream starts only after it returned.

Notices arrive on the connection's socket, which one thread at a time may use (the
connection's lock): a thread waiting for a reply takes them as they come (`arrived`) and
sends the answers that are ready (`send_answers`); when no thread holds the connection, this
thread reads the socket itself (`Connection.take_notices`) and sends its answers.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

__all__ = ["HostFunctions"]

# How often this thread looks at the socket while a host function's turn is awaited and no
# other thread reads it, and how long it waits for the connection's lock to answer.
POLL_S = 0.002


class HostFunctions:
    def __init__(self, connection):
        self._connection = connection
        self._cond = threading.Condition()
        self._waiting: dict[int, Callable[[], None]] = {}  # gate -> function, not yet run
        self._ready: collections.deque[int] = collections.deque()  # their turn came
        self._answers: collections.deque[int] = collections.deque()  # run, not yet said
        self._running = False  # one of them runs now (its answer is not in _answers yet)
        self._next_gate = 1
        self._thread: threading.Thread | None = None

    def queue(self, stream: int, function: Callable[[], None]) -> None:
        """Run `function` once the work queued on `stream` before it is done."""
        with self._cond:
            gate, self._next_gate = self._next_gate, self._next_gate + 1
            self._waiting[gate] = function
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="vgpu-host-functions")
                self._thread.start()
            self._cond.notify_all()
        self._connection.post("vgpuHostFunc", stream, gate)

    @property
    def outstanding(self) -> bool:
        """Are host functions queued and not yet answered for?"""
        return bool(self._waiting or self._ready or self._running or self._answers)

    def arrived(self, gates) -> None:
        """A notice said these gates' turn came (the connection's lock is held)."""
        with self._cond:
            self._ready.extend(g for g in gates if g in self._waiting)
            self._cond.notify_all()

    def send_answers(self) -> None:
        """Say which host functions ran (the connection's lock is held)."""
        while self._answers:
            self._connection.answer_host_function(self._answers.popleft())

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ready or self._waiting or self._answers)
                # `outstanding` reads without the lock: it must never see the function in
                # neither place, so it is running before it leaves the queue.
                self._running = bool(self._ready)
                gate = self._ready.popleft() if self._ready else None
                function = self._waiting.pop(gate) if gate is not None else None
            if function is not None:
                function()
                with self._cond:
                    self._answers.append(gate)
                    self._running = False
            # Answer, or look for notices, unless a thread holding the connection does
            # (a thread waiting for a reply answers and takes notices as it waits).
            if self._connection.lock.acquire(timeout=POLL_S):
                try:
                    self.send_answers()
                    if self._waiting and not self._ready:
                        self._connection.take_notices()
                finally:
                    self._connection.lock.release()
            with self._cond:
                if (self._waiting and not self._ready) or self._answers:
                    self._cond.wait(POLL_S)
