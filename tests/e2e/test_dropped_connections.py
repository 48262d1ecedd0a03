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
    curve_homes,
    free_tcp_address,
    run_vgpu,
    start_emu_server,
    stop_server,
    vgpu_environment,
)

GRACE_S = 3  # how long the server keeps a session whose connection dropped


class Remote:
    """An emu server on loopback TCP, CurveZMQ as by default, behind a forwarder the test can
    cut, and the VGPU_HOME of a client it admits."""

    def __init__(self, root):
        server_home, self.client_home = curve_homes(root)
        # Kernels interpreted (--no-compile): the programs must run long enough for the
        # connection to be cut under them several times.
        self.proc = start_emu_server(free_tcp_address(), "--reconnect-grace", str(GRACE_S),
                                     "--no-compile",
                                     env=vgpu_environment(VGPU_HOME=str(server_home)))
        self.address = self.proc.endpoint  # tcp://127.0.0.1:PORT#serverkey=KEY
        where, _, self.fragment = self.address.partition("#")
        try:
            self.forwarder = TcpForwarder(("127.0.0.1", int(where.rsplit(":", 1)[1])))
        except BaseException:
            stop_server(self.proc)  # never left running for the tests after this one
            raise

    def through(self, forwarder: TcpForwarder) -> str:
        """The server's address as a client reaches it through `forwarder`."""
        return f"{forwarder.address}#{self.fragment}"

    def env(self) -> dict[str, str]:
        return {"VGPU_HOME": str(self.client_home)}

    def sessions(self) -> list[str]:
        """The session rows `vgpu ps --server ADDRESS` shows."""
        result = run_vgpu("ps", "--server", self.address, timeout=TIMEOUT_S, **self.env())
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines()[2:] if line.strip()]

    def sessions_end(self, within_s: float) -> None:
        """Fails unless the server has no sessions left within `within_s`."""
        deadline = time.monotonic() + within_s
        while self.sessions():
            assert time.monotonic() < deadline, self.sessions()
            time.sleep(0.5)

    def close(self) -> None:
        self.forwarder.close()
        stop_server(self.proc)


@pytest.fixture
def remote(tmp_path):
    server = Remote(tmp_path)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["driver", "runtime", "cuda-python"])
def test_a_program_finishes_correctly_through_connections_cut_while_it_runs(
        tmp_path, remote, state_loop, rt_state_loop, state_kernels_ptx, kind):
    forwarder = remote.forwarder
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
    program = RunningProgram(command, TIMEOUT_S, VGPU_SERVER=remote.through(forwarder),
                             **remote.env())
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
    # It said goodbye, so nothing is left behind; though a goodbye sent as its connection
    # is cut is lost (the server hears of it on a new connection zmq opens by itself, if
    # at all, and does not know that one), and its session ends with the grace period.
    remote.sessions_end(within_s=GRACE_S + 10)


# A client that opens a session, allocates, and says goodbye.
BRIEF_CLIENT = textwrap.dedent("""
    import sys
    from vgpu.client import Connection
    conn = Connection(sys.argv[1])
    conn.post("cuDevicePrimaryCtxRetain", 0x7667_0100_0000_0001, 0)
    conn.call("cuMemAlloc", 0x7667_0100_0000_0001, 1 << 20)
    conn.close()
    print("done", flush=True)
""")


def test_a_client_whose_first_connections_are_cut_in_their_handshakes_connects(remote):
    """A cut handshake fails without detail, as one refused by a server that does not hold
    the key the client expects: a few in a row are not taken for that refusal."""
    remote.forwarder.cut_next(3)
    result = subprocess.run([sys.executable, "-c", BRIEF_CLIENT,
                             remote.through(remote.forwarder)], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=vgpu_environment(**remote.env()))
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert remote.forwarder.accepted == 4
    assert remote.sessions() == []


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


def test_the_sessions_of_remote_clients_that_vanish_are_freed_within_seconds(remote):
    closing = remote.forwarder
    # One client's host dies with its connection closed (its kernel says so); the other's
    # path goes silent (a host switched off): zmq's heartbeats find that out.
    silent = TcpForwarder(closing.target)
    clients = [subprocess.Popen([sys.executable, "-c", REMOTE_CLIENT, remote.through(forwarder)],
                                stdout=subprocess.PIPE, text=True,
                                env=vgpu_environment(**remote.env()))
               for forwarder in (closing, silent)]
    try:
        for client in clients:
            assert client.stdout.readline() == "ready\n"
        assert len(remote.sessions()) == 2
        silent.silence()
        for client in clients:
            client.kill()
            client.wait()
        remote.sessions_end(within_s=20)  # heartbeat timeout + grace, with room to spare
    finally:
        for client in clients:
            client.kill()
            client.wait()
            client.stdout.close()
        silent.close()
