"""Remote benchmarks: a client without shared memory (as on another host) against a vgpu
server over TCP, each figure against raw pyzmq on the same path in the same run.

    python benchmarks/bench_remote.py                     # CurveZMQ (the default) on loopback
    python benchmarks/bench_remote.py --transport plain --rounds 9   # --insecure

Figures (medians of alternating rounds, their range, and the ratio of each side's best round):
- 64 MiB HtoD and DtoH through vgpu (streamed in chunks) vs one 64 MiB pyzmq message each way
  to a ROUTER that acknowledges it or answers with it (target >= 0.8x)
- the round trip of a synchronizing call vs a raw pyzmq DEALER/ROUTER round trip (<= 1.25x),
  measured twice: within each round as the copies are, and in BLOCKS alternating blocks of
  BLOCK round trips each over connections held open on both sides (on a machine whose load
  changes from second to second, blocks a fraction of a second apart meet the same load,
  rounds seconds apart may not); and, in the rounds, the CPU time a round trip costs the
  server's and the client's processes together (all threads), which stays comparable on a
  loaded machine where wall-clock time does not, and the CPU time of the calling thread
  alone (what the client's own code costs, measured without the clock ticks' coarseness)

The transport is a parameter: TRANSPORTS names how the server is started and how a raw
socket is set up for each: plain TCP (`--insecure` on both ends) and CurveZMQ, vgpu's
default, whose raw baseline encrypts the same way.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import zmq

from vgpu.client import Connection

MIB = 1 << 20
COPY_BYTES = 64 * MIB
SYNCS = 5000  # (CPU times come in 10 ms ticks: 2 us a round trip)
CONTEXT = 0x7667_0100_0000_0001
BLOCK = 100
BLOCKS = 60


def _plain(sock: zmq.Socket, server: bool) -> None:
    """Plain TCP: nothing to set up."""


def _curve(sock: zmq.Socket, server: bool) -> None:
    """CurveZMQ with the raw baseline's own key pairs (in BENCH_CURVE_KEYS, so that its
    server process has them too): the same encryption as vgpu's, no ZAP check."""
    server_public, server_secret, client_public, client_secret = (
        key.encode() for key in os.environ["BENCH_CURVE_KEYS"].split())
    if server:
        sock.curve_server = True
        sock.curve_secretkey = server_secret
    else:
        sock.curve_serverkey = server_public
        sock.curve_publickey = client_public
        sock.curve_secretkey = client_secret


# name -> (options for `vgpu server`, setup of a raw socket: fn(socket, is_server))
TRANSPORTS: dict[str, tuple[list[str], Callable[[zmq.Socket, bool], None]]] = {
    "plain": (["--insecure"], _plain),
    "curve": ([], _curve),
}


def _keys(transport: str, work: str) -> dict[str, str]:
    """Set the transport up as a user does (`vgpu keygen` for a server and a client, the
    client's key authorized) and for the raw baseline; the server's environment."""
    if transport == "plain":
        os.environ["VGPU_INSECURE"] = "1"
        return dict(os.environ)
    server_home, client_home = os.path.join(work, "server"), os.path.join(work, "client")
    for home, options in ((server_home, ["--server"]), (client_home, [])):
        subprocess.run([sys.executable, "-m", "vgpu.cli", "keygen", "--dir", home, *options],
                       check=True, capture_output=True)
    os.makedirs(os.path.join(server_home, "authorized-keys"))
    with open(os.path.join(client_home, "client.pub")) as public, \
            open(os.path.join(server_home, "authorized-keys", "bench.key"), "w") as entry:
        entry.write(public.read())
    os.environ["VGPU_HOME"] = client_home
    os.environ["BENCH_CURVE_KEYS"] = " ".join(
        key.decode() for pair in (zmq.curve_keypair(), zmq.curve_keypair()) for key in pair)
    return {**os.environ, "VGPU_HOME": server_home}


