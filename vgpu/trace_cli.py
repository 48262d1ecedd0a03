"""`vgpu trace show|stats|export`: a recorded trace (replay/trace.py) read by a person.

    vgpu trace show TRACE [--session N] [--api NAME] [--kernel NAME] [--stream S]
    vgpu trace stats TRACE
    vgpu trace export --chrome TRACE -o FILE

A call's stream is the stream it names on the wire: cuLaunchKernel's, cuEventRecord's,
cuStreamWaitEvent's, and the stream cuStreamCreate/cuStreamDestroy make or end. Other calls
(copies, even asynchronous ones, which the client sends in stream order) name none: shown
as "-", and exported on a track of their own. Kernels are named from the trace's
cuModuleGetFunction calls. Times are the server's, per call (`outcome["time"]`: start and
duration in ns from the session's start; short calls run back to back share their time
evenly, see replay/README.md); traces recorded before vgpu kept them have none.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

__all__ = ["add_trace_parser", "trace_command", "calls", "statistics", "chrome_trace",
           "Call"]

# The argument that names a call's stream, by op.
STREAM_ARGUMENT = {"cuLaunchKernel": 8, "cuLaunchCooperativeKernel": 8, "cuEventRecord": 1,
                   "cuStreamWaitEvent": 0, "cuStreamCreate": 0, "cuStreamDestroy": 0,
                   "vgpuGraphLaunch": 2}
NO_STREAM = None
ARGUMENTS_WIDTH = 72


class Call:
    """One recorded call, with what the tools derive from it (a plain class: `vgpu` imports
    this module at every start, and dataclasses costs milliseconds to import)."""

    __slots__ = ("session", "index", "op", "args", "outcome", "stream", "kernel", "sent",
                 "returned", "time", "started")

    def __init__(self, session: int, index: int, op: str | None, args, outcome: dict,
                 stream: int | None, kernel: str | None, sent: int, returned: int,
                 time: list | None, started: float):
        self.session = session    # the session's id
        self.index = index        # the call's index in the session's calls
        self.op = op
        self.args = args
        self.outcome = outcome
        self.stream = stream      # NO_STREAM: the call names none
        self.kernel = kernel      # a launch: the function's name ("?" if the trace says none)
        self.sent = sent          # bytes the call carried to the server (copies, images)
        self.returned = returned  # bytes copied back to the program
        self.time = time          # [start, duration] in ns from the session's start, or None
        self.started = started    # the session's start (unix time)


def add_trace_parser(sub) -> None:
    """`vgpu trace` and its subcommands, on the `vgpu` parser's subparsers."""
    trace = sub.add_parser("trace", help="look into a recorded trace: show, stats, export")
    verbs = trace.add_subparsers(dest="trace_verb", required=True)
    p = verbs.add_parser("show", help="the recorded calls as a table")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--session", type=int, default=None, metavar="N",
                   help="only the session with this id")
    p.add_argument("--api", default=None, metavar="NAME",
                   help="only calls whose op starts with NAME (cuMemcpy, cuLaunchKernel)")
    p.add_argument("--kernel", default=None, metavar="NAME",
                   help="only the launches of the kernel NAME")
    p.add_argument("--stream", type=handle, default=None, metavar="S",
                   help="only calls on stream S (its handle, 0x... or decimal; 0 the default)")
    p = verbs.add_parser("stats", help="calls, bytes and time per API and per kernel")
    p.add_argument("trace", metavar="TRACE")
    p = verbs.add_parser("export", help="write the trace in another format")
    p.add_argument("--chrome", action="store_true", required=True,
                   help="Chrome trace-event JSON (Perfetto, chrome://tracing)")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("-o", "--output", required=True, metavar="FILE")


def handle(text: str) -> int:
    return int(text, 0)


def trace_command(args) -> int:
    from vgpu.replay.trace import TraceError, read_trace

    try:
        trace = read_trace(args.trace)
    except TraceError as exc:
        print(f"vgpu trace {args.trace_verb}: {exc}", file=sys.stderr)
        return 2
    if args.trace_verb == "show":
        return _show(trace, args)
    if args.trace_verb == "stats":
        print(format_statistics(statistics(trace)), end="")
        return 0
    import json

    document = chrome_trace(trace)
    try:
        with open(args.output, "w") as out:
            json.dump(document, out)
    except OSError as exc:
        print(f"vgpu trace export: cannot write {args.output}: {exc.strerror}",
              file=sys.stderr)
        return 1
    print(f"vgpu trace export: {len(document['traceEvents'])} events written to "
          f"{args.output} ({document['otherData']['timestamps']})", file=sys.stderr)
    return 0


