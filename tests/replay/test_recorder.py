"""The recorder, around a session whose calls are stand-ins: every call is kept in order
with what went back for it, and the times it gets are where and as long as it ran."""

from __future__ import annotations

import time
from itertools import pairwise
from types import SimpleNamespace

from vgpu.protocol import CALLS, pack
from vgpu.replay.trace import read_trace
from vgpu.server.recorder import PER_CALL_TIMES_FROM_NS, SessionRecorder

SLEEP_S = 0.05  # a "slow" call: far above PER_CALL_TIMES_FROM_NS, far above a fast one


class StandInSession:
    """What the recorder uses of a Session; ops: "ok" (nothing back), "fail" (code 1),
    "answer" (a result), "print" (device output), "slow" (sleeps, nothing back)."""

    def __init__(self):
        self.id, self.token, self.argv, self.pid, self.memcheck = 1, "t" * 32, ["app"], 9, "report"
        self.backend, self.arena = SimpleNamespace(name="emu"), SimpleNamespace(base=1 << 44)
        self.reply_frames, self.output, self.diagnostics, self.payloads = [], [], [], []
        self.last_error_message, self.cancelled, self.recorder = "", False, None
        self.header = None
        self.deferred: list[int] = []
        self.run_calls = None

    def _run_one(self, call):
        op = call[0]
        if op == "fail":
            self.last_error_message = "it failed"
            return 1, None
        if op == "answer":
            return 0, 42
        if op == "print":
            self.output.append("hello\n")
        if op == "slow":
            time.sleep(SLEEP_S)
        return 0, None

    def defer(self, code, message=""):
        self.deferred.append(code)

    def batch(self, *ops):
        """Run one message's calls, as the server runs a message (with its encoded header);
        returns (start, end) of the batch in the recorder's ns."""
        start = time.perf_counter_ns() - self.recorder._origin
        calls = [(op, (i,)) for i, op in enumerate(ops)]
        self.header = pack([CALLS, 0, calls])
        self.run_calls(calls)
        return start, time.perf_counter_ns() - self.recorder._origin


def recorded(tmp_path, *batches):
    session = StandInSession()
    SessionRecorder(session, str(tmp_path), full=False)
    spans = [session.batch(*ops) for ops in batches]
    session.recorder.finish()
    (trace,) = read_trace(tmp_path).sessions
    return session, trace.calls, spans


def test_every_call_is_kept_in_order_with_what_went_back(tmp_path):
    session, calls, _ = recorded(tmp_path, ["ok", "ok", "fail", "ok", "print", "ok", "answer"])
    assert [op for op, _, _ in calls] == ["ok", "ok", "fail", "ok", "print", "ok", "answer"]
    assert [args for _, args, _ in calls] == [[i] for i in range(7)]
    codes = [outcome["code"] for _, _, outcome in calls]
    assert codes == [0, 0, 1, 0, 0, 0, 0]
    assert "output" in calls[4][2] and "result" in calls[6][2]
    assert not any(key in calls[i][2] for i in (0, 1, 3, 5) for key in ("output", "result"))
    assert session.deferred == [1]  # the queued failure is still reported


def test_messages_whose_calls_return_nothing_are_kept_whole(tmp_path):
    _, calls, _ = recorded(tmp_path, ["ok"] * 3, ["ok", "print"], ["ok"] * 2)
    assert [(op, args) for op, args, _ in calls] == [
        ("ok", [0]), ("ok", [1]), ("ok", [2]), ("ok", [0]), ("print", [1]), ("ok", [0]),
        ("ok", [1])]
    assert ["output" in outcome for _, _, outcome in calls] == [False] * 4 + [True, False, False]


def test_calls_run_back_to_back_share_their_batch_time(tmp_path):
    _, calls, [(start, end)] = recorded(tmp_path, ["ok"] * 50 + ["answer"] + ["ok"] * 50)
    times = [outcome["time"] for _, _, outcome in calls]
    assert all(start <= t0 and t0 + took <= end for t0, took in times)
    # One after the other, never overlapping.
    assert all(t0 + took <= t1 for (t0, took), (t1, _) in pairwise(times))


def test_calls_that_take_long_are_timed_one_by_one(tmp_path):
    assert SLEEP_S * 1e9 > 10 * PER_CALL_TIMES_FROM_NS
    _, calls, _ = recorded(tmp_path, ["slow", "ok"], ["ok", "slow", "ok", "ok"])
    second = [outcome["time"][1] for _, _, outcome in calls[2:]]
    assert second[1] >= SLEEP_S * 1e9  # the slow call has all of its time...
    assert max(second[0], second[2], second[3]) < SLEEP_S * 1e9 / 2  # ...the others none of it