# The raw baseline's server: acknowledges a message with one byte, or answers "read" with
# COPY_BYTES held ready (as the vgpu server holds device memory), or echoes.
RAW_SERVER = """
import sys, zmq
from bench_remote import TRANSPORTS
size = int(sys.argv[3])
data = bytes(size)
s = zmq.Context().socket(zmq.ROUTER)
TRANSPORTS[sys.argv[2]][1](s, True)
s.bind(sys.argv[1])
print("up", flush=True)
while True:
    f = s.recv_multipart(copy=False)
    kind = f[1].bytes
    if kind == b"stop":
        break
    if kind == b"read":
        s.send_multipart([f[0], data], copy=False)
    elif kind == b"write":
        s.send_multipart([f[0], b"k"])
    else:
        s.send_multipart(f)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has used, all its threads (zmq's I/O threads too)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _seconds_each(round_trip: Callable[[], object],
                  server_pid: int) -> tuple[float, float, float]:
    """The time one of SYNCS round trips takes, after 100 to warm up, the CPU time it
    costs both processes together (the server's and this one): on a loaded machine, where
    wall-clock time is mostly waiting for a core, the CPU is what stays comparable; and the
    CPU time of this thread, which makes the calls."""
    for _ in range(100):
        round_trip()
    cpu = _cpu_s(server_pid) + _cpu_s(os.getpid())
    thread = time.thread_time()
    t = time.perf_counter()
    for _ in range(SYNCS):
        round_trip()
    wall = (time.perf_counter() - t) / SYNCS
    return (wall, (_cpu_s(server_pid) + _cpu_s(os.getpid()) - cpu) / SYNCS,
            (time.thread_time() - thread) / SYNCS)


def _raw_server(transport: str, size: int) -> tuple[subprocess.Popen, zmq.Context, zmq.Socket]:
    """The raw baseline's server holding `size` bytes to answer reads with, and a socket
    connected to it; round_trip(socket) is one raw round trip."""
    address = f"tcp://127.0.0.1:{_port()}"
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", RAW_SERVER, address, transport,
                             str(size)], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": here})
    proc.stdout.readline()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    TRANSPORTS[transport][1](sock, False)
    sock.connect(address)
    return proc, context, sock


def _stop_raw_server(proc: subprocess.Popen, context: zmq.Context, sock: zmq.Socket) -> None:
    sock.send(b"stop")
    proc.wait()
    sock.close(0)
    context.term()


def round_trip(sock: zmq.Socket) -> None:
    sock.send(b"x")
    sock.recv()


def raw_round(transport: str) -> dict[str, float]:
    proc, context, sock = _raw_server(transport, COPY_BYTES)
    rtt, rtt_cpu, rtt_thread = _seconds_each(lambda: round_trip(sock), proc.pid)
    payload = os.urandom(COPY_BYTES)
    sock.send_multipart([b"write", payload], copy=False)  # once untimed, as vgpu's
    sock.recv()
    sock.send(b"read")
    sock.recv()
    t = time.perf_counter()
    sock.send_multipart([b"write", payload], copy=False)
    sock.recv()
    htod = COPY_BYTES / (time.perf_counter() - t)
    t = time.perf_counter()
    sock.send(b"read")
    sock.recv()
    dtoh = COPY_BYTES / (time.perf_counter() - t)
    _stop_raw_server(proc, context, sock)
    return {"rtt_s": rtt, "rtt_cpu_s": rtt_cpu, "rtt_thread_s": rtt_thread,
            "htod_bytes_per_s": htod, "dtoh_bytes_per_s": dtoh}


def interleaved_round_trips(transport: str, address: str) -> tuple[list[float], list[float]]:
    """Seconds per round trip of raw pyzmq and of vgpu, in BLOCKS alternating blocks of
    BLOCK round trips each (which side goes first alternates too)."""
    proc, context, sock = _raw_server(transport, 1)
    conn = Connection(address)
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    sides = (lambda: round_trip(sock), lambda: conn.call("vgpuSynchronize"))
    times: tuple[list[float], list[float]] = ([], [])
    for side in sides:  # warm up
        for _ in range(BLOCK):
            side()
    for block in range(BLOCKS):
        for i in ((0, 1) if block % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            for _ in range(BLOCK):
                sides[i]()
            times[i].append((time.perf_counter() - t) / BLOCK)
    conn.close()
    _stop_raw_server(proc, context, sock)
    return times


def vgpu_round(address: str, server_pid: int) -> dict[str, float]:
    conn = Connection(address)
    assert conn.ring is None, "the client shares memory with the server"
    conn.post("cuDevicePrimaryCtxRetain", CONTEXT, 0)
    device, _ = conn.call("cuMemAlloc", CONTEXT, COPY_BYTES)
    rtt, rtt_cpu, rtt_thread = _seconds_each(lambda: conn.call("vgpuSynchronize"),
                                             server_pid)
    host = (ctypes.c_char * COPY_BYTES).from_buffer_copy(os.urandom(COPY_BYTES))
    back = (ctypes.c_char * COPY_BYTES)()
    # Once untimed: the first copies touch fresh pages (the device memory's, the buffer's).
    conn.write_device("cuMemcpyHtoD", device, ctypes.addressof(back), COPY_BYTES)
    conn.read_device("cuMemcpyDtoH", device, ctypes.addressof(back), COPY_BYTES)
    t = time.perf_counter()
    conn.write_device("cuMemcpyHtoD", device, ctypes.addressof(host), COPY_BYTES)
    conn.synchronize()
    htod = COPY_BYTES / (time.perf_counter() - t)
    t = time.perf_counter()
    conn.read_device("cuMemcpyDtoH", device, ctypes.addressof(back), COPY_BYTES)
    dtoh = COPY_BYTES / (time.perf_counter() - t)
    assert bytes(back) == bytes(host)
    conn.call("cuMemFree", device)
    conn.close()
    return {"rtt_s": rtt, "rtt_cpu_s": rtt_cpu, "rtt_thread_s": rtt_thread,
            "htod_bytes_per_s": htod, "dtoh_bytes_per_s": dtoh}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", default="curve", choices=sorted(TRANSPORTS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp()
    server_env = _keys(args.transport, work)
    server = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen",
                               f"tcp://127.0.0.1:{_port()}", "--backend", "emu",
                               *TRANSPORTS[args.transport][0]],
                              stdout=subprocess.PIPE, text=True, env=server_env)
    try:
        address = server.stdout.readline().split()[4]  # with the server's key, if any
        raws, vgpus = [], []
        for _ in range(args.rounds):
            raws.append(raw_round(args.transport))
            vgpus.append(vgpu_round(address, server.pid))
        raw_blocks, vgpu_blocks = interleaved_round_trips(args.transport, address)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work)
    print(f"transport {args.transport}, loopback TCP, {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.2f}")
    for key, label, higher in (("htod_bytes_per_s", "HtoD 64 MiB", True),
                               ("dtoh_bytes_per_s", "DtoH 64 MiB", True),
                               ("rtt_s", "synchronizing round trip", False),
                               ("rtt_cpu_s", "its CPU, both processes", False),
                               ("rtt_thread_s", "its CPU, calling thread", False)):
        ratios = [v[key] / r[key] for v, r in zip(vgpus, raws, strict=True)]
        mine = statistics.median(v[key] for v in vgpus)
        raw = statistics.median(r[key] for r in raws)
        best = max if higher else min  # each side's best round: the least disturbed by others
        unit = (lambda x: f"{x / 1e9:.2f} GB/s") if higher else (lambda x: f"{x * 1e6:.0f} us")
        print(f"{label:26} vgpu {unit(mine):>10}  raw pyzmq {unit(raw):>10}  ratio "
              f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}; "
              f"of the best rounds "
              f"{best(v[key] for v in vgpus) / best(r[key] for r in raws):.2f})")

    ratios = [v / r for v, r in zip(vgpu_blocks, raw_blocks, strict=True)]
    print(f"{'the same, in blocks':26} vgpu {statistics.median(vgpu_blocks) * 1e6:7.0f} us  "
          f"raw pyzmq {statistics.median(raw_blocks) * 1e6:7.0f} us  ratio "
          f"{statistics.median(ratios):.2f} (quartiles {_quartiles(ratios)}; of the best "
          f"blocks {min(vgpu_blocks) / min(raw_blocks):.2f}; {BLOCKS} blocks of {BLOCK})")


def _quartiles(values: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.2f}-{q3:.2f}"


if __name__ == "__main__":
    main()
