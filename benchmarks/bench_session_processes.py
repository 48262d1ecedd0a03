"""What a session in a device process of its own costs (`vgpu server --session-processes`),
against the same session in the server's process, on the same machine in the same run.

    python benchmarks/bench_session_processes.py [--rounds N]   # figures go to BENCHMARKS.md

Two emu servers, one of each kind; rounds alternate between them. Each round runs
bench_transport.c's driver-API program (synchronizations, memory-info queries, queued empty
launches, 64 MiB copies pageable and pinned) and times a short program from its start to its
exit (session opened and closed: what a device process adds to a program's start). On the
emulator a device process adds its hop to every backend call a session makes; a GPU's
backend pays the same hop, which these ratios bound from above (the emulator's own work per
call is smaller than a GPU driver's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from toolkit import find_toolkit  # noqa: E402

FIGURES = {  # bench_transport.c's name -> (what it is, whether more is better)
    "idle_sync_s": ("synchronize, idle (round trip)", False),
    "query_round_trip_s": ("cuMemGetInfo (round trip)", False),
    "launch_rate_end_to_end_per_s": ("empty launches, end to end /s", True),
    "htod_bytes_per_s": ("HtoD 64 MiB pageable B/s", True),
    "dtoh_bytes_per_s": ("DtoH 64 MiB pageable B/s", True),
    "htod_pinned_bytes_per_s": ("HtoD 64 MiB pinned B/s", True),
    "dtoh_pinned_bytes_per_s": ("DtoH 64 MiB pinned B/s", True),
}


def run_program(program: Path, address: str, *args: str) -> tuple[dict[str, float], float]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vgpu.cli", "run", "--server", address,
                             "--", str(program), *args], capture_output=True, text=True,
                            check=True)
    wall = time.perf_counter() - start
    return {name: float(value) for name, value in
            (line.split() for line in result.stdout.splitlines())}, wall


def start_server(address: str, *options: str) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen", address,
                               "--backend", "emu", *options], stdout=subprocess.PIPE, text=True)
    server.stdout.readline()
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        program = find_toolkit(work / "build").c_program((HERE / "bench_transport.c").read_text())
        addresses = {"own": f"ipc://{work}/own.sock", "shared": f"ipc://{work}/shared.sock"}
        servers = [start_server(addresses["own"], "--session-processes"),
                   start_server(addresses["shared"], "--no-session-processes")]
        figures = {kind: {name: [] for name in [*FIGURES, "start_s"]} for kind in addresses}
        try:
            for _ in range(rounds):
                for kind, address in addresses.items():
                    measured, _ = run_program(program, address, "2000", "20000", "64")
                    for name in FIGURES:
                        figures[kind][name].append(measured[name])
                    _, wall = run_program(program, address, "1", "1", "1")
                    figures[kind]["start_s"].append(wall)
        finally:
            for server in servers:
                server.terminate()
                server.wait()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; median of {rounds} "
          "alternating rounds (range); ratio: in a device process against in the server's, "
          ">1 is slower")
    rows = {**FIGURES, "start_s": ("a short program, start to exit", False)}
    for name, (label, more_is_better) in rows.items():
        own, shared = (statistics.median(figures[k][name]) for k in ("own", "shared"))
        ratio = shared / own if more_is_better else own / shared
        print(f"  {label:36} own process {_show(own, name)} "
              f"({_show(min(figures['own'][name]), name)}-{_show(max(figures['own'][name]), name)})"
              f"  server's {_show(shared, name)}  ratio {ratio:.2f}")


def _show(value: float, name: str) -> str:
    if name.endswith("bytes_per_s"):
        return f"{value / 1e9:.2f} GB/s"
    if name.endswith("_per_s"):
        return f"{value:,.0f}"
    return f"{value * 1e6:,.0f} us" if value < 0.1 else f"{value:.3f} s"


if __name__ == "__main__":
    main()
