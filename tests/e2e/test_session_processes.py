"""Sessions of a cuda server in device processes of their own (`--session-processes`, the
cuda backend's default), tested nested as the other cuda-backend tests are: the cuda server
runs under vgpu against an emu server, whose driver keeps a device fault for the whole
process as NVIDIA's does (every context of the faulting process fails until a reset). So a
cuda server whose sessions share one process loses them all to one program's fault, and one
whose sessions have processes of their own does not.

The programs are programs/fault_neighbours.py: a neighbour that works before and after the
fault, and a faulter that stores to an address nothing maps, then resets its device and
works again. An emu server runs its sessions in processes of their own when asked."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vgpu_processes import VGPU, emu_server, nested_cuda_server, vgpu_environment

from vgpu.registry import ask_sessions

PROGRAM = Path(__file__).resolve().parent / "programs" / "fault_neighbours.py"
TIMEOUT_S = 120


class Program:
    """fault_neighbours.py in role `role` under `vgpu run --server ADDRESS`, read line by
    line while it runs."""

    def __init__(self, address: str, role: str) -> None:
        self.proc = subprocess.Popen(
            [*VGPU, "run", "--server", address, "--", sys.executable, str(PROGRAM), role],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=vgpu_environment())
        self.pid = int(self.line().split()[1])

    def line(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
        assert ready, "the program printed nothing in time"
        line = self.proc.stdout.readline()
        assert line, f"the program ended early:\n{self.finish()[1]}"
        return line.rstrip("\n")

    def go_on(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[str, str]:
        """The rest of its output and its stderr, once it has ended."""
        out, err = self.proc.communicate(timeout=TIMEOUT_S)
        return out, err


def device_pids(address: str) -> dict[int, int | None]:
    """Each session's program pid -> its device process's pid (None: the server's own)."""
    return {s["pid"]: s.get("device_pid") for s in ask_sessions(address, timeout_s=10)}


@pytest.mark.parametrize("session_processes", [True, False],
                         ids=["processes-of-their-own", "one-process"])
def test_a_sessions_fault_leaves_the_others_working(tmp_path, session_processes):
    options = () if session_processes else ("--no-session-processes",)
    with nested_cuda_server(tmp_path, *options) as address:
        neighbour = Program(address, "neighbour")
        assert neighbour.line() == "ready"
        faulter = Program(address, "faulter")
        assert faulter.line() == "fault CUDA_ERROR_ILLEGAL_ADDRESS"
        pids = device_pids(address)
        neighbour.go_on()
        out, err = neighbour.finish()
        if session_processes:
            assert out == "words all 2\n" and neighbour.proc.returncode == 0, err
            assert None not in pids.values() and len(set(pids.values())) == 2, pids
        else:  # the fault was the whole server process's
            assert neighbour.proc.returncode != 0 and "CUDA error" in err, out + err
            assert set(pids.values()) == {None}, pids
        faulter.go_on()
        out, err = faulter.finish()
        assert out == "after reset words all 1\n" and faulter.proc.returncode == 0, err


def test_a_reset_after_a_fault_gets_a_fresh_device_process(tmp_path):
    with nested_cuda_server(tmp_path) as address:
        faulter = Program(address, "faulter")
        assert faulter.line() == "fault CUDA_ERROR_ILLEGAL_ADDRESS"
        before = device_pids(address)[faulter.pid]
        faulter.go_on()
        out, err = faulter.finish()
        assert out == "after reset words all 1\n", err
        assert _gone_within(before, 10), "the faulted device process still runs"


def test_a_device_process_that_dies_ends_only_its_session(tmp_path):
    """Killed under its session (as a driver crash would end it): that session's next call
    fails with CUDA_ERROR_LAUNCH_FAILED, and the server and a new session go on."""
    with nested_cuda_server(tmp_path) as address:
        victim = Program(address, "neighbour")
        assert victim.line() == "ready"
        os.kill(device_pids(address)[victim.pid], signal.SIGKILL)
        victim.go_on()
        out, err = victim.finish()
        assert victim.proc.returncode != 0 and "CUDA_ERROR_LAUNCH_FAILED" in err, out + err
        after = Program(address, "neighbour")
        assert after.line() == "ready"
        after.go_on()
        assert after.finish()[0] == "words all 2\n"


def test_an_emu_server_runs_sessions_in_processes_of_their_own_when_asked(tmp_path):
    """`--session-processes` on emu: a program runs with correct results, and `vgpu ps`
    shows its session's device process by its backend."""
    with emu_server(tmp_path, "--session-processes") as address:
        neighbour = Program(address, "neighbour")
        assert neighbour.line() == "ready"
        ps = subprocess.run([*VGPU, "ps", "--server", address], capture_output=True,
                            text=True, timeout=TIMEOUT_S, env=vgpu_environment())
        device_pid = device_pids(address)[neighbour.pid]
        assert device_pid and f"emu@{device_pid}" in ps.stdout, ps.stdout + ps.stderr
        neighbour.go_on()
        assert neighbour.finish()[0] == "words all 2\n"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False
