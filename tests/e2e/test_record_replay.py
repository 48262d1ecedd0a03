"""Recording a program once and replaying it without the program, as a user does:
`vgpu record -o TRACE -- CMD`, then `vgpu replay TRACE --check`."""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import zmq
from e2e_support import edit_recorded_module
from vgpu_processes import emu_server, run_vgpu

from vgpu.protocol import CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.replay.replayer import replay
from vgpu.replay.store import frame, read_framed
from vgpu.replay.trace import FORMAT_VERSION, MAGIC, TraceWriter, read_trace
from vgpu.sealed_files import sealed_file

PROGRAMS = Path(__file__).resolve().parents[1] / "runtime" / "programs"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIAS = "0f3E800000"  # kernels.cu's `bias = 0.25f`, as its PTX writes it




@pytest.fixture(scope="module")
def driver_trace(driver_app, kernels_ptx, tmp_path_factory) -> Path:
    trace = tmp_path_factory.mktemp("traces") / "driver_app"
    result = run_vgpu("record", "--full", "-o", trace, "--", driver_app, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_app: all results correct" in result.stdout
    assert "vgpu record: 1 session, " in result.stderr
    return trace


def test_a_recorded_driver_program_replays_with_the_same_results(driver_trace):
    result = run_vgpu("replay", driver_trace, "--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vgpu replay: 1 session, ")
    assert result.stdout.rstrip().endswith("replayed; every result as recorded")


def test_a_recorded_runtime_program_replays_with_the_same_results(toolkit, tmp_path):
    program = toolkit.executable((PROGRAMS / "vector_add.cu").read_text(),
                                 ["-cudart", "shared", f"-I{PROGRAMS}"])
    trace = tmp_path / "vector_add"
    recorded = run_vgpu("record", "-o", trace, "--", program)
    assert recorded.returncode == 0, recorded.stderr
    assert "vector_add: 1000 sums correct" in recorded.stdout
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 0, result.stderr
    assert "every result as recorded" in result.stdout


def test_concurrent_streams_and_host_functions_replay(toolkit, tmp_path):
    """A kernel released by another stream's, and host functions holding their streams:
    the replay, which has no program to run them, lets their streams go on."""
    program = toolkit.executable((PROGRAMS / "concurrent_streams.cu").read_text(),
                                 ["-cudart", "shared", f"-I{PROGRAMS}"])
    trace = tmp_path / "concurrent_streams"
    recorded = run_vgpu("record", "-o", trace, "--", program, "--unmapped")
    assert recorded.returncode == 0, recorded.stderr
    assert "host functions in order" in recorded.stdout
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 0, result.stderr
    assert "every result as recorded" in result.stdout


@pytest.mark.parametrize("program, says", [
    ("vector_add.py", "vector_add of 1048576 floats on 'vgpu emulated GPU (PTX on CPU)': correct"),
    ("numba_axpy.py", "numba axpy ok on vgpu emulated GPU"),
])
def test_recorded_python_programs_replay_with_the_same_results(program, says, tmp_path):
    # examples/: a cuda-python program, and a numba-cuda one whose kernel numba compiles.
    trace = tmp_path / "trace"
    recorded = run_vgpu("record", "-o", trace, "--", sys.executable, EXAMPLES / program)
    assert recorded.returncode == 0, recorded.stderr
    assert says in recorded.stdout
    (session,) = read_trace(trace).sessions
    assert [op for op, _, _ in session.calls].count("cuLaunchKernel") == 1  # replayed too
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vgpu replay: 1 session, ")
    assert result.stdout.rstrip().endswith("replayed; every result as recorded")


def test_every_process_of_a_program_is_one_session_of_its_trace(driver_app, kernels_ptx,
                                                                 tmp_path):
    trace = tmp_path / "two"
    both = f"{driver_app} {kernels_ptx} & {driver_app} {kernels_ptx}; wait $!"
    recorded = run_vgpu("record", "-o", trace, "--", "sh", "-c", both)
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout.count("driver_app: all results correct") == 2
    assert "vgpu record: 2 sessions, " in recorded.stderr
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vgpu replay: 2 sessions, ")


def test_a_recording_server_shares_no_memory_with_its_clients(tmp_path):
    token = secrets.token_hex(16)
    # A staging ring as a client makes it (the only kind a server maps: see client_files).
    ring = sealed_file("vgpu-ring", 4096)
    probe = ctypes.create_string_buffer(b"probe")
    hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
             "argv": ["test"], "token": token, "resume": None,
             "shm": {"fd": ring, "size": 4096},
             "probe": [ctypes.addressof(probe), b"probe"]}
    answers = {}
    for name, options in (("plain", ()), ("recording", ("--record", str(tmp_path / "t")))):
        with emu_server(tmp_path, *options) as address:
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            sock.send_multipart([pack([HELLO, 1, hello])])
            assert sock.poll(10_000), "no answer to hello"
            _, code, info, *_ = unpack(sock.recv_multipart()[0])
            sock.close()
            assert code == 0, info
            answers[name] = {k: info[k] for k in ("shm", "peer_memory", "device_windows")}
    os.close(ring)
    assert answers["plain"]["shm"]  # the same hello gets shared memory from a plain server
    assert answers["recording"] == {"shm": False, "peer_memory": False,
                                    "device_windows": False}


