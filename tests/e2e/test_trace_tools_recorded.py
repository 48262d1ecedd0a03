"""The trace tools on a recorded program: `vgpu trace show|stats|export`, and recorded traces
run as tests by the pytest plugin (`pytest --vgpu-traces DIR`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import edit_recorded_module
from vgpu_processes import run_vgpu, vgpu_environment

from vgpu.replay.trace import read_trace

BIAS = "0f3E800000"  # kernels.cu's `bias = 0.25f`, as its PTX writes it




@pytest.fixture(scope="module")
def traces(driver_app, kernels_ptx, tmp_path_factory) -> Path:
    """A folder of two traces of driver_app: `good`, as recorded, and `edited`, whose
    module's `bias` was changed after the recording."""
    folder = tmp_path_factory.mktemp("traces")
    good = folder / "good"
    result = run_vgpu("record", "--full", "-o", good, "--", driver_app, kernels_ptx)
    assert result.returncode == 0, result.stderr
    edited = folder / "edited"
    subprocess.run(["cp", "-a", str(good), str(edited)], check=True)
    edit_recorded_module(edited, lambda ptx: ptx.replace(BIAS, "0f3F000000"))
    return folder


def test_a_recording_keeps_each_calls_time(traces):
    (session,) = read_trace(traces / "good").sessions
    times = [outcome["time"] for _, _, outcome in session.calls]
    assert all(start >= 0 and took > 0 for start, took in times)
    assert [start for start, _ in times] == sorted(start for start, _ in times)


def test_show_names_the_launches_of_a_kernel(traces):
    result = run_vgpu("trace", "show", traces / "good", "--kernel", "scale")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()[1:-1]
    assert len(rows) == 8  # driver_app launches `scale` 8 times on its stream s1
    assert all(" cuLaunchKernel " in row and "scale<<<(79,1,1), (128,1,1), 0>>>" in row
               for row in rows)
    # (the server runs driver_app's two streams beside each other: its 2 copies on them come
    # between vgpuStreamScope calls, and 2 synchronizations that follow work on them ask the
    # server, 6 calls more than the program's own)
    assert result.stdout.splitlines()[-1].startswith("8 of 49 calls")


def test_stats_count_launches_bytes_and_time(traces):
    result = run_vgpu("trace", "stats", traces / "good")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1 session, 49 calls"  # (see the test above)
    kernels = {line.split()[0]: line.split()[1:] for line in
               lines[lines.index(next(x for x in lines if x.startswith("kernel "))) + 1:]}
    assert {name: row[0] for name, row in kernels.items()} == {
        "scale": "8", "vadd": "1", "add_bias": "1"}
    htod = next(line for line in lines if line.startswith("cuMemcpyHtoD "))
    assert htod.split()[1:6] == ["4", "0", "120004", "B", "0"]  # 3 x 40000 + 4 bytes


def test_export_writes_chrome_trace_events(traces, tmp_path):
    out = tmp_path / "trace.json"
    result = run_vgpu("trace", "export", "--chrome", traces / "good", "-o", out)
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert document["otherData"]["timestamps"] == "recorded"
    threads = [e["args"]["name"] for e in document["traceEvents"]
               if e["name"] == "thread_name"]
    assert len(threads) == 4  # no stream, the default stream, s1, s2
    launches = [e["name"] for e in document["traceEvents"] if e.get("cat") == "launch"]
    assert launches == ["vadd"] + ["scale"] * 8 + ["add_bias"]


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, timeout=60, cwd=folder,
                          env=vgpu_environment(COLUMNS="300"))  # short summary whole


def test_the_pytest_plugin_runs_each_trace_as_a_test(traces, tmp_path):
    result = _pytest(tmp_path, "--vgpu-traces", str(traces), "-rA")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "collected 2 items" in result.stdout
    assert "PASSED " in result.stdout and "good::good" in result.stdout
    failure = result.stdout[result.stdout.index("vgpu trace edited"):]
    assert "vgpu replay: results differ from the recording at session 1 (" in failure
    assert "data copied back differ first at byte" in failure
    assert "1 failed, 1 passed" in result.stdout
    assert "FAILED " in result.stdout and ("edited::edited - vgpu replay: results differ from "
                                           "the recording at session 1 (") in result.stdout


def test_the_pytest_plugin_fails_a_damaged_trace_with_what_is_wrong(traces, tmp_path):
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-a", str(traces / "good"), str(damaged)], check=True)
    manifest = next(damaged.glob("*.trace"))
    manifest.write_bytes(manifest.read_bytes()[:-10])
    result = _pytest(tmp_path, "--vgpu-traces", str(damaged))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"vgpu replay: {manifest} is truncated" in result.stdout


def test_the_pytest_plugin_does_nothing_unless_asked(traces, tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    subprocess.run(["cp", "-a", str(traces / "good"), str(tmp_path / "good")], check=True)
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "collected 1 item" in result.stdout
    asked = _pytest(tmp_path, "--vgpu-traces", str(tmp_path / "good"))
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "collected 2 items" in asked.stdout  # the test file and the trace
