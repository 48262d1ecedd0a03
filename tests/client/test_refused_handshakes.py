"""A client whose tcp handshake is refused gives up with a message that says why, whatever
order the refusal and the drops before it come in: never a hang. The peer here is a raw tcp
listener that plays each connection as scripted (cut at once, or greet as a ZMTP peer of
the other security mechanism and wait). Clients run in a process of their own, under a
generous timeout that only guards against a hang."""

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
from vgpu_processes import keygen, vgpu_environment

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


def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 server's greeting: signature, version, mechanism, as-server, filler."""
    return b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\0") \
        + b"\x01" + bytes(31)


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
                conn.sendall(_greeting(play.upper().encode()))
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
