"""Recording sessions into a trace (`vgpu server --record DIR`; the format: replay/trace.py).

A recorded session runs its calls through `SessionRecorder.run_calls`, which stands in for
the session's own loop (`Session.run_calls`): a session that is not recorded pays nothing
for recording. Each call is kept with the data the program sent in
it, and with digests of what went back to the program (or, `full`, that too).

Every byte a recorded session's calls use must arrive in the messages the server sees: the
server gives such a session no staging segment, no access to the client's memory and no
device windows (see ProxyServer._hello), so the client sends everything as payload frames.
"""

from __future__ import annotations

import logging
import time

from vgpu.outbox import SOURCE_ARG
from vgpu.replay.trace import TraceWriter, outcome_of

from .backends.base import Cancelled
from .session import CUDA_SUCCESS, Session

__all__ = ["SessionRecorder"]

log = logging.getLogger("vgpu.server")

# Calls of a batch that took this long on average (ns) make the next batch's calls timed
# one by one: a read of the clock then costs them less than 1% (0.3 us on the 2-core machine
# measured).
PER_CALL_TIMES_FROM_NS = 30_000
# Arguments that name the data a call sends: ("frame", index) or ("inline", bytes).
_SENT = {"frame", "inline"}


class SessionRecorder:
    def __init__(self, session: Session, folder: str, full: bool):
        self.writer = TraceWriter(folder, {
            "id": session.id, "token": session.token, "argv": session.argv,
            "pid": session.pid, "memcheck": session.memcheck,
            "backend": session.backend.name, "arena": session.arena.base,
            "started": time.time()}, full)
        self.full = full
        self._origin = time.perf_counter_ns()  # calls' times count from the session's start
        self.session = session
        self._each_timed = False  # whether calls are timed one by one (see run_calls)
        session.run_calls = self.run_calls
        session.recorder = self

    def run_calls(self, calls: list) -> tuple[int, object]:
        """Session._run_calls, keeping each call as it runs.

        Most calls (queued launches above all) succeed and send nothing back: such a call
        costs only an append of it as it came. A run of them is packed into bytes when
        something ends it, and given its common outcome when the manifest is written. What
        ends a run is a call that failed, sent data or got something back, which is kept
        with its outcome at once. The clock is read once a run: the run's calls and the
        call that ends it share its time evenly. Anything more per call showed in the
        launch rate: one more read of the clock cost more than all the rest, and calls kept
        as objects cost the garbage collector more still. Where calls take long enough for
        a read of the clock not to matter (the batch before took PER_CALL_TIMES_FROM_NS a
        call on average: kernels that do real work), each call is timed on its own."""
        session = self.session
        run, clock = session._run_one, time.perf_counter_ns
        frames, output, diagnostics = (session.reply_frames, session.output,
                                       session.diagnostics)
        before = (len(frames), len(output), len(diagnostics))
        produced = sum(before)
        plain: list = []
        each_timed = self._each_timed
        code, result = CUDA_SUCCESS, None
        last = len(calls) - 1
        start = began = clock()
        try:
            for i, call in enumerate(calls):
                if session.cancelled:
                    raise Cancelled
                code, result = run(call)
                if (each_timed or code or result is not None or call[0] in SOURCE_ARG
                        or produced != len(frames) + len(output) + len(diagnostics)):
                    end = clock()
                    share = (end - start) // (len(plain) + 1)
                    if plain:
                        self._keep_plain(plain, start, share)
                        plain = []
                    self._record(call, code, result, end - share - self._origin, share,
                                 before)
                    before = (len(frames), len(output), len(diagnostics))
                    produced = sum(before)
                    if code and i != last:
                        session.defer(code, session.last_error_message)
                    start = end
                else:
                    plain.append(call)
        finally:
            end = clock()
            if len(plain) == len(calls) and session.header is not None:
                # The whole message, kept as it came: nothing to pack again.
                self.writer.add_message(session.header, start - self._origin,
                                        (end - start) // len(plain))
            elif plain:
                self._keep_plain(plain, start, (end - start) // len(plain))
            self._each_timed = end - began >= PER_CALL_TIMES_FROM_NS * len(calls)
        return code, result

    def _keep_plain(self, calls: list, start: int, each: int) -> None:
        self.writer.add_plain(calls, start - self._origin, each)

    def _record(self, call, code: int, result, start: int, took: int,
                before: tuple[int, int, int]) -> None:
        """Keep a call that failed, sent data or got something back, with its outcome;
        `before`: how many reply frames, output and diagnostics texts the session held
        before it ran."""
        session = self.session
        frames, output, diagnostics = (session.reply_frames[before[0]:],
                                       "".join(session.output[before[1]:]),
                                       "".join(session.diagnostics[before[2]:]))
        if not (code or result is not None or frames or output or diagnostics):
            # It succeeded and sent data (a copy to the device, a module): nothing came back.
            self.writer.add_plain([self._recorded(call)], start, took)
            return
        shown = result
        if code and result is None and session.last_error_message:
            shown = session.last_error_message  # what a reply says for it (run_batch)
        outcome = outcome_of(code, shown, frames, output, diagnostics, self.full,
                             self.writer.blob)
        # When the call ran and for how long (ns from the session's start), for `vgpu trace
        # stats` and `export`: an addition readers of format 1 ignore, and replay does not
        # compare.
        outcome["time"] = [start, took]
        self.writer.add(self._recorded(call), outcome)

    def _recorded(self, call) -> list:
        """The call as the trace keeps it: the data it sent stored by content."""
        if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], str)):
            return [None, call]  # malformed: replayed as it came, to be refused again
        name, args = call
        # Only the calls that read a source spec send data (a payload frame, or inline):
        # the others keep their arguments as they came (msgpack writes a tuple as a list),
        # which spares a look at each one, launches above all.
        if name not in SOURCE_ARG or not isinstance(args, tuple):
            return [name, args]
        return [name, [self._argument(a) for a in args]]

    def _argument(self, value):
        if isinstance(value, tuple) and len(value) == 2 and value[0] in _SENT:
            kind, where = value
            try:
                data = self.session.payloads[int(where)] if kind == "frame" else where
                return self.writer.blob(data)
            except (IndexError, TypeError, ValueError):
                pass  # the call was refused for it; kept as sent
        return list(value) if isinstance(value, tuple) else value

    def finish(self) -> None:
        """Write the session's manifest: when it ends."""
        try:
            self.writer.finish()
        except OSError as exc:  # the session must still be released
            log.error("session %d: cannot write its trace in %s: %s", self.session.id,
                      self.writer.folder, exc)