# ----------------------------------------------------------------- reading calls

def calls(trace, session: int | None = None, api: str | None = None,
          kernel: str | None = None, stream: int | None = None) -> list[Call]:
    """The trace's calls, session by session in the order they started, filtered: `api` a
    prefix of the op's name, `kernel` the launches of that function, `stream` a handle."""
    found = []
    for recorded in trace.sessions:
        info = recorded.session
        if session is not None and info["id"] != session:
            continue
        functions: dict[int, str] = {}
        for index, (op, args, outcome) in enumerate(recorded.calls):
            if (op == "cuModuleGetFunction" and outcome["code"] == 0
                    and isinstance(args, list) and len(args) == 3):
                functions[args[0]] = str(args[2])
            one = _call(info, index, op, args, outcome, functions)
            if api is not None and not (op or "").lower().startswith(api.lower()):
                continue
            if kernel is not None and one.kernel != kernel:
                continue
            if stream is not None and one.stream != stream:
                continue
            found.append(one)
    return found


def _call(info: dict, index: int, op, args, outcome: dict, functions: dict) -> Call:
    from vgpu.replay.trace import is_blob

    listed = args if isinstance(args, list) else []
    where = STREAM_ARGUMENT.get(op)
    stream = listed[where] if where is not None and where < len(listed) else NO_STREAM
    if not isinstance(stream, int) or isinstance(stream, bool):
        stream = NO_STREAM
    kernel = None
    if op in ("cuLaunchKernel", "cuLaunchCooperativeKernel") and listed:
        kernel = functions.get(listed[0], "?")
    sent = sum(a[1] for a in listed if is_blob(a))
    kept = outcome.get("kept")
    if isinstance(kept, dict) and kept.get("data"):
        returned = sum(blob[1] for blob in kept["data"])
    elif (op == "cuMemcpyDtoH" and outcome["code"] == 0 and outcome.get("data")
          and len(listed) > 1 and isinstance(listed[1], int)):
        returned = listed[1]  # a trace without --full: the size asked for
    else:
        returned = 0
    time = outcome.get("time")
    if not (isinstance(time, list) and len(time) == 2):
        time = None
    return Call(info["id"], index, op, args, outcome, stream, kernel, sent, returned, time,
                info["started"])


def describe_arguments(call: Call) -> str:
    from vgpu.replay.replayer import describe_call

    args = call.args
    if call.kernel is not None and isinstance(args, list) and len(args) == 10:
        _, gx, gy, gz, bx, by, bz, shared, _, params = args
        size = len(params) if isinstance(params, bytes | list) else "?"
        text = (f"{call.kernel}<<<({gx},{gy},{gz}), ({bx},{by},{bz}), {shared}>>> "
                f"params {size} bytes")
    else:
        text = describe_call(call.op, args)
        text = text[text.index("("):] if call.op is not None and "(" in text else text
    return text if len(text) <= ARGUMENTS_WIDTH else text[:ARGUMENTS_WIDTH - 1] + "…"


def went_back(outcome: dict) -> str:
    """What went back to the program: r(esult), d(ata copied back), o(utput of printf),
    x (diagnostics); "-" nothing but the code."""
    marks = "".join(mark for key, mark in (("result", "r"), ("data", "d"), ("output", "o"),
                                            ("diagnostics", "x")) if key in outcome)
    return marks or "-"


def _stream_name(stream: int | None) -> str:
    if stream is None:
        return "-"
    return hex(stream) if stream >= 1 << 32 else str(stream)


# ----------------------------------------------------------------- show

def _show(trace, args) -> int:
    found = calls(trace, args.session, args.api, args.kernel, args.stream)
    print(f"{'session':>7}  {'index':>5}  {'op':<22} {'stream':<18} {'code':>4}  back  "
          "arguments")
    for call in found:
        print(f"{call.session:>7}  {call.index:>5}  {call.op or '(malformed)':<22} "
              f"{_stream_name(call.stream):<18} {call.outcome['code']:>4}  "
              f"{went_back(call.outcome):<4}  {describe_arguments(call)}")
    total = sum(len(s.calls) for s in trace.sessions)
    print(f"{len(found)} of {total} calls (back: r result, d data copied back, o printf "
          "output, x diagnostics)")
    return 0


# ----------------------------------------------------------------- stats

