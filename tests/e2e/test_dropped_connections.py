"""A network that fails under a running program: the connection between client and server is
cut, again and again, while the program computes, and the program finishes as an
uninterrupted run does (its client reconnects to the same session and resends what never
arrived; the server sends again the replies that were lost). A client that vanishes for good
has its session freed within seconds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from running_program import RunningProgram, pause_at
from test_state_moves import (
    PROGRAMS,
    TIMEOUT_S,
    assert_finished_like_an_uninterrupted_run,
    state_loop_command,
)
from vgpu_processes import (
    TcpForwarder,
    free_tcp_address,
    run_vgpu,
    start_emu_server,
    stop_server,
)


@pytest.fixture
def tcp_server():
    """An emu server on loopback TCP, behind a forwarder the test can cut; yields both."""
    address = free_tcp_address()
    proc = start_emu_server(address, "--reconnect-grace", "3")
    forwarder = TcpForwarder(("127.0.0.1", int(address.rsplit(":", 1)[1])))
    try:
        yield address, forwarder
    finally:
        forwarder.close()
        stop_server(proc)


def sessions(address: str) -> list[str]:
    """The session rows `vgpu ps --server ADDRESS` shows."""
    result = run_vgpu("ps", "--server", address, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines()[2:] if line.strip()]


@pytest.mark.parametrize("kind", ["driver", "runtime", "cuda-python"])
def test_a_program_finishes_correctly_through_connections_cut_while_it_runs(
        tmp_path, tcp_server, state_loop, rt_state_loop, state_kernels_ptx, kind):
    address, forwarder = tcp_server
    pause = tmp_path / "pause"
    pause_at(pause, 1_000_000)  # no pause: the file only has to be there
    shape, command = {
        "driver": ((3, 3072, 20, 1),
                   state_loop_command(state_loop, state_kernels_ptx, 3, 3072, 20, 1, pause)),
        "runtime": ((2, 3072, 20), [rt_state_loop, 3072, 20, "--pause-file", pause]),
        "cuda-python": ((3, 3072, 20, 1), [sys.executable, PROGRAMS / "state_loop.py",
                                           state_kernels_ptx, 3, 3072, 20, 1,
                                           "--pause-file", pause]),
    }[kind]
    program = RunningProgram(command, TIMEOUT_S, VGPU_SERVER=forwarder.address)
    try:
        cuts = 0
        while program.proc.poll() is None and cuts < 8:
            time.sleep(0.2)
            forwarder.drop()
            cuts += 1
        assert_finished_like_an_uninterrupted_run(program, *shape)
        assert forwarder.accepted > 2, "the connection was never cut while the program ran"
        assert "reconnect" not in program.stderr.lower(), program.transcript()
    finally:
        program.stop()
    assert sessions(address) == []  # it said goodbye; nothing was left behind


# A client on another host, as the server sees it (its pid means nothing here): it opens a
# session with some memory, says so, and computes on its host until it is killed.
REMOTE_CLIENT = textwrap.dedent("""
    import socket, sys, time
    socket.gethostname = lambda: "another-host"
    from vgpu.client import Connection
    conn = Connection(sys.argv[1])
    conn.post("cuDevicePrimaryCtxRetain", 0x7667_0100_0000_0001, 0)
    conn.call("cuMemAlloc", 0x7667_0100_0000_0001, 1 << 20)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_the_sessions_of_remote_clients_that_vanish_are_freed_within_seconds(tcp_server):
    address, closing = tcp_server
    # One client's host dies with its connection closed (its kernel says so); the other's
    # path goes silent (a host switched off): zmq's heartbeats find that out.
    silent = TcpForwarder(closing.target)
    clients = [subprocess.Popen([sys.executable, "-c", REMOTE_CLIENT, forwarder.address],
                                stdout=subprocess.PIPE, text=True)
               for forwarder in (closing, silent)]
    try:
        for client in clients:
            assert client.stdout.readline() == "ready\n"
        assert len(sessions(address)) == 2
        silent.silence()
        for client in clients:
            client.kill()
            client.wait()
        deadline = time.monotonic() + 20  # heartbeat timeout + grace, with room to spare
        while sessions(address):
            assert time.monotonic() < deadline, sessions(address)
            time.sleep(0.5)
    finally:
        for client in clients:
            client.kill()
            client.wait()
            client.stdout.close()
        silent.close()
