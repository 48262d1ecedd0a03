"""CUDA graphs benchmark: launching a graph of 100 small kernel nodes against launching the
same 100 kernels one by one, through vgpu, in the same process and run.

    python benchmarks/bench_graphs.py [--repeats N] [--rounds R]

A CUDA program (bench_graph_launch.cu, built with nvcc -cudart shared) captures 100 launches
of a 32-thread kernel into a graph, then alternates, per round, N launches of the graph and
N x 100 launches of the kernel, under `vgpu run` with an emu server on another CPU.
Reported, per 100 kernels: the time until the launch calls return (client side) and until a
synchronization returns (end to end), medians and bests over the rounds, and the ratio
graph / one by one (a graph must be cheaper: below 1).
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

FIELDS = ("graph_client_us", "graph_total_us", "kernels_client_us", "kernels_total_us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-graphs-") as tmp:
        program = find_toolkit(Path(tmp)).executable(
            (HERE / "bench_graph_launch.cu").read_text(),
            ["-cudart", "shared", "-O2", "-I", str(HERE)])
        lines = run_lines(program, [str(args.repeats), str(args.rounds)])
    figures = {name: [] for name in FIELDS}
    for line in lines:
        fields = line.split()
        for name in FIELDS:
            figures[name].append(float(fields[fields.index(name) + 1]))
    print(f"per 100 kernels, {args.rounds} rounds of {args.repeats} repeats: median (best)")
    for side in ("client", "total"):
        graph, kernels = figures[f"graph_{side}_us"], figures[f"kernels_{side}_us"]
        ratios = [g / k for g, k in zip(graph, kernels, strict=True)]
        print(f"{'client side' if side == 'client' else 'end to end '}: graph "
              f"{statistics.median(graph):9.1f} us ({min(graph):.1f}), one by one "
              f"{statistics.median(kernels):9.1f} us ({min(kernels):.1f}), ratio "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
