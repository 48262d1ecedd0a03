"""Recording sessions into a trace (`vgpu server --record DIR`; the format: replay/trace.py).

A recorded session runs each call through `SessionRecorder.run_call`, which stands in for
the session's `run_call` (Session.execute calls it once per call): a session that is not
recorded pays nothing for recording. Each call is kept with the data the program sent in
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

from .session import Session

__all__ = ["SessionRecorder"]

log = logging.getLogger("vgpu.server")

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
        self._keep_plain = self.writer.add_plain
        self._run = session.run_call
        session.run_call = self.run_call
        session.recorder = self

    def run_call(self, call) -> tuple[int, object]:
        session = self.session
        frames, output, diagnostics = (len(session.reply_frames), len(session.output),
                                       len(session.diagnostics))
        start = time.perf_counter_ns()
        code, result = self._run(call)
        took = time.perf_counter_ns() - start
        if (not code and result is None and frames == len(session.reply_frames)
                and output == len(session.output)
                and diagnostics == len(session.diagnostics)):
            # Most calls (queued launches above all) succeed and send nothing back: kept as
            # they came with their time (the writer adds their common outcome at the end).
            # A call that succeeded had the form (op, args); one that sends no data is kept
            # as it came (see _recorded).
            op, args = call if call[0] not in SOURCE_ARG else self._recorded(call)
            self._keep_plain(op, args, start - self._origin, took)
            return code, result
        shown = result
        if code and result is None and session.last_error_message:
            shown = session.last_error_message  # what a reply says for it (run_batch)
        outcome = outcome_of(
            code, shown, session.reply_frames[frames:],
            "".join(session.output[output:]), "".join(session.diagnostics[diagnostics:]),
            self.full, self.writer.blob)
        # When the call ran and for how long (ns from the session's start), for `vgpu trace
        # stats` and `export`: an addition readers of format 1 ignore, and replay does not
        # compare.
        outcome["time"] = [start - self._origin, took]
        self.writer.add(self._recorded(call), outcome)
        return code, result

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
