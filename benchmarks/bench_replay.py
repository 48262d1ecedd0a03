"""Replay benchmarks: what a trace costs on disk, and what replaying it costs in time.

    python benchmarks/bench_replay.py       # figures go to BENCHMARKS.md

The program is examples/vector_add.py (cuda-python: two 4 MiB copies of random floats to
the device, one launch, one 4 MiB copy back), recorded by a server started with --record
(and again with --record-full). Figures:
- trace size (manifests and chunks, as on disk) against the bytes the program sent to the
  device (its copies and its module's image), and for the full trace against those and the
  bytes copied back (<= 1.1x)
- `vgpu replay --check --server ADDR TRACE` against the recorded program run by
  `vgpu run --server ADDR`, on the same running emu server, alternating rounds, wall time
  of each command (<= 1.0x)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE.parent / "examples" / "vector_add.py"
VGPU = [sys.executable, "-m", "vgpu.cli"]
ROUNDS = 5

sys.path.insert(0, str(HERE.parent))

from vgpu.replay.trace import is_blob, read_trace  # noqa: E402


def _server(address: str, *options: str) -> subprocess.Popen:
    server = subprocess.Popen([*VGPU, "server", "--listen", address, "--backend", "emu",
                               *options], stdout=subprocess.PIPE, text=True)
    server.stdout.readline()
    return server


def _stop(server: subprocess.Popen) -> None:
    server.terminate()  # a recording server writes its sessions' traces first
    server.wait(120)


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def _record(work: Path, name: str, *options: str) -> Path:
    trace = work / name
    server = _server(f"ipc://{work}/{name}.sock", "--record", str(trace), *options)
    try:
        subprocess.run([*VGPU, "run", "--server", f"ipc://{work}/{name}.sock", "--",
                        sys.executable, str(PROGRAM)], check=True, capture_output=True)
    finally:
        _stop(server)
    return trace


def _sizes(trace: Path) -> tuple[int, int, int]:
    """Bytes on disk, bytes the program sent (data in its calls), bytes copied back."""
    on_disk = sum(f.stat().st_size for f in trace.rglob("*") if f.is_file())
    loaded = read_trace(trace)
    sent = back = 0
    for session in loaded.sessions:
        for _, args, outcome in session.calls:
            sent += sum(a[1] for a in args if is_blob(a)) if isinstance(args, list) else 0
            back += sum(blob[1] for blob in outcome.get("kept", {}).get("data", []))
    return on_disk, sent, back


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        digests = _record(work, "digests")
        full = _record(work, "full", "--record-full")
        on_disk, sent, _ = _sizes(digests)
        full_on_disk, _, back = _sizes(full)
        address = f"ipc://{work}/plain.sock"
        server = _server(address)
        runs, replays = [], []
        try:
            for _ in range(ROUNDS):
                runs.append(_timed([*VGPU, "run", "--server", address, "--",
                                    sys.executable, str(PROGRAM)]))
                replays.append(_timed([*VGPU, "replay", "--check", "--server", address,
                                       str(full)]))
        finally:
            _stop(server)
    mib = 1 << 20
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"trace (digests only)  {on_disk / mib:7.2f} MiB for {sent / mib:.2f} MiB sent to the "
          f"device: {on_disk / sent:.3f}x  (target <= 1.1x)")
    print(f"trace (--full)        {full_on_disk / mib:7.2f} MiB for {(sent + back) / mib:.2f} "
          f"MiB sent and copied back: {full_on_disk / (sent + back):.3f}x  (target <= 1.1x)")
    run, again = statistics.median(runs), statistics.median(replays)
    print(f"replay --check        {again:.2f} s (rounds {min(replays):.2f}-{max(replays):.2f}) "
          f"against the recorded run {run:.2f} s (rounds {min(runs):.2f}-{max(runs):.2f}), "
          f"median of {ROUNDS} alternating rounds: {again / run:.2f}x  (target <= 1.0x)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
