"""Sessions that real emu servers move: migrated while they work, and restored on a standby
from their checkpoint when their server is killed. The data the client wrote is all there
afterwards, at the same addresses, and the client noticed nothing but the address."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from vgpu_processes import VGPU, keygen, start_emu_server, stop_server, vgpu_environment

from vgpu.admin import AdminError, request
from vgpu.client import PEER_COPY_BYTES, Connection
from vgpu.errors import CudaError

PROGRAMS = Path(__file__).parent / "programs"
CONTEXT = 7
SIZES = (64 << 10, 2 * PEER_COPY_BYTES)  # through the ring; through a window (or the ring)


def _admin(address: str, op: str, **args) -> tuple[int, object]:
    try:
        return 0, request(address, op, [args], timeout_s=60)
    except AdminError as exc:
        return 1, str(exc)


class Workload:
    """Allocations that a client keeps rewriting and reading back."""

    def __init__(self, conn: Connection):
        self.conn = conn
        conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
        self.buffers = []
        for size in SIZES:
            address = conn.call("cuMemAlloc", CONTEXT, size)[0]
            self.buffers.append((address, ctypes.create_string_buffer(size)))
        self.rounds = 0

    def round(self) -> None:
        """Write every allocation with new bytes and read them all back."""
        self.rounds += 1
        for address, data in self.buffers:
            data.raw = os.urandom(len(data))
            self.conn.write_device("cuMemcpyHtoD", address, ctypes.addressof(data), len(data))
        self.check()

    def check(self) -> None:
        for address, data in self.buffers:
            back = ctypes.create_string_buffer(len(data))
            self.conn.read_device("cuMemcpyDtoH", address, ctypes.addressof(back), len(back))
            assert back.raw == data.raw, f"round {self.rounds}: 0x{address:x} differs"


@pytest.fixture
def emu_servers(tmp_path):
    started = []

    def start(name: str, *options: str) -> str:
        address = f"ipc://{tmp_path}/{name}.sock"
        started.append(start_emu_server(address, *options))
        return address

    yield start, started
    for proc in started:
        if proc.poll() is None:
            stop_server(proc)


def test_a_session_migrated_while_it_works_goes_on_at_the_target(emu_servers):
    start, _ = emu_servers
    source, target = start("source"), start("target")
    conn = Connection(source, timeout=30)
    work = Workload(conn)
    outcome = []

    def migrate():
        time.sleep(0.2)
        outcome.append(_admin(source, "migrate", pid=os.getpid(), to=target, precopy=True))

    mover = threading.Thread(target=migrate)
    mover.start()
    deadline = time.monotonic() + 30
    while not (outcome and conn.moves) and time.monotonic() < deadline:
        work.round()
    mover.join()
    assert outcome[0][0] == 0, outcome
    assert conn.address == target and conn.moves[0]["why"] == "redirect"
    work.round()
    conn.close()


def test_a_session_whose_server_is_killed_goes_on_at_the_standby(emu_servers, tmp_path):
    start, procs = emu_servers
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    options = ("--checkpoint-dir", str(folder), "--checkpoint-every", "0.2")
    primary, standby = start("primary", *options), start("standby", *options)
    conn = Connection(f"{primary},{standby}", timeout=30)
    work = Workload(conn)
    image = folder / f"{conn.token}.vgpu"
    deadline = time.monotonic() + 30
    while not image.exists() and time.monotonic() < deadline:
        work.round()
    work.round()  # work that the checkpoint does not cover
    procs[0].send_signal(signal.SIGKILL)
    work.check()
    assert conn.address == standby and conn.moves[0]["why"] == "failover"
    assert conn.moves[0]["position"] > 0  # from the checkpoint, not from scratch
    work.round()
    conn.close()


def test_a_program_with_pinned_memory_fails_over(emu_servers, tmp_path):
    # With standbys, pinned host memory stays the program's own (copies from it go through
    # messages a standby can replay), so the session can fail over.
    start, procs = emu_servers
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    options = ("--checkpoint-dir", str(folder), "--checkpoint-every", "0.2")
    primary, standby = start("primary", *options), start("standby", *options)
    program = subprocess.Popen(
        [*VGPU, "run", "--", sys.executable, str(PROGRAMS / "pinned_copies.py")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=vgpu_environment(VGPU_SERVER=f"{primary},{standby}"))
    try:
        assert program.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30
        while not list(folder.glob("*.vgpu")) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGKILL)
        out, err = program.communicate("go\n", timeout=60)
    finally:
        if program.poll() is None:
            program.kill()
            program.communicate()
    assert (program.returncode, out) == (0, "same\n"), err
    assert f"the session goes on at {standby}" in err


def test_a_failover_reports_no_error_and_no_output_twice(emu_servers):
    """What the standby replays, the program has already heard of: a queued call that failed
    (its error came with the next synchronization) must not fail the program again."""
    start, procs = emu_servers
    primary, standby = start("primary"), start("standby")  # no checkpoint: replayed whole
    conn = Connection(f"{primary},{standby}", timeout=30)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    conn.post("cuModuleUnload", 999)
    with pytest.raises(CudaError) as caught:
        conn.call("cuMemGetInfo")
    assert caught.value.code == 400
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait(10)
    free, total = conn.call("cuMemGetInfo")[0]  # fails over, replays, and answers plainly
    assert conn.address == standby and 0 < free <= total
    conn.close()


def test_a_session_migrates_between_tcp_servers_over_curve(tmp_path, monkeypatch):
    """The source server hands the session over as a client of the target, with its own key
    (which the target admits as an admin), and the program's client follows it there."""
    me, home_a, home_b = tmp_path / "me", tmp_path / "a", tmp_path / "b"
    mine, key_a = keygen(me), keygen(home_a, "--server")
    keygen(home_b, "--server")
    for home in (home_a, home_b):
        (home / "authorized-keys").mkdir()
        (home / "authorized-keys" / "me.key").write_text(f"{mine.read_text().strip()} admin\n")
    (home_b / "authorized-keys" / "server-a.key").write_text(
        f"{key_a.read_text().strip()} admin\n")
    servers = [start_emu_server("tcp://127.0.0.1:*", env=vgpu_environment(VGPU_HOME=str(h)))
               for h in (home_a, home_b)]
    monkeypatch.setenv("VGPU_HOME", str(me))
    try:
        source, target = (s.endpoint for s in servers)
        conn = Connection(source, timeout=30)
        work = Workload(conn)
        work.round()
        assert _admin(source, "migrate", pid=os.getpid(), to=target, precopy=True)[0] == 0
        work.round()
        assert conn.address == target and conn.moves[0]["why"] == "redirect"
        conn.close()
    finally:
        for proc in servers:
            stop_server(proc)
