"""Running a trace again, without the program that was recorded (`vgpu replay`).

Each session of the trace gets a session of its own on the server, opened at the addresses
its recording had ("arena" at hello), and is sent its calls one at a time, each waiting
for its reply: so every call's outcome (code, result, data copied back, device output) is
seen on its own, to be compared with what the recording kept. Sessions are replayed one
after the other, in the order they started.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from vgpu.protocol import (
    BYE,
    CALLS,
    DEFAULT_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    HELLO,
    HOSTFN,
    PROTOCOL_VERSION,
    pack,
    unpack,
)

from .trace import SessionTrace, Trace, digest, is_blob, outcome_of

__all__ = ["ReplayError", "Difference", "Tolerance", "replay", "describe_call"]

# Calls whose result is not reproducible by nature: only their code is compared.
UNREPRODUCIBLE = frozenset({"cuEventElapsedTime"})


class ReplayError(RuntimeError):
    """The replay could not go on: the server refused the session or went away."""


@dataclass
class Difference:
    """The first call whose outcome differs from the recording's."""

    session: SessionTrace
    index: int
    what: list[str]  # one line per thing that differed

    def __str__(self) -> str:
        op, args, _ = self.session.calls[self.index]
        info = self.session.session
        lines = [f"session {info['id']} ({' '.join(info['argv'])[:60]}), call {self.index}: "
                 f"{describe_call(op, args)}"]
        return "\n".join(lines + [f"  {line}" for line in self.what])


@dataclass(frozen=True)
class Tolerance:
    """Data copied back compared as little-endian floats (`floats`: "f32" or "f64"), each
    replayed value within `atol` + `rtol` * |recorded| of the recorded one (NaN equal to
    NaN); bytes after the last whole float compared exactly."""

    rtol: float
    atol: float
    floats: str = "f32"


def replay(trace: Trace, address: str, check: bool,
           seen: Callable[[dict], None] | None = None,
           tolerance: Tolerance | None = None) -> Difference | None:
    """Run every session of `trace` against the server at `address`; with `check`, stop at
    the first call whose outcome differs from the recording's and return it. `seen` is
    given every call's outcome, as a trace keeps it (without the results of UNREPRODUCIBLE
    calls). A `tolerance` needs a full trace: only it keeps the data to compare."""
    if tolerance is not None and not all(s.full for s in trace.sessions):
        raise ValueError("a tolerance compares the data copied back, and this trace keeps "
                         "only their digests (recorded without --full): it can only be "
                         "checked for exact equality")
    for recorded in trace.sessions:
        with _Connection(address, recorded.session) as connection:
            for index, (op, args, expected) in enumerate(recorded.calls):
                code, result, data, output, diagnostics = connection.call(
                    *_as_sent(trace, op, args))
                outcome = outcome_of(code, result, data, output, diagnostics, False)
                if op in UNREPRODUCIBLE:
                    outcome.pop("result", None)
                if seen is not None:
                    seen(outcome)
                if check:
                    what, span = _differences(trace, op, expected, outcome,
                                              (result, data, output, diagnostics), tolerance)
                    if what:
                        if op == "cuMemcpyDtoH" and span is not None:
                            first, last = span
                            what.append(_last_writer(trace, address, recorded, index, args[0],
                                                     first, last, bytes(data[0][first:last])))
                        return Difference(recorded, index, what)
    return None


