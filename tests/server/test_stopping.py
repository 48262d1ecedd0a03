"""Stopping: a session that ends stops its kernel, and a stopping server tells its clients.

The programs are unmodified driver-API programs whose kernel would run for hours, in C
(programs/long_kernel.c) and in Python with cuda-python (programs/long_kernel.py), run under
`vgpu run` as a user runs them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from test_sessions import CONTEXT, SPIN_PTX, _ps
from vgpu_processes import VGPU, vgpu_environment

from vgpu.client import Connection
from vgpu.errors import DeviceUnavailable
from vgpu.protocol import BYE, CALLS, HELLO, PROTOCOL_VERSION, pack, unpack
from vgpu.server.server import SESSION_QUEUE_LIMIT

HERE = Path(__file__).resolve().parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="session")
def long_kernel(toolkit) -> Path:
    return toolkit.c_program((HERE / "programs" / "long_kernel.c").read_text())


LONG_KERNEL_PY = HERE / "programs" / "long_kernel.py"

# Ctrl-C of `vgpu run` while the program waits for its kernel: what the user sees then is
# what they see without vgpu. A C program dies of SIGINT; a Python program gets a
# KeyboardInterrupt where it waits (its traceback, exit status 130), or runs its own handler;
# a Python signal handler that exits (SIGTERM here) runs once and its exit status is the
# program's. Case: the long kernel's program and arguments, the signal, the exit status,
# stdout, stderr's last line (None: nothing on stderr).
INTERRUPT_CASES = {
    "C program": ([], signal.SIGINT, 128 + signal.SIGINT, "", None),
    "Python program": ([LONG_KERNEL_PY], signal.SIGINT, 128 + signal.SIGINT, "",
                       "KeyboardInterrupt"),
    "its KeyboardInterrupt handler": ([LONG_KERNEL_PY, "--handler"], signal.SIGINT, 3,
                                      "interrupted\n", None),
    "waiting in the runtime": ([LONG_KERNEL_PY, "--runtime"], signal.SIGINT,
                               128 + signal.SIGINT, "", "KeyboardInterrupt"),
    "its SIGTERM handler's sys.exit": ([LONG_KERNEL_PY, "--exit-on-sigterm"], signal.SIGTERM,
                                       4, "terminating\n", None),
}


def _interrupt_command(case: str, long_kernel: Path) -> list:
    """The command line of an INTERRUPT_CASES case."""
    program = INTERRUPT_CASES[case][0]
    return [sys.executable, *program] if program else [long_kernel]


def _check_interrupted(case: str, proc: subprocess.Popen) -> None:
    """The program ended as INTERRUPT_CASES says, and vgpu said nothing."""
    _, _, status, expected_out, last_err_line = INTERRUPT_CASES[case]
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert out == expected_out, err
    if last_err_line is None:
        assert err == ""
    else:
        assert err.startswith("Traceback (most recent call last):"), err
        assert err.rstrip().splitlines()[-1] == last_err_line, err
    assert not [line for line in err.splitlines() if line.startswith("vgpu")], err


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far, all its threads together."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _seconds_until_idle(pid: int, limit_s: float = 5.0) -> float:
    """How long until the process stops using the CPU (less than 10% over a quarter of a
    second); fails after `limit_s`."""
    start = time.monotonic()
    before = _cpu_seconds(pid)
    while time.monotonic() - start < limit_s:
        time.sleep(0.25)
        now = _cpu_seconds(pid)
        if now - before < 0.025:
            return time.monotonic() - start - 0.25
        before = now
    pytest.fail(f"process {pid} still uses the CPU {limit_s} s later")


def _terminal_signals() -> None:
    """Run as a program started from a shell prompt is: Ctrl-C not ignored (the test runner
    may have been started in the background, where it is)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(command: list, address: str | None = None) -> subprocess.Popen:
    """`vgpu run [--server ADDRESS] -- COMMAND`, once its kernel is queued."""
    where = ["--server", address] if address else ["--backend", "emu"]
    proc = subprocess.Popen([*VGPU, "run", *where, "--", *map(str, command)],
                            env=vgpu_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_terminal_signals)
    assert proc.stdout.readline().strip() == "launched", proc.stderr.read()
    return proc


