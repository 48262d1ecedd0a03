"""SessionWorker: runs a session's long calls off the server's I/O thread.

Launches and module loads can take long on the emulator; done on the I/O thread, they would
stall every other client (and `vgpu ps`) until they finish. Each session therefore has a
worker thread. A batch with a long call goes to the worker, and so does every later batch of
that session until the worker has caught up, so a session's calls still run in order. Short
batches of an idle session run on the I/O thread directly: handing them over would add two
thread wake-ups to every round trip. A batch of more calls than vgpu's client sends at once
(INLINE_CALLS) is long whatever its calls: only a worker can be cancelled between them.

The worker hands finished batches back through a deque and rings the I/O thread's bell
(server/bell.py); only the I/O thread touches the client-facing socket.

Control tasks (a checkpoint's capture, a migration's final stop, a restore) run on the worker
too, in line with the batches: one sees the session exactly as the batches before it left
it, and none runs concurrently with the session's calls. A task may `hold` the session: the
worker then keeps the batches that arrive, unrun and in order, until a later task lets go.

A session that ends (its client said goodbye, died or was cut off, or the server is
stopping) is cancelled: the running kernel stops at its next step and the running batch
before its next call, the batches not yet run are dropped (nobody is left to answer), and
the worker releases the session and exits.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from .backends.base import Cancelled
from .bell import Bell
from .session import Session

__all__ = ["SessionWorker", "SessionEnded", "Outcome", "run_batch", "LONG_CALLS",
           "INLINE_CALLS"]

log = logging.getLogger("vgpu.server")

# Calls that may run long enough to hold up other clients.
# A host function holds the session's thread until the client ran it, where it is on the
# legacy stream.
LONG_CALLS = frozenset({"cuLaunchKernel", "cuLaunchCooperativeKernel", "cuModuleLoadData",
                        "vgpuGraphLaunch", "vgpuHostFunc"})
# The most calls a batch the I/O thread runs itself may hold: what vgpu's client sends in one
# batch (vgpu.client.MAX_QUEUED_CALLS). A raw client may pack hundreds of thousands of calls
# into one message; run inline, they would hold up every client, and stopping, for minutes.
INLINE_CALLS = 512

# What a batch produced: (reply code, result, reply payload frames, deferred error,
# device output for stdout, diagnostics for stderr); see vgpu.protocol.
Outcome = tuple[int, object, list, object, str, str]


def run_batch(session: Session, seq: int, body: list, payloads: list,
              header: bytes | None = None) -> Outcome:
    """Execute a batch (`header`: its message's, when the batch is all of the message) and
    collect everything its reply carries. A batch nobody waits for (seq 0) has no reply:
    its error, and device output, wait for the next reply."""
    code, result, frames = session.execute(body, payloads, header)
    if not seq:
        session.defer(code, session.last_error_message)
        return code, None, [], 0, "", ""
    if code and result is None and session.last_error_message:
        result = session.last_error_message
    return (code, result, frames, *session.take_reports())


class SessionEnded(Exception):
    """A control task's session ended before the task could run."""


@dataclass
class _Control:
    task: Callable[[Session, int], object]
    position: int  # the session's position when the task was queued: what it follows
    future: Future
    hold: bool


class SessionWorker:
    def __init__(self, session: Session, bell: Bell, finished: collections.deque):
        self.session = session
        self.identity: bytes | None = None  # the client's connection, set by the server
        self.pending = 0  # batches handed over, not yet handed back (I/O thread only)
        self.queued_calls = 0  # the calls in them (I/O thread only)
        self.queued_bytes = 0  # and the bytes of their messages (I/O thread only)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._finished = finished
        self._holding = False  # (written by the worker thread only)
        self._held: collections.deque = collections.deque()
        self._bell = bell
        self._thread = threading.Thread(target=self._run,
                                        name=f"vgpu-session-{session.id}", daemon=True)
        self._thread.start()

    def submit(self, identity: bytes, seq: int, body: list, payloads: list,
               size: int = 0, header: bytes | None = None) -> None:
        """Run a batch of `size` bytes of messages (its header and payload frames; `header`:
        see run_batch)."""
        self.pending += 1
        self.queued_calls += len(body)
        self.queued_bytes += size
        self._jobs.put((identity, seq, body, payloads, size, header))

    def control(self, task: Callable[[Session, int], object], hold: bool = False,
                future: Future | None = None) -> Future:
        """Run `task(session, position)` once the batches queued so far have run (I/O thread
        only); `position` counts the messages they came in. With `hold`, the batches after
        it wait until a later task without it; a task that fails holds nothing. Its result,
        or exception, comes in the returned future."""
        future = future or Future()
        self.pending += 1
        self._jobs.put(_Control(task, self.session.position, future, hold))
        return future

    def busy(self) -> bool:
        """Must the session's next batch go to the worker (I/O thread only)? While work is
        handed over, and while a task holds the session (the worker sets `_holding` before
        it hands the task back, so it is settled once nothing is pending)."""
        return bool(self.pending) or self._holding

    def handed_back(self, job: tuple[int, int]) -> None:
        """A batch of (calls, bytes) ran (or a control task, (0, 0), did)."""
        self.pending -= 1
        self.queued_calls -= job[0]
        self.queued_bytes -= job[1]

    def cancel(self) -> None:
        """The session ended: stop its kernel, drop its queued batches, release it."""
        self.session.cancel()
        self._jobs.put(None)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the worker to exit; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run_batch(self, job) -> None:
        identity, seq, body, payloads, size, header = job
        try:
            outcome = run_batch(self.session, seq, body, payloads, header)
        except Cancelled:
            return
        except Exception:  # a server bug must not strand the session's client
            log.error("internal error in session %d:\n%s", self.session.id,
                      traceback.format_exc())
            outcome = (999, "internal server error", [], 0, "", "")
        self._finished.append((self, identity, seq, (len(body), size), outcome))
        self._bell.ring()

    def _run_control(self, job: _Control) -> None:
        try:
            result = job.task(self.session, job.position)
        except BaseException as exc:  # Cancelled included: whoever waits must hear of it
            self._holding = False
            job.future.set_exception(exc)
        else:
            self._holding = job.hold
            job.future.set_result(result)
        self._finished.append((self, None, 0, (0, 0), None))  # no reply; `pending` goes down
        self._bell.ring()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.session.cancelled:  # up to the end marker: nobody waits for batches
                if isinstance(job, _Control):  # but an operation waits for its task
                    job.future.set_exception(SessionEnded("the session ended"))
                continue
            if isinstance(job, _Control):
                self._run_control(job)
                while self._held and not self._holding and not self.session.cancelled:
                    self._run_batch(self._held.popleft())
            elif self._holding:
                self._held.append(job)
            else:
                self._run_batch(job)
        self.session.close()