def _last_writer(trace: Trace, address: str, recorded: SessionTrace, index: int,
                 copied: int, first: int, last: int, replayed: bytes) -> str:
    """Which launch last wrote the bytes copied back from [copied+first, copied+last) by
    call `index`, as the replay ran it. The recording says what memory held only where the
    program copied it back, so the replay is its own reference: the session is replayed
    afresh up to a point and the range's digest compared with the one the copy back got.
    The first point from which it holds those bytes is found by halving over the launches
    (a range written, then put back as it was, may mislead the halving; kernels rarely do
    that)."""
    calls = recorded.calls
    launches = [i for i in range(index)
                if calls[i][0] in ("cuLaunchKernel", "cuLaunchCooperativeKernel")]
    start, size = copied + first, last - first
    where = f"{copied:#x}+{first}" + (f" (to +{last})" if size > 1 else "")
    if not launches:
        return f"no kernel launch came before it: the bytes at {where} were copied in"
    # Points to replay up to (exclusive): before the first launch, after each one, and the
    # copy back itself, whose digest is known.
    cuts = [launches[0], *(i + 1 for i in launches)]
    wanted = digest(replayed)

    def holds(cut: int) -> bool:
        with _Connection(address, recorded.session) as connection:
            for op, args, _ in calls[:cut]:
                connection.call(*_as_sent(trace, op, args))
            code, result, *_ = connection.call(["vgpuDigest", [start, size]], [])
        return code == 0 and bytes(result) == wanted

    if holds(cuts[0]):
        return (f"no kernel launch wrote the bytes at {where}: they held them before the "
                f"first launch (call {launches[0]})")
    low, high = 0, len(cuts)  # cuts[low] does not hold them; the copy back (high) does
    while high - low > 1:
        middle = (low + high) // 2
        if holds(cuts[middle]):
            high = middle
        else:
            low = middle
    if high == len(cuts):
        return (f"the bytes at {where} were last written after the last launch (call "
                f"{launches[-1]}), by a call that is not a launch")
    at = launches[high - 1]
    function, gx, gy, gz, bx, by, bz = calls[at][1][:7]
    names = {args[0]: args[2] for op, args, _ in calls[:at]
             if op == "cuModuleGetFunction" and isinstance(args, list) and len(args) == 3}
    return (f"the bytes at {where} were last written by launch #{high} (kernel "
            f"{names.get(function, f'{function:#x}')}, grid ({gx}, {gy}, {gz}), block "
            f"({bx}, {by}, {bz})) at call {at}")


def _as_sent(trace: Trace, op, args) -> tuple[list, list]:
    """The call as a message carries it, and its payload frames: recorded data goes as
    frames."""
    if op is None:  # a malformed call, as it came
        return args, []
    if not isinstance(args, list):
        return [op, args], []
    frames: list = []
    sent = []
    for value in args:
        if is_blob(value):
            frames.append(trace.load(value))
            value = ["frame", len(frames) - 1]
        sent.append(value)
    return [op, sent], frames


def _differences(trace: Trace, op, expected: dict, got: dict, values: tuple,
                 tolerance: Tolerance | None) -> tuple[list[str], tuple[int, int] | None]:
    """What differs, a line each, and for one piece of data copied back that differs, the
    bytes [first, last) of it that do."""
    result, data, output, diagnostics = values
    kept = expected.get("kept")
    what, span = [], None
    if expected["code"] != got["code"]:
        what.append(f"code: recorded {expected['code']}, replayed {got['code']}"
                    + (f" ({result})" if got["code"] and result else ""))
    if op not in UNREPRODUCIBLE and expected.get("result") != got.get("result"):
        recorded = f"{kept['result']!r:.200}" if kept else "(not kept: record with --full)"
        what.append(f"result: recorded {recorded}, replayed {result!r:.200}")
    if expected.get("data", []) != got.get("data", []):
        line, span = _data_difference(trace, expected.get("data", []), got.get("data", []),
                                      kept["data"] if kept else None, data, tolerance)
        if line:
            what.append(line)
    for name, text in (("output", output), ("diagnostics", diagnostics)):
        if expected.get(name) != got.get(name):
            recorded = f"{kept[name]!r:.200}" if kept else "(not kept: record with --full)"
            what.append(f"{name}: recorded {recorded}, replayed {text!r:.200}")
    return what, span


def _data_difference(trace: Trace, expected: list, got: list, kept: list | None,
                     data: list, tolerance: Tolerance | None
                     ) -> tuple[str | None, tuple[int, int] | None]:
    """How data copied back differ (None: within the tolerance), and for a single piece,
    which of its bytes do."""
    if len(expected) != len(got):
        return f"data copied back: recorded {len(expected)} pieces, replayed {len(got)}", None
    single = len(expected) == 1
    if kept is None:
        piece = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
        return (f"data copied back differ (sha256 {expected[piece].hex()[:16]}… recorded, "
                f"{got[piece].hex()[:16]}… replayed; record with --full to see where)",
                (0, len(data[0])) if single else None)
    for blob, replayed in zip(kept, data, strict=True):
        recorded, replayed = trace.load(blob), bytes(replayed)
        if len(recorded) != len(replayed):
            return (f"data copied back: recorded {len(recorded)} bytes, replayed "
                    f"{len(replayed)}", None)
        span = _differing_bytes(recorded, replayed, tolerance)
        if span is not None:
            break
    else:
        return None, None  # within the tolerance
    offset = span[0]
    start = offset - offset % 16
    line = (f"data copied back differ first at byte {offset} (of {len(recorded)}):\n"
            f"    recorded +{start}: {recorded[start:start + 16].hex(' ')}\n"
            f"    replayed +{start}: {replayed[start:start + 16].hex(' ')}")
    if tolerance is not None:
        size = _float_type(tolerance).itemsize
        element = offset // size
        if (element + 1) * size <= len(recorded):
            # Shown by str: the fewest digits that read back as the same float of its type.
            values = [np.frombuffer(b, _float_type(tolerance), 1, element * size)[0]
                      for b in (recorded, replayed)]
            line = (f"data copied back differ beyond rtol {tolerance.rtol:g}, atol "
                    f"{tolerance.atol:g} first at {tolerance.floats} element {element} "
                    f"(byte {offset} of {len(recorded)}): recorded {str(values[0])}, replayed "
                    f"{str(values[1])}\n" + line.split("\n", 1)[1])
    return line, span if single else None


