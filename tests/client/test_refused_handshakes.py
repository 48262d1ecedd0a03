"""A client whose tcp handshake is refused gives up with a message that says why, whatever
order the refusal and the drops before it come in, and whether it was opening its session
or had one open: never a hang. The peer here is a raw tcp listener that plays each
connection as scripted (cut at once, or greet as a ZMTP peer of the other security
mechanism and wait), or an emu server behind a forwarder that starts greeting so. Clients
run in a process of their own, under a generous timeout that only guards against a hang."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zmq
from vgpu_processes import (
    TcpForwarder,
    curve_homes,
    free_tcp_address,
    keygen,
    start_emu_server,
    stop_server,
    vgpu_environment,
    zmtp_greeting,
)

from vgpu.errors import CUDA_ERROR_DEVICE_UNAVAILABLE
from vgpu.transport import TransportError, connect, send_within

HANG_GUARD_S = 60  # a refusal takes well under a second; only a hang gets near this
ATTEMPTS = 5  # how the refusal and a hello said again meet is up to the scheduler: try a few
ANY_KEY = zmq.curve_keypair()[0].decode()  # a server key no peer here holds
# Connects to each address given in turn, and prints how each attempt ended.
CLIENT = textwrap.dedent("""
    import sys
    from vgpu.client import Connection
    from vgpu.errors import DeviceUnavailable
    for address in sys.argv[1:]:
        try:
            Connection(address)
        except DeviceUnavailable as exc:
            print("unavailable:", exc, flush=True)
        else:
            print("connected", flush=True)
""")


class ScriptedPeer:
    """A tcp listener on loopback that plays its n-th connection as `plays[n]` (the last one
    for every later connection): "cut" closes it at once, before any greeting (the client's
    handshake fails without detail, and its connection drops); "curve" or "null" greets as a
    ZMTP server of that mechanism and then holds the connection open, so that the client is
    the one to find the mismatch: a protocol error, after which libzmq gives the connection
    up for good."""

    def __init__(self, plays: list[str]):
        self.plays = plays
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            play = self.plays[min(self.accepted, len(self.plays) - 1)]
            self.accepted += 1
            if play == "cut":
                conn.close()
                continue
            with contextlib.suppress(OSError):
                conn.sendall(zmtp_greeting(play.upper()))
            self._held.append(conn)

    def close(self) -> None:
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def peers():
    """make(n, *plays): n ScriptedPeers that play `plays`."""
    made: list[ScriptedPeer] = []

    def make(n: int, *plays: str) -> list[ScriptedPeer]:
        made.extend(ScriptedPeer(list(plays)) for _ in range(n))
        return made[-n:]

    yield make
    for peer in made:
        peer.close()


@pytest.fixture(scope="module")
def client_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("client-home")
    keygen(home)
    return home


def _attempts(addresses: list[str], home, **env: str) -> list[str]:
    """How a client's attempts to connect to each of `addresses` ended, a line each."""
    result = subprocess.run([sys.executable, "-c", CLIENT, *addresses], capture_output=True,
                            text=True, timeout=HANG_GUARD_S,
                            env=vgpu_environment(VGPU_HOME=str(home), **env))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(addresses), result.stdout + result.stderr
    return lines


@pytest.mark.parametrize("plays", [["curve"], ["cut", "curve"]],
                         ids=["refused", "cut-then-refused"])
def test_a_plain_client_refused_by_a_curvezmq_peer_says_encryption_is_required(
        peers, client_home, plays):
    # After a cut the client says hello again, and the refusal that ends its new connection
    # may come first, which leaves libzmq nothing to send that hello on.
    listeners = peers(ATTEMPTS, *plays)
    for outcome in _attempts([p.address for p in listeners], client_home, VGPU_INSECURE="1"):
        assert outcome.startswith("unavailable:"), outcome
        assert "requires encryption (CurveZMQ)" in outcome, outcome
    assert all(p.accepted == len(plays) for p in listeners)


@pytest.mark.parametrize("plays", [["null"], ["cut", "null"]], ids=["refused", "cut-then-refused"])
def test_an_encrypting_client_refused_by_a_plain_peer_says_it_expects_plain_tcp(
        peers, client_home, plays):
    listeners = peers(ATTEMPTS, *plays)
    addresses = [f"{p.address}#serverkey={ANY_KEY}" for p in listeners]
    for outcome in _attempts(addresses, client_home):
        assert outcome.startswith("unavailable:"), outcome
        assert "expects plain tcp, not encryption" in outcome, outcome


