"""Managed memory benchmark: what keeping the host's view and the device's copy agreed costs
(shim/driver/managed.py), against the same work on device memory, in the same run.

    python benchmarks/bench_managed.py [--sizes 1,16,64] [--launches N]

A CUDA program (bench_managed.cu, nvcc -cudart shared) runs under `vgpu run` with a private
emu server, once per size: N launches of a kernel touching one word, on a cudaMalloc buffer
and on a cudaMallocManaged buffer of the size (each call compares the managed bytes with
what the device last saw); then N rounds of "host writes a word, launch, host reads a word"
with managed memory (a synchronization reads it all back) against explicit cudaMemcpy of the
whole buffer both ways. Reported: microseconds per launch and per round, and the ratios.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from toolkit import find_toolkit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,16,64", help="MiB of memory, comma-separated")
    parser.add_argument("--launches", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-managed-") as tmp:
        program = find_toolkit(Path(tmp)).executable(
            (HERE / "bench_managed.cu").read_text(), ["-cudart", "shared", "-O2"])
        print("| MiB | launch, device memory | launch, managed | ratio "
              "| round, explicit copies | round, managed | ratio |")
        print("|---|---|---|---|---|---|---|")
        for mib in (int(s) for s in args.sizes.split(",")):
            result = subprocess.run(
                [sys.executable, "-m", "vgpu.cli", "run", "--backend", "emu", "--",
                 str(program), str(mib), str(args.launches)],
                capture_output=True, text=True, check=True)
            plain, managed, copies, rounds = (float(x) for x in result.stdout.split())
            print(f"| {mib} | {plain:.0f} us | {managed:.0f} us | {managed / plain:.2f} "
                  f"| {copies:.0f} us | {rounds:.0f} us | {rounds / copies:.2f} |")


if __name__ == "__main__":
    main()
