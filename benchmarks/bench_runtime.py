"""Runtime-layer benchmark (issue 4): the cost of a `<<<>>>` launch over a driver-level
`cuLaunchKernel`, client side, in the same process and run.

    python benchmarks/bench_runtime.py [--launches N] [--rounds R]

A CUDA program (bench_runtime_launch.cu, built with nvcc -cudart shared and linked to
libcuda) launches one kernel N times through `<<<>>>` (our libcudart: push and pop of the
configuration, then __cudaLaunchKernel) and N times through cuLaunchKernel (our libcuda),
alternating, under `vgpu run --backend emu`. Reported: the per-launch time of each path (the
median over the rounds) and the difference, the runtime layer's own cost (target <= 2 us).
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

TARGET_US = 2.0


def build(cache: Path) -> Path:
    from vgpu.shim.loader import shim_library_dir

    toolkit = find_toolkit(cache)
    return toolkit.executable((HERE / "bench_runtime_launch.cu").read_text(),
                              ["-cudart", "shared", "-O2", f"-L{shim_library_dir()}", "-lcuda"])


def measure(program: Path, launches: int, rounds: int) -> tuple[list[float], list[float]]:
    env = {k: v for k, v in os.environ.items() if k not in ("VGPU_SERVER", "VGPU_TRACE")}
    result = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "run", "--backend", "emu", "--", str(program),
         str(launches), str(rounds)], capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"benchmark program failed ({result.returncode}):\n"
                         f"{result.stdout}{result.stderr}")
    runtime, driver = [], []
    for line in result.stdout.splitlines():
        fields = line.split()
        runtime.append(float(fields[fields.index("runtime_us") + 1]))
        driver.append(float(fields[fields.index("driver_us") + 1]))
    return runtime, driver


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5000, help="launches per path per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-runtime-") as tmp:
        runtime, driver = measure(build(Path(tmp)), args.launches, args.rounds)
    rt, dr = statistics.median(runtime), statistics.median(driver)
    print(f"{'path':34} {'us per launch (median of ' + str(len(runtime)) + ')':>30}")
    print(f"{'<<<>>> (libcudart over libcuda)':34} {rt:>30.2f}")
    print(f"{'cuLaunchKernel (libcuda)':34} {dr:>30.2f}")
    print(f"{'runtime layer cost per launch':34} {rt - dr:>30.2f}   "
          f"(target <= {TARGET_US:.1f} us; ratio {rt / dr:.2f}x)")


if __name__ == "__main__":
    main()