def _running_session(address: str, command: Path) -> dict:
    """The program's session, once the server is running its kernel."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        mine = [s for s in _ps(address) if str(command) in s["command"]]
        if mine and mine[0]["queued"]:
            return mine[0]
        time.sleep(0.1)
    pytest.fail(f"the server never ran the kernel of {command}")


def _session_listed(address: str, command: Path) -> bool:
    return any(str(command) in s["command"] for s in _ps(address))


@pytest.mark.parametrize("how", ["ctrl-c of vgpu run", "sigkill of the program"])
def test_a_dead_client_s_kernel_stops_on_a_named_server(server, long_kernel, how):
    proc = _start([long_kernel], server.address)
    session = _running_session(server.address, long_kernel)
    if how == "ctrl-c of vgpu run":
        proc.send_signal(signal.SIGINT)  # forwarded to the program, which dies of it
        expected = 128 + signal.SIGINT
    else:
        os.kill(session["pid"], signal.SIGKILL)
        expected = 128 + signal.SIGKILL
    assert proc.wait(timeout=10) == expected
    proc.communicate()
    assert _seconds_until_idle(server.proc.pid) < 2.0
    assert not _session_listed(server.address, long_kernel)  # gone from `vgpu ps` too
    assert server.alive()


@pytest.mark.parametrize("case", ["Python program", "its KeyboardInterrupt handler"])
def test_ctrl_c_of_a_python_program_stops_its_kernel_on_a_named_server(server, long_kernel,
                                                                       case):
    """The interrupted program ends its session as it exits: the server stops its kernel."""
    proc = _start(_interrupt_command(case, long_kernel), server.address)
    _running_session(server.address, LONG_KERNEL_PY)
    proc.send_signal(signal.SIGINT)
    _check_interrupted(case, proc)
    assert _seconds_until_idle(server.proc.pid) < 2.0
    assert not _session_listed(server.address, LONG_KERNEL_PY)
    assert server.alive()


def test_a_client_that_says_goodbye_mid_kernel_stops_it(server):
    conn = Connection(server.address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    module, function = 0x7667_0200_0000_0011, 0x7667_0300_0000_0011
    conn.call("cuModuleLoadData", module, CONTEXT, ["inline", SPIN_PTX], len(SPIN_PTX))
    conn.post("cuModuleGetFunction", function, module, "spin")
    conn.post("cuLaunchKernel", function, 1, 1, 1, 256, 1, 1, 0, 0,
              (2_000_000_000).to_bytes(4, "little"))
    conn.flush()
    deadline = time.monotonic() + 30
    while not [s for s in _ps(server.address) if s["pid"] == os.getpid() and s["queued"]]:
        assert time.monotonic() < deadline, "the kernel never started"
        time.sleep(0.05)
    conn.close()  # BYE
    assert _seconds_until_idle(server.proc.pid) < 1.5
    assert not [s for s in _ps(server.address) if s["pid"] == os.getpid()]


def test_a_python_program_that_goes_on_after_ctrl_c_waits_for_its_kernel(server):
    """The interrupted wait is abandoned, not the kernel: the program's next wait waits for
    it, and its connection is as good as before."""
    command = [sys.executable, LONG_KERNEL_PY, "--handler", "--wait-again",
               "--iterations", "200000"]  # seconds on the emulator, not hours
    proc = _start(command, server.address)
    _running_session(server.address, LONG_KERNEL_PY)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")
    assert out == "interrupted\ncuCtxSynchronize returned 0 (CUDA_SUCCESS)\n"


@pytest.mark.parametrize("case", INTERRUPT_CASES)
def test_ctrl_c_of_vgpu_run_returns_promptly(long_kernel, case):
    """Ctrl-C (or SIGTERM) of vgpu run while the program waits for its kernel."""
    proc = _start(_interrupt_command(case, long_kernel))  # its own private server
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        children = [int(pid) for pid in f.read().split()]
    server_pid = next(pid for pid in children
                      if b"server" in Path(f"/proc/{pid}/cmdline").read_bytes())
    deadline = time.monotonic() + 30
    while _cpu_seconds(server_pid) < 0.5:  # the kernel runs
        assert time.monotonic() < deadline, "the private server never ran the kernel"
        time.sleep(0.1)
    start = time.monotonic()
    proc.send_signal(INTERRUPT_CASES[case][1])
    proc.wait(timeout=30)
    assert time.monotonic() - start < 2.0
    _check_interrupted(case, proc)
    assert not Path(f"/proc/{server_pid}").exists()  # the private server is gone with it


def test_a_stopping_server_tells_its_clients_and_exits_cleanly(server, long_kernel):
    """SIGTERM during a kernel: the waiting client hears CUDA_ERROR_DEVICE_UNAVAILABLE at
    once (not after VGPU_TIMEOUT), the server stops the kernel and exits 0, quietly."""
    idle = Connection(server.address, timeout=30)  # a client not waiting for anything
    idle.call("vgpuSynchronize")
    proc = _start([long_kernel], server.address)
    _running_session(server.address, long_kernel)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    client_s = time.monotonic() - start
    assert server.proc.wait(timeout=30) == 0
    server_s = time.monotonic() - start
    assert "cuCtxSynchronize returned 46 (CUDA_ERROR_DEVICE_UNAVAILABLE)" in out
    assert "the server is shutting down" in err
    assert proc.returncode == 2
    assert client_s < 2.0 and server_s < 2.0
    server_err = server.proc.stderr.read()
    assert "Traceback" not in server_err and "Error" not in server_err, server_err
    # The idle client learns it at its next call, without waiting out its timeout.
    start = time.monotonic()
    with pytest.raises(DeviceUnavailable, match="the server is shutting down"):
        idle.call("cuMemGetInfo")
    assert time.monotonic() - start < 1.0


MEMSET_BYTES = 16 << 20


@pytest.fixture
def huge_batch(server):
    """A raw client (not vgpu's, which sends at most a few hundred calls at once) whose one
    message holds as many 16 MiB memsets as the server queues for a session: many minutes of
    work. Yields its socket once the server holds that work."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    try:
        hello = {"version": PROTOCOL_VERSION, "pid": os.getpid(),
                 "host": socket.gethostname(), "argv": ["huge batch"]}
        sock.send(pack([HELLO, 1, hello]))
        assert sock.poll(5000) and unpack(sock.recv())[1] == 0
        sock.send(pack([CALLS, 2, [["cuDevicePrimaryCtxRetain", [CONTEXT, 0]],
                                   ["cuMemAlloc", [CONTEXT, MEMSET_BYTES]]]]))
        assert sock.poll(5000)
        _, code, address, *_ = unpack(sock.recv())
        assert code == 0
        memset = ["vgpuMemset", [address, b"\x01", MEMSET_BYTES]]
        sock.send(pack([CALLS, 0, [memset] * (SESSION_QUEUE_LIMIT - 1)]))
        # The server keeps answering others meanwhile (`vgpu ps` among them), and lists it.
        deadline = time.monotonic() + 30
        while not [s for s in _ps(server.address)
                   if s["command"] == "huge batch" and s["queued"] == SESSION_QUEUE_LIMIT - 1]:
            assert time.monotonic() < deadline, "the server never queued the batch"
            time.sleep(0.05)
        yield sock
    finally:
        sock.close()


def test_a_stopping_server_exits_promptly_in_the_middle_of_a_huge_batch(server, huge_batch):
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert time.monotonic() - start < 2.0
    server_err = server.proc.stderr.read()
    assert "did not stop" not in server_err and "Traceback" not in server_err, server_err


def test_a_client_that_says_goodbye_in_the_middle_of_a_huge_batch_stops_it(server, huge_batch):
    huge_batch.send(pack([BYE, 0, None]))
    assert _seconds_until_idle(server.proc.pid) < 1.5
    assert not [s for s in _ps(server.address) if s["command"] == "huge batch"]
    assert server.alive()