def test_a_server_stopped_under_a_recorded_session_still_writes_its_trace(tmp_path):
    trace = tmp_path / "trace"
    with emu_server(tmp_path, "--record", str(trace)) as address:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(), "host": "elsewhere",
                 "argv": ["raw"], "token": None, "resume": None}
        calls = [["cuDevicePrimaryCtxRetain", [7, 0]], ["cuMemAlloc", [7, 4096]]]
        for seq, (kind, body) in enumerate(((HELLO, hello), (CALLS, calls)), 1):
            sock.send_multipart([pack([kind, seq, body])])
            assert sock.poll(10_000)
            assert unpack(sock.recv_multipart()[0])[1] == 0
        sock.close()
    (session,) = read_trace(trace).sessions  # the server stopped with the session open
    assert session.session["argv"] == ["raw"]
    assert [op for op, _, _ in session.calls] == ["cuDevicePrimaryCtxRetain", "cuMemAlloc"]
    assert [outcome["code"] for _, _, outcome in session.calls] == [0, 0]


def test_an_edited_kernel_is_caught_at_the_first_result_it_changes(driver_trace, tmp_path):
    trace = _copy(driver_trace, tmp_path / "edited")
    manifest = next(trace.glob("*.trace"))
    body = msgpack.unpackb(read_framed(str(manifest), MAGIC, FORMAT_VERSION, ValueError,
                                       "trace", "trace")[0], raw=False)
    loaded = read_trace(trace)
    load = next(i for i, c in enumerate(body["calls"]) if c[0] == "cuModuleLoadData")
    ptx = loaded.load(body["calls"][load][1][2]).decode()
    assert BIAS in ptx
    writer = TraceWriter(str(trace), body["session"], True)
    body["calls"][load][1][2] = writer.blob(ptx.replace(BIAS, "0f3F000000").encode())
    manifest.write_bytes(frame(MAGIC, FORMAT_VERSION, msgpack.packb(body)))

    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 1, result.stderr
    assert "results differ from the recording at" in result.stderr
    # The program reads `bias` back: the first result the edit changes.
    bias, size = body["calls"][load][2]["kept"]["result"]["variables"]["bias"]
    first = next(i for i, (op, args, _) in enumerate(body["calls"])
                 if op == "cuMemcpyDtoH" and args[0] == bias)
    assert f"call {first}: cuMemcpyDtoH({bias:#x}, {size}, ['frame'])\n" in result.stderr
    assert "data copied back differ first at byte" in result.stderr
    assert "recorded +" in result.stderr and "replayed +" in result.stderr


def test_a_difference_names_the_launch_that_wrote_it(driver_trace, tmp_path):
    trace = _copy(driver_trace, tmp_path / "edited")
    body = edit_recorded_module(trace, _subtract_bias)
    calls = body["calls"]
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 1, result.stderr
    # add_bias runs last, after the scale loop, on the array copied back after it.
    at = max(i for i, (op, _, _) in enumerate(calls) if op == "cuLaunchKernel")
    copy = next(i for i in range(at, len(calls)) if calls[i][0] == "cuMemcpyDtoH")
    assert f"call {copy}: cuMemcpyDtoH({calls[copy][1][0]:#x}, " in result.stderr
    launches = sum(op == "cuLaunchKernel" for op, _, _ in calls)
    assert launches > 2
    gx, gy, gz, bx, by, bz = calls[at][1][1:7]
    assert (f"were last written by launch #{launches} (kernel add_bias, grid ({gx}, {gy}, "
            f"{gz}), block ({bx}, {by}, {bz})) at call {at}\n") in result.stderr
    assert f"the bytes at {calls[copy][1][0]:#x}+" in result.stderr, result.stderr


def test_floats_that_differ_in_the_last_bit_pass_within_a_tolerance(driver_trace, tmp_path):
    trace = _copy(driver_trace, tmp_path / "ulp")
    edit_recorded_module(trace, lambda ptx: ptx.replace(BIAS, "0f3E800001"))  # 0.25 + 1 ulp
    exact = run_vgpu("replay", trace, "--check")
    assert exact.returncode == 1
    assert "data copied back differ first at byte 0 (of 4)" in exact.stderr

    close = run_vgpu("replay", trace, "--check", "--rtol", "1e-6")
    assert close.returncode == 0, close.stderr
    assert close.stdout.rstrip().endswith(
        "replayed; every result as recorded (data copied back as f32 within rtol 1e-06, "
        "atol 0)")

    strict = run_vgpu("replay", trace, "--check", "--rtol", "1e-9", "--atol", "1e-9")
    assert strict.returncode == 1
    assert ("data copied back differ beyond rtol 1e-09, atol 1e-09 first at f32 element 0 "
            "(byte 0 of 4): recorded 0.25, replayed 0.25000003\n") in strict.stderr


