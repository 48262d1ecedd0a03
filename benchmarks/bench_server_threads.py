"""A CUDA program's kernel loop under `vgpu run`, its private emu server on one thread and on
two (VGPU_EMU_THREADS): what a second core gives a program end to end, server and round
trips included.

    python benchmarks/bench_server_threads.py [--rounds R] [--iterations N]

The program (bench_server_threads.cu, nvcc -cudart shared) launches a 1M-thread saxpy N
times asynchronously, then N times with a synchronization after each launch, and prints
microseconds per iteration of each. Runs on one and two threads alternate, R rounds;
reported: best / median per iteration and one thread's over two threads'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from toolkit import find_toolkit  # noqa: E402


def run(program: Path, threads: int, iterations: int) -> tuple[float, float]:
    """(asynchronous, synchronized) microseconds per iteration, on `threads` server threads."""
    result = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "run", "--backend", "emu", "--", str(program),
         str(iterations)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "VGPU_EMU_THREADS": str(threads)})
    asynchronous, synchronized = (float(x) for x in result.stdout.split())
    return asynchronous, synchronized


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-threads-") as tmp:
        program = find_toolkit(Path(tmp)).executable(
            (HERE / "bench_server_threads.cu").read_text(), ["-cudart", "shared", "-O2"])
        times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for threads, runs in times.items():
                runs.append(run(program, threads, args.iterations))
    print("| saxpy 1M launches | 1 thread, best / median | 2 threads, best / median "
          "| 1 thread over 2 (best / median) |")
    print("|---|---|---|---|")
    for column, name in enumerate(("asynchronous", "synchronized after each")):
        one, two = ([r[column] for r in times[t]] for t in (1, 2))
        print(f"| {name} | {min(one):.1f} / {statistics.median(one):.1f} us "
              f"| {min(two):.1f} / {statistics.median(two):.1f} us "
              f"| {min(one) / min(two):.2f} / "
              f"{statistics.median(one) / statistics.median(two):.2f} |")


if __name__ == "__main__":
    main()
