"""Several clients on one server: the aggregate launch rate of N concurrent clients against
one client's, on the same server, in the same run.

    python benchmarks/bench_sessions.py [N]     # N clients (default 8); figures go to BENCHMARKS.md

Each client is bench_transport.c's driver-API program queueing empty launches (no round
trips but its final synchronization). Rounds alternate one client and N clients on one emu
server; the aggregate rate is all clients' launches over the time from the first client's
first launch to the last client's synchronization after its last. On a machine with fewer
cores than N + 1 processes, the clients and the server share the cores: the figure then
says how much of one client's rate the server keeps when it serves N at once.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from toolkit import find_toolkit  # noqa: E402

LAUNCHES = 50000
ROUNDS = 5


def launch_clients(program: Path, address: str, clients: int) -> float:
    """Launches per second over all `clients` started at once: all their launches over the
    time from the first one's first launch to the last one's synchronization after its
    last (each program reports both on the machine's monotonic clock), so that starting
    the processes does not count."""
    command = [sys.executable, "-m", "vgpu.cli", "run", "--server", address, "--",
               str(program), "1", str(LAUNCHES), "1"]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    spans = []
    for proc in procs:
        figures = dict(line.split() for line in proc.communicate()[0].splitlines())
        if proc.returncode != 0:
            raise SystemExit(f"a client failed with status {proc.returncode}")
        spans.append((float(figures["launches_started_s"]), float(figures["launches_done_s"])))
    return clients * LAUNCHES / (max(end for _, end in spans) - min(s for s, _ in spans))


def main() -> None:
    clients = int(sys.argv[1]) if sys.argv[1:] else 8
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        program = find_toolkit(work / "build").c_program((HERE / "bench_transport.c").read_text())
        address = f"ipc://{work}/vgpu.sock"
        server = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "server", "--listen",
                                   address, "--backend", "emu"], stdout=subprocess.PIPE, text=True)
        try:
            server.stdout.readline()
            one, many = [], []
            for _ in range(ROUNDS):
                one.append(launch_clients(program, address, 1))
                many.append(launch_clients(program, address, clients))
        finally:
            server.terminate()
            server.wait()
    print(f"{os.cpu_count()} cores; queued empty launches end to end, median of {ROUNDS} "
          "alternating rounds:")
    single, aggregate = statistics.median(one), statistics.median(many)
    print(f"  1 client:  {single:9.0f}/s (rounds {min(one):.0f}-{max(one):.0f})")
    print(f"  {clients} clients: {aggregate:9.0f}/s aggregate (rounds {min(many):.0f}-"
          f"{max(many):.0f}); ratio {aggregate / single:.2f}")


if __name__ == "__main__":
    main()