def statistics(trace) -> dict:
    """Per API: calls, failures, bytes each way, time; per kernel: launches, time."""
    every = calls(trace)
    timed = bool(every) and all(c.time is not None for c in every)
    apis: dict = defaultdict(Counter)
    kernels: dict = defaultdict(Counter)
    for call in every:
        entry = apis[call.op or "(malformed)"]
        entry["calls"] += 1
        entry["failed"] += call.outcome["code"] != 0
        entry["to_device"] += call.sent
        entry["to_host"] += call.returned
        if timed:
            entry["ns"] += call.time[1]
        if call.kernel is not None:
            kernels[call.kernel]["launches"] += 1
            if timed:
                kernels[call.kernel]["ns"] += call.time[1]
    return {"sessions": len(trace.sessions), "calls": len(every), "timed": timed,
            "apis": {k: dict(v) for k, v in apis.items()},
            "kernels": {k: dict(v) for k, v in kernels.items()}}


def format_statistics(stats: dict) -> str:
    timed = stats["timed"]

    def time(entry: dict) -> str:
        return f"{entry.get('ns', 0) / 1e6:>10.3f}" if timed else f"{'not recorded':>12}"

    time_title = f"{'time (ms)':>10}" if timed else f"{'time':>12}"
    lines = [f"{stats['sessions']} session{'s' * (stats['sessions'] != 1)}, "
             f"{stats['calls']} calls" + ("" if timed else
                                         "; times not recorded (a trace from before vgpu "
                                         "kept them)"),
             "",
             f"{'api':<24} {'calls':>6} {'failed':>6} {'to device':>12} {'to host':>12} "
             f"{time_title}"]
    apis = sorted(stats["apis"].items(), key=lambda kv: (-kv[1]["calls"], kv[0]))
    total: Counter = Counter()
    for name, entry in apis:
        total.update(entry)
        lines.append(f"{name:<24} {entry['calls']:>6} {entry['failed']:>6} "
                     f"{_bytes(entry['to_device']):>12} {_bytes(entry['to_host']):>12} "
                     f"{time(entry)}")
    lines.append(f"{'total':<24} {total['calls']:>6} {total['failed']:>6} "
                 f"{_bytes(total['to_device']):>12} {_bytes(total['to_host']):>12} "
                 f"{time(total)}")
    if stats["kernels"]:
        lines += ["", f"{'kernel':<24} {'launches':>8} {time_title}"]
        for name, entry in sorted(stats["kernels"].items(),
                                  key=lambda kv: (-kv[1]["launches"], kv[0])):
            lines.append(f"{name:<24} {entry['launches']:>8} {time(entry)}")
    return "\n".join(lines) + "\n"


def _bytes(n: int) -> str:
    return f"{n} B"


# ----------------------------------------------------------------- export

def chrome_trace(trace) -> dict:
    """The trace as Chrome trace events: a process per session, a thread (track) per stream,
    a complete event per call at its recorded time (or, when the trace has no times, at its
    place in call order: call i of a session at i µs, 1 µs long)."""
    every = calls(trace)
    timed = bool(every) and all(c.time is not None for c in every)
    first = min((s.session["started"] for s in trace.sessions), default=0.0)
    events: list = []
    tracks: dict = {}
    for recorded in trace.sessions:
        info = recorded.session
        events.append({"ph": "M", "name": "process_name", "pid": info["id"], "tid": 0,
                       "args": {"name": f"session {info['id']}: "
                                        f"{' '.join(info['argv'])[:80]}"}})
    for call in every:
        key = (call.session, call.stream)
        if key not in tracks:
            tracks[key] = tid = 1 + sum(1 for s, _ in tracks if s == call.session)
            name = ("calls naming no stream" if call.stream is None
                    else f"stream {_stream_name(call.stream)}")
            events.append({"ph": "M", "name": "thread_name", "pid": call.session, "tid": tid,
                           "args": {"name": name}})
        if timed:
            ts = (call.started - first) * 1e6 + call.time[0] / 1e3
            dur = call.time[1] / 1e3
        else:
            ts, dur = float(call.index), 1.0
        events.append({"ph": "X", "name": call.kernel or call.op or "(malformed)",
                       "cat": "launch" if call.kernel is not None else "call",
                       "pid": call.session, "tid": tracks[key], "ts": ts, "dur": dur,
                       "args": {"index": call.index, "op": call.op,
                                "code": call.outcome["code"],
                                "arguments": describe_arguments(call)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"trace": trace.path,
                          "timestamps": "recorded" if timed else
                          "call order (the trace has no times: call i at i us)"}}
