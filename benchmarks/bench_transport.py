"""Transport benchmarks: vgpu against raw pyzmq and in-process copies, same run.

    python benchmarks/bench_transport.py            # prints a table; figures go to BENCHMARKS.md

Figures, each a ratio against a baseline measured in this run (medians of alternating rounds):
- an idle cuCtxSynchronize (nothing outstanding: answered without a round trip) and the
  round trip of a call that must fetch data (cuMemGetInfo), vs a raw pyzmq DEALER/ROUTER
  round trip (<= 1.25x)
- queued empty-kernel launches per second, client side and end to end, vs raw pipelined
  pyzmq messages per second (>= 1.0x)
- 64 MiB HtoD/DtoH (pageable and pinned) vs an in-process numpy copy (>= 0.7x)
- resident memory the shim adds to a C program; resident memory of an idle server
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from toolkit import find_toolkit  # noqa: E402

SYNCS, LAUNCHES, MIB = 2000, 20000, 64
ROUNDS = 5  # baseline and vgpu alternate; each figure is the median of its rounds


def _echo_server(address: str) -> subprocess.Popen:
    code = (
        "import zmq, sys\n"
        "s = zmq.Context().socket(zmq.ROUTER); s.bind(sys.argv[1]); print('up', flush=True)\n"
        "while True:\n"
        "    f = s.recv_multipart()\n"
        "    if f[1] == b'stop': break\n"
        "    if f[1] != b'no-reply': s.send_multipart(f)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, address], stdout=subprocess.PIPE)
    proc.stdout.readline()
    return proc


def raw_zmq(address: str) -> dict[str, float]:
    """Baselines: pyzmq round trip, and pipelined one-way messages per second."""
    server = _echo_server(address)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    for _ in range(100):
        sock.send(b"x")
        sock.recv()
    t = time.perf_counter()
    for _ in range(SYNCS):
        sock.send(b"x")
        sock.recv()
    rtt = (time.perf_counter() - t) / SYNCS
    payload = b"l" * 64  # about the size of one queued launch
    t = time.perf_counter()
    for _ in range(LAUNCHES):
        sock.send_multipart([b"no-reply", payload])
    sock.send(b"x")
    sock.recv()
    rate = LAUNCHES / (time.perf_counter() - t)
    sock.send(b"stop")
    server.wait()
    sock.close()
    return {"rtt_s": rtt, "pipelined_msgs_per_s": rate}


def numpy_copy_rate() -> float:
    src = np.full(MIB << 20, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = time.perf_counter()
    for _ in range(5):
        np.copyto(dst, src)
    return 5 * src.nbytes / (time.perf_counter() - t)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def vgpu_figures(work: Path, spin_us: str | None = None) -> dict[str, float]:
    toolkit = find_toolkit(work / "build")
    program = toolkit.c_program((HERE / "bench_transport.c").read_text())
    address = f"ipc://{work}/vgpu.sock"
    server = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen", address,
                               "--backend", "emu"], stdout=subprocess.PIPE, text=True)
    server.stdout.readline()
    time.sleep(0.5)
    idle_rss = rss_kib(server.pid)
    env = dict(os.environ)
    if spin_us is not None:
        env["VGPU_SPIN_US"] = spin_us
    out = subprocess.run([sys.executable, "-m", "vgpu.cli", "run", "--server", address, "--",
                          str(program), str(SYNCS), str(LAUNCHES), str(MIB)],
                         capture_output=True, text=True, check=True, env=env).stdout
    server.terminate()
    server.wait()
    figures = {k: float(v) for k, v in (line.split() for line in out.splitlines())}
    figures["server_idle_rss_kib"] = idle_rss
    return figures


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def main() -> None:
    raws, copies, vgpus, blocking = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(ROUNDS):
            raws.append(raw_zmq(f"ipc://{work}/raw.sock"))
            copies.append(numpy_copy_rate())
            vgpus.append(vgpu_figures(work))
            blocking.append(vgpu_figures(work, spin_us="0"))
    raw, v, b = _median_of(raws), _median_of(vgpus), _median_of(blocking)
    copy = statistics.median(copies)
    gb = 1e9
    rows = [
        ("idle cuCtxSynchronize", f"{v['idle_sync_s'] * 1e6:.2f} us",
         f"raw pyzmq RTT {raw['rtt_s'] * 1e6:.1f} us", v["idle_sync_s"] / raw["rtt_s"],
         "<= 1.25x"),
        ("cuMemGetInfo round trip", f"{v['query_round_trip_s'] * 1e6:.1f} us",
         f"raw pyzmq RTT {raw['rtt_s'] * 1e6:.1f} us", v["query_round_trip_s"] / raw["rtt_s"],
         "<= 1.25x"),
        ("  the same, VGPU_SPIN_US=0 (no polling)", f"{b['query_round_trip_s'] * 1e6:.1f} us",
         f"raw pyzmq RTT {raw['rtt_s'] * 1e6:.1f} us", b["query_round_trip_s"] / raw["rtt_s"],
         ""),
        ("queued empty launches, client side", f"{v['launch_rate_client_per_s']:.0f}/s",
         f"raw pipelined {raw['pipelined_msgs_per_s']:.0f} msg/s",
         v["launch_rate_client_per_s"] / raw["pipelined_msgs_per_s"], ">= 1.0x"),
        ("queued empty launches, end to end", f"{v['launch_rate_end_to_end_per_s']:.0f}/s",
         f"raw pipelined {raw['pipelined_msgs_per_s']:.0f} msg/s",
         v["launch_rate_end_to_end_per_s"] / raw["pipelined_msgs_per_s"], ">= 1.0x"),
    ]
    for key, label in (("htod_bytes_per_s", "HtoD 64 MiB pageable"),
                       ("dtoh_bytes_per_s", "DtoH 64 MiB pageable"),
                       ("htod_pinned_bytes_per_s", "HtoD 64 MiB pinned"),
                       ("dtoh_pinned_bytes_per_s", "DtoH 64 MiB pinned")):
        rows.append((label, f"{v[key] / gb:.2f} GB/s", f"numpy copy {copy / gb:.2f} GB/s",
                     v[key] / copy, ">= 0.7x"))
    added = v["rss_after_init_kib"] - v["rss_before_init_kib"]
    print(f"{'figure':40} {'vgpu':>14}  {'baseline':32} {'ratio':>7}  target")
    for name, value, base, ratio, target in rows:
        print(f"{name:40} {value:>14}  {base:32} {ratio:7.2f}  {target}")
    print(f"{'RSS the shim adds to a C program':40} {added / 1024:>11.1f} MiB  "
          f"(before cuInit {v['rss_before_init_kib'] / 1024:.1f} MiB)")
    print(f"{'RSS of an idle server':40} {v['server_idle_rss_kib'] / 1024:>11.1f} MiB")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