def _float_type(tolerance: Tolerance) -> np.dtype:
    return np.dtype({"f32": "<f4", "f64": "<f8"}[tolerance.floats])


def _differing_bytes(recorded: bytes, replayed: bytes, tolerance: Tolerance | None
                     ) -> tuple[int, int] | None:
    """[first, last) of the bytes that differ (of whole floats out of the tolerance), or
    None."""
    a, b = np.frombuffer(recorded, np.uint8), np.frombuffer(replayed, np.uint8)
    if tolerance is None:
        differs = a != b
    else:
        kind = _float_type(tolerance)
        whole = len(recorded) // kind.itemsize
        x = np.frombuffer(recorded, kind, whole)
        y = np.frombuffer(replayed, kind, whole)
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.isclose(y, x, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
        cut = whole * kind.itemsize
        differs = np.concatenate([np.repeat(~close, kind.itemsize), a[cut:] != b[cut:]])
    where = np.flatnonzero(differs)
    return None if where.size == 0 else (int(where[0]), int(where[-1]) + 1)


def describe_call(op, args) -> str:
    """op(arg, ...) as a person reads it: addresses in hex, data by its size."""
    if op is None:
        return f"malformed call {args!r:.80}"

    def show(value) -> str:
        if is_blob(value):
            return f"<{value[1]} bytes>"
        if isinstance(value, bytes):
            return f"<{len(value)} bytes: {value[:16].hex()}{'…' if len(value) > 16 else ''}>"
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 32:
            return hex(value)
        if isinstance(value, list):
            return "[" + ", ".join(show(v) for v in value) + "]"
        return repr(value)

    shown = ", ".join(show(a) for a in args) if isinstance(args, list) else show(args)
    return f"{op}({shown})"


class _Connection:
    """A session on the server, spoken to with the raw protocol."""

    def __init__(self, address: str, recorded: dict):
        self.address = address
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.seq = 0
        code, info, *_ = self._request(HELLO, {
            "version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
            "argv": ["vgpu-replay", *recorded["argv"]], "memcheck": recorded["memcheck"],
            "token": None, "resume": None, "arena": recorded["arena"]}, [],
            HANDSHAKE_TIMEOUT_S)
        if code:
            self.close()
            raise ReplayError(f"the server at {address} refused the session: {info}")

    def call(self, call: list, frames: list) -> tuple[int, object, list, str, str]:
        code, result, _, output, diagnostics, data = self._request(CALLS, [call], frames)
        return code, result, data, output, diagnostics

    def _request(self, kind: str, body, frames: list, timeout: float = DEFAULT_TIMEOUT_S
                 ) -> list:
        self.seq += 1
        self.socket.send_multipart([pack([kind, self.seq, body]), *frames])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.socket.poll(100):
                continue
            reply_frames = self.socket.recv_multipart()
            reply = unpack(reply_frames[0])
            if reply[0] == self.seq:
                return [*reply[1:], reply_frames[1:]]
            if reply[1]:  # a notice that the server is going away
                raise ReplayError(f"the server at {self.address} stopped: {reply[2]}")
            if isinstance(reply[2], dict):
                # The recorded program's host functions are not here to run: each stream
                # they held goes on at once.
                for gate in reply[2].get("host_functions", ()):
                    self.socket.send(pack([HOSTFN, 0, gate]))
            deadline = time.monotonic() + timeout  # a keepalive: still working
        self.close()
        raise ReplayError(f"the server at {self.address} did not answer for {timeout:g} s")

    def close(self, linger_ms: int = 0) -> None:
        self.socket.close(linger_ms)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.socket.send_multipart([pack([BYE, 0, None])])
        self.close(1000)  # the goodbye must leave: it releases the session at once
