"""Transport benchmarks: vgpu against raw pyzmq and in-process copies, same run.

    python benchmarks/bench_transport.py            # prints a table; figures go to BENCHMARKS.md
    python benchmarks/bench_transport.py --copies   # only the 64 MiB copies, more rounds
    python benchmarks/bench_transport.py --record   # end-to-end launches, recording off vs on

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


def vgpu_figures(work: Path, spin_us: str | None = None, syncs: int = SYNCS,
                 launches: int = LAUNCHES, mib: int = MIB,
                 server_options: tuple[str, ...] = ()) -> dict[str, float]:
    toolkit = find_toolkit(work / "build")
    program = toolkit.c_program((HERE / "bench_transport.c").read_text())
    address = f"ipc://{work}/vgpu.sock"
    server = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen", address,
                               "--backend", "emu", *server_options], stdout=subprocess.PIPE,
                              text=True)
    server.stdout.readline()
    time.sleep(0.5)
    idle_rss = rss_kib(server.pid)
    env = dict(os.environ)
    if spin_us is not None:
        env["VGPU_SPIN_US"] = spin_us
    out = subprocess.run([sys.executable, "-m", "vgpu.cli", "run", "--server", address, "--",
                          str(program), str(syncs), str(launches), str(mib)],
                         capture_output=True, text=True, check=True, env=env).stdout
    server.terminate()
    server.wait()
    figures = {k: float(v) for k, v in (line.split() for line in out.splitlines())}
    figures["server_idle_rss_kib"] = idle_rss
    return figures


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


COPY_FIGURES = (("htod_bytes_per_s", "HtoD 64 MiB pageable"),
                ("dtoh_bytes_per_s", "DtoH 64 MiB pageable"),
                ("htod_pinned_bytes_per_s", "HtoD 64 MiB pinned"),
                ("dtoh_pinned_bytes_per_s", "DtoH 64 MiB pinned"))
COPY_ROUNDS = 9


def copies_only() -> None:
    """The copy figures alone, each round's vgpu copies between two numpy baselines (this
    machine's load changes by the second): the median ratio and the range over rounds."""
    ratios: dict[str, list[float]] = {key: [] for key, _ in COPY_FIGURES}
    rates: dict[str, list[float]] = {key: [] for key, _ in COPY_FIGURES}
    baselines = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(COPY_ROUNDS):
            before = numpy_copy_rate()
            v = vgpu_figures(Path(tmp), syncs=1, launches=1)
            baseline = (before + numpy_copy_rate()) / 2
            baselines.append(baseline)
            for key, _ in COPY_FIGURES:
                rates[key].append(v[key])
                ratios[key].append(v[key] / baseline)
    gb = 1e9
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; numpy copy "
          f"{statistics.median(baselines) / gb:.2f} GB/s (range {min(baselines) / gb:.2f}-"
          f"{max(baselines) / gb:.2f})")
    for key, label in COPY_FIGURES:
        print(f"{label:24} {statistics.median(rates[key]) / gb:6.2f} GB/s  ratio "
              f"{statistics.median(ratios[key]):.2f} (rounds {min(ratios[key]):.2f}-"
              f"{max(ratios[key]):.2f})")


RECORD_ROUNDS = 11


def record_overhead() -> None:
    """End-to-end queued launches per second on a server that records sessions (into a
    fresh trace each round) and on one that does not, alternating rounds. This machine's
    rate jumps between levels from one run to the next (other work, which core each process
    lands on), so besides the medians: the best round of each, which is the least disturbed."""
    off, on = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(RECORD_ROUNDS):
            off.append(vgpu_figures(work, syncs=100, mib=1)["launch_rate_end_to_end_per_s"])
            on.append(vgpu_figures(work, syncs=100, mib=1, server_options=(
                "--record", str(work / f"trace-{i}")))["launch_rate_end_to_end_per_s"])
    print(f"queued empty launches end to end, {RECORD_ROUNDS} alternating rounds: recording "
          f"off median {statistics.median(off):.0f}/s, best {max(off):.0f}/s; on median "
          f"{statistics.median(on):.0f}/s, best {max(on):.0f}/s; ratio of medians "
          f"{statistics.median(on) / statistics.median(off):.2f}, of bests "
          f"{max(on) / max(off):.2f}")


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
    for key, label in COPY_FIGURES:
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
    {"--copies": copies_only, "--record": record_overhead}.get(sys.argv[1] if sys.argv[1:]
                                                               else "", main)()
