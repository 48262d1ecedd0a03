"""Conditional nodes benchmark: a loop the device ends, as a graph's WHILE node against the
host loop a program writes without one, through vgpu, in the same process and run.

    python benchmarks/bench_graph_conditional.py [--iterations N] [--rounds R]

A CUDA program (bench_graph_conditional.cu, built with nvcc -cudart shared) runs, per round,
one launch of a graph whose WHILE body (one 32-thread kernel that counts down and sets the
condition) runs N times, then the same N kernels launched from the host, each followed by a
copy of its "go on" flag back to the host and a synchronization, under `vgpu run` with an emu
server on another CPU. Reported, per iteration end to end: medians and bests over the rounds,
and the ratio WHILE node / host loop (the node saves each iteration's round trip: below 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_runtime import run_lines  # noqa: E402
from toolkit import find_toolkit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-conditional-") as tmp:
        program = find_toolkit(Path(tmp)).executable(
            (HERE / "bench_graph_conditional.cu").read_text(), ["-cudart", "shared", "-O2"])
        lines = run_lines(program, [str(args.iterations), str(args.rounds)])
    node, host = [], []
    for line in lines:
        fields = line.split()
        node.append(float(fields[fields.index("while_node_us") + 1]))
        host.append(float(fields[fields.index("host_loop_us") + 1]))
    ratios = [n / h for n, h in zip(node, host, strict=True)]
    print(f"per iteration, {args.rounds} rounds of {args.iterations} iterations: median (best)")
    print(f"WHILE node {statistics.median(node):8.1f} us ({min(node):.1f}), host loop "
          f"{statistics.median(host):8.1f} us ({min(host):.1f}), ratio "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