def test_a_peer_that_cuts_every_connection_is_given_up_on(peers, client_home):
    """Drops alone, handshake after handshake: the client does not retry for ever."""
    [listener] = peers(1, "cut")
    [outcome] = _attempts([f"{listener.address}#serverkey={ANY_KEY}"], client_home)
    assert outcome.startswith("unavailable:"), outcome
    assert "does not hold the key this client expects" in outcome, outcome
    assert listener.accepted >= 2


def test_a_send_on_a_connection_refused_for_good_raises_the_refusal(peers, monkeypatch):
    monkeypatch.setenv("VGPU_INSECURE", "1")
    [listener] = peers(1, "curve")
    context = zmq.Context()
    sock, watch = connect(context, zmq.DEALER, listener.address, watch=True, drops=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        # Once libzmq has torn the refused connection down, the socket takes nothing (a
        # blocking send would wait for ever); until then what it takes is lost.
        while True:
            assert time.monotonic() < deadline, "the refused socket still takes messages"
            try:
                sock.send(b"lost", zmq.NOBLOCK)
            except zmq.Again:
                break
            sock.poll(10)
        with pytest.raises(TransportError, match=r"requires encryption \(CurveZMQ\)"):
            send_within(sock, watch, [b"hello"], HANG_GUARD_S)
    finally:
        watch.close()
        sock.close(linger=0)
        context.term()


# Opens a session and allocates; once told (a line on stdin) that its connection was cut,
# waits for the socket to take nothing (libzmq gave the refused reconnection up), then
# allocates again and prints how that ended.
CALL_AFTER_REFUSAL = textwrap.dedent("""
    import sys, time
    import zmq
    from vgpu.client import Connection
    from vgpu.errors import CudaError
    CTX = 0x7667_0100_0000_0001
    conn = Connection(sys.argv[1])
    conn.post("cuDevicePrimaryCtxRetain", CTX, 0)
    conn.call("cuMemAlloc", CTX, 1 << 20)
    print("open", flush=True)
    sys.stdin.readline()
    while conn._socket.poll(0, zmq.POLLOUT):
        time.sleep(0.01)
    print("refused", flush=True)
    try:
        conn.call("cuMemAlloc", CTX, 1 << 20)
        print("allocated", flush=True)
    except CudaError as exc:
        print("error", exc.code, exc, flush=True)
""")


@pytest.mark.parametrize("insecure", [False, True], ids=["curve-then-plain", "plain-then-curve"])
def test_an_open_session_whose_reconnection_is_refused_fails_its_next_call(tmp_path, insecure):
    """The connection of a session drops and zmq's own reconnect meets a server of the other
    security mechanism (restarted with or without --insecure): libzmq gives the connection
    up for good, and the socket takes no message, ever. The next call fails and says why."""
    server_home, client_home = curve_homes(tmp_path)
    server = start_emu_server(free_tcp_address(), *(["--insecure"] if insecure else []),
                              env=vgpu_environment(VGPU_HOME=str(server_home)))
    where, _, fragment = server.endpoint.partition("#")
    forwarder = TcpForwarder(("127.0.0.1", int(where.rsplit(":", 1)[1])))
    client_env = {"VGPU_INSECURE": "1"} if insecure else {}
    client = subprocess.Popen([sys.executable, "-c", CALL_AFTER_REFUSAL,
                               forwarder.address + (f"#{fragment}" if fragment else "")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=vgpu_environment(VGPU_HOME=str(client_home), **client_env))
    try:
        assert client.stdout.readline() == "open\n", client.stderr.read()
        forwarder.greet_as("CURVE" if insecure else "NULL")
        forwarder.drop()
        out, err = client.communicate("cut\n", timeout=HANG_GUARD_S)
        assert client.returncode == 0, err
        refused, outcome = out.splitlines()
        assert refused == "refused", out
        assert outcome.startswith(f"error {CUDA_ERROR_DEVICE_UNAVAILABLE} "), out
        reason = ("requires encryption (CurveZMQ)" if insecure
                  else "expects plain tcp, not encryption")
        assert f"refused this client's handshake when it connected again: the server at " \
               f"{forwarder.address}" in outcome, outcome
        assert reason in outcome, outcome
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
        forwarder.close()
        stop_server(server)
