"""`vgpu trace show|stats|export` on traces written here, call by call (no server)."""

from __future__ import annotations

import json

import pytest

from vgpu.cli import main
from vgpu.replay.trace import TraceWriter, outcome_of, read_trace
from vgpu.trace_cli import calls, chrome_trace, statistics

CTX, MOD, FN_A, FN_B, S1, S2 = (0x7667010000000001, 0x7667020000000002, 0x7667030000000003,
                                0x7667030000000004, 0x7667040000000006, 0x7667040000000007)
PARAMS = bytes(16)


def _session(folder, session_id: int, started: float, timed: bool, full: bool = False):
    writer = TraceWriter(str(folder), {
        "id": session_id, "token": f"t{session_id}", "argv": ["app", str(session_id)],
        "pid": 100 + session_id, "memcheck": "report", "backend": "emu",
        "arena": 1 << 44, "started": started}, full)
    clock = [0]

    def add(op, args, code=0, result=None, data=()):
        outcome = outcome_of(code, result, list(data), "", "", full, writer.blob)
        if timed:
            outcome["time"] = [clock[0], 1000 * (len(writer.calls) + 1)]
            clock[0] += 10_000
        writer.add([op, args], outcome)

    add("cuCtxCreate", [CTX, 0, 0])
    add("cuModuleLoadData", [MOD, CTX, writer.blob(b"ptx" * 100), 300], result={"k": 1})
    add("cuModuleGetFunction", [FN_A, MOD, "scale"])
    add("cuModuleGetFunction", [FN_B, MOD, "add_bias"])
    add("cuModuleGetFunction", [FN_B + 1, MOD, "missing"], code=500)
    add("cuStreamCreate", [S1, CTX, 1, 0])
    add("cuMemcpyHtoD", [1 << 44, writer.blob(bytes(4000)), 4000])
    add("cuLaunchKernel", [FN_A, 4, 1, 1, 128, 1, 1, 0, S1, PARAMS])
    add("cuLaunchKernel", [FN_A, 4, 1, 1, 128, 1, 1, 0, S1, PARAMS])
    add("cuLaunchKernel", [FN_B, 8, 1, 1, 64, 1, 1, 0, 0, PARAMS])
    add("cuEventRecord", [0x7667050000000008, S2])
    add("cuMemcpyDtoH", [1 << 44, 64, ["frame"]], data=[bytes(64)])
    writer.finish()


@pytest.fixture
def trace(tmp_path):
    folder = tmp_path / "trace"
    _session(folder, 1, 1000.0, timed=True)
    _session(folder, 2, 1000.5, timed=True, full=True)
    return folder


@pytest.fixture
def untimed(tmp_path):
    folder = tmp_path / "untimed"
    _session(folder, 1, 1000.0, timed=False)
    return folder


def test_calls_are_filtered_by_session_api_kernel_and_stream(trace):
    loaded = read_trace(trace)
    assert len(calls(loaded)) == 24
    assert [c.index for c in calls(loaded, session=2)] == list(range(12))
    assert {c.op for c in calls(loaded, api="cuMemcpy")} == {"cuMemcpyHtoD", "cuMemcpyDtoH"}
    assert len(calls(loaded, api="cumodule")) == 8  # a prefix, in any case
    scale = calls(loaded, kernel="scale")
    assert [(c.session, c.index) for c in scale] == [(1, 7), (1, 8), (2, 7), (2, 8)]
    assert [c.op for c in calls(loaded, stream=S1, session=1)] == [
        "cuStreamCreate", "cuLaunchKernel", "cuLaunchKernel"]
    assert [c.kernel for c in calls(loaded, stream=0, session=1)] == ["add_bias"]
    assert [c.op for c in calls(loaded, stream=S2)] == ["cuEventRecord"] * 2


def test_statistics_count_calls_bytes_and_times_per_api_and_kernel(trace):
    stats = statistics(read_trace(trace))
    assert (stats["sessions"], stats["calls"], stats["timed"]) == (2, 24, True)
    launches = stats["apis"]["cuLaunchKernel"]
    assert (launches["calls"], launches["failed"]) == (6, 0)
    assert launches["ns"] == 2 * (8000 + 9000 + 10000)
    assert stats["apis"]["cuModuleGetFunction"]["failed"] == 2
    assert stats["apis"]["cuMemcpyHtoD"]["to_device"] == 8000
    assert stats["apis"]["cuModuleLoadData"]["to_device"] == 600
    # Without --full the size asked for, with it the data kept: the same 64 bytes each.
    assert stats["apis"]["cuMemcpyDtoH"]["to_host"] == 128
    assert stats["kernels"] == {"scale": {"launches": 4, "ns": 2 * (8000 + 9000)},
                                "add_bias": {"launches": 2, "ns": 2 * 10000}}


def test_stats_say_when_times_were_not_recorded(untimed, capsys):
    assert main(["trace", "stats", str(untimed)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 session, 12 calls; times not recorded")
    assert "not recorded" in out.splitlines()[-1]  # the kernel table too
    assert statistics(read_trace(untimed))["timed"] is False


def test_show_prints_one_row_per_call_with_kernels_named(trace, capsys):
    assert main(["trace", "show", str(trace), "--session", "1", "--kernel", "add_bias"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["session", "index", "op", "stream", "code", "back", "arguments"]
    assert out[1].split() == ["1", "9", "cuLaunchKernel", "0", "0", "-", "add_bias<<<(8,1,1),",
                              "(64,1,1),", "0>>>", "params", "16", "bytes"]
    assert out[2].startswith("1 of 24 calls")
    main(["trace", "show", str(trace), "--api", "cuMemcpyDtoH", "--session", "2"])
    (row,) = capsys.readouterr().out.splitlines()[1:-1]
    assert row.split()[2:7] == ["cuMemcpyDtoH", "-", "0", "d", f"({1 << 44:#x},"]
    main(["trace", "show", str(trace), "--stream", hex(S2)])
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_a_file_that_is_not_a_trace_is_refused(tmp_path, capsys):
    assert main(["trace", "show", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"vgpu trace show: {tmp_path} is not a vgpu "
                                              "trace")


def test_chrome_export_has_a_track_per_stream_per_session(trace, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["trace", "export", "--chrome", str(trace), "-o", str(out)]) == 0
    assert "written to" in capsys.readouterr().err
    document = json.loads(out.read_text())
    assert document["otherData"]["timestamps"] == "recorded"
    events = document["traceEvents"]
    tracks = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert tracks == {(s, name) for s in (1, 2) for name in (
        "calls naming no stream", f"stream {S1:#x}", "stream 0", f"stream {S2:#x}")}
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 24
    launches = [e for e in complete if e["cat"] == "launch"]
    assert [e["name"] for e in launches] == ["scale", "scale", "add_bias"] * 2
    second = [e for e in complete if e["pid"] == 2]
    assert second[0]["ts"] == pytest.approx(500_000)  # started half a second later
    assert second[1]["ts"] - second[0]["ts"] == pytest.approx(10)  # µs
    assert second[1]["dur"] == pytest.approx(2)


def test_chrome_export_without_times_uses_call_order_and_says_so(untimed):
    document = chrome_trace(read_trace(untimed))
    assert document["otherData"]["timestamps"].startswith("call order")
    complete = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in complete] == [float(i) for i in range(12)]