def test_a_tolerance_needs_a_trace_that_keeps_the_data(driver_trace, tmp_path):
    trace = _digests_only(_copy(driver_trace, tmp_path / "digests"))
    result = run_vgpu("replay", trace, "--check", "--atol", "1e-6")
    assert result.returncode == 2
    assert result.stderr == (f"vgpu replay: --rtol/--atol compare the data copied back, and "
                             f"{trace} keeps only their digests (recorded without --full): "
                             "it can only be checked for exact equality\n")
    assert run_vgpu("replay", trace, "--check").returncode == 0


def test_tolerance_options_are_refused_where_they_mean_nothing(driver_trace):
    for options, why in (
            (("--rtol", "1e-6"), "--rtol, --atol and --floats say how --check compares"),
            (("--check", "--floats", "f64"), "--floats needs --rtol or --atol"),
            (("--check", "--atol", "-1"), "--rtol and --atol cannot be negative")):
        result = run_vgpu("replay", driver_trace, *options)
        assert result.returncode == 2
        assert result.stderr == f"vgpu replay: {why}\n"


def test_a_digest_only_trace_names_the_launch_that_wrote_what_differs(driver_trace,
                                                                      tmp_path):
    trace = _digests_only(_copy(driver_trace, tmp_path / "edited"))
    body = edit_recorded_module(trace, _subtract_bias)
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 1, result.stderr
    assert "record with --full to see where" in result.stderr
    calls = body["calls"]
    at = max(i for i, (op, _, _) in enumerate(calls) if op == "cuLaunchKernel")
    copy = next(i for i in range(at, len(calls)) if calls[i][0] == "cuMemcpyDtoH")
    address, size = calls[copy][1][:2]
    launches = sum(op == "cuLaunchKernel" for op, _, _ in calls)
    gx, gy, gz, bx, by, bz = calls[at][1][1:7]
    # Without the data, all the copy read back is what differs.
    assert (f"the bytes at {address:#x}+0 (to +{size}) were last written by launch "
            f"#{launches} (kernel add_bias, grid ({gx}, {gy}, {gz}), block ({bx}, {by}, "
            f"{bz})) at call {at}\n") in result.stderr


def _digests_only(trace: Path) -> Path:
    """`trace` as if recorded without --full: its outcomes without the data they kept."""
    manifest = next(trace.glob("*.trace"))
    body = msgpack.unpackb(read_framed(str(manifest), MAGIC, FORMAT_VERSION, ValueError,
                                       "trace", "trace")[0], raw=False)
    body["full"] = False
    for _, _, outcome in body["calls"]:
        outcome.pop("kept", None)
    manifest.write_bytes(frame(MAGIC, FORMAT_VERSION, msgpack.packb(body)))
    return trace


def _subtract_bias(ptx: str) -> str:
    """The kernel that adds the bias subtracts it instead."""
    return _in_kernel(ptx, "add_bias", "add.f32", "sub.f32")


def _in_kernel(ptx: str, kernel: str, old: str, new: str) -> str:
    """`ptx` with the first `old` of `kernel`'s body replaced by `new`."""
    start = ptx.index(f".entry {kernel}(")
    assert old in ptx[start:ptx.index("\n}", start)]
    return ptx[:start] + ptx[start:].replace(old, new, 1)


def test_replaying_twice_gives_identical_results(driver_trace, tmp_path):
    trace = read_trace(driver_trace)
    runs = []
    with emu_server(tmp_path) as address:
        for _ in range(2):
            outcomes: list = []
            assert replay(trace, address, check=True, seen=outcomes.append) is None
            runs.append(outcomes)
    assert runs[0] == runs[1]
    assert len(runs[0]) == sum(len(s.calls) for s in trace.sessions)


def test_a_damaged_trace_is_refused_before_anything_runs(driver_trace, tmp_path):
    trace = _copy(driver_trace, tmp_path / "damaged")
    manifest = next(trace.glob("*.trace"))
    manifest.write_bytes(manifest.read_bytes()[:-10])
    result = run_vgpu("replay", trace, "--check")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"vgpu replay: {manifest} is truncated "
                                     f"({manifest.stat().st_size} bytes; its header says "
                                     f"{manifest.stat().st_size + 10})")


def _copy(trace: Path, to: Path) -> Path:
    subprocess.run(["cp", "-a", str(trace), str(to)], check=True)
    return to


def test_a_trace_is_never_written_over_another(driver_trace, driver_app, kernels_ptx):
    result = run_vgpu("record", "-o", driver_trace, "--", driver_app, kernels_ptx)
    assert result.returncode == 2
    assert result.stderr == (f"vgpu record: {driver_trace} exists; a trace goes into a new "
                             "or empty folder\n")
    assert len(read_trace(driver_trace).sessions) == 1
