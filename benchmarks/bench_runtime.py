"""Runtime-layer benchmark: the cost of a `<<<>>>` launch over a driver-level
`cuLaunchKernel`, client side, in the same process and run.

    python benchmarks/bench_runtime.py [--launches N] [--rounds R]

A CUDA program (bench_runtime_launch.cu, built with nvcc -cudart shared and linked to
libcuda) launches one kernel N times through `<<<>>>` (our libcudart: push and pop of the
configuration, then __cudaLaunchKernel) and N times through cuLaunchKernel (our libcuda),
alternating, under `vgpu run` with an emu server; the program and the server run on different
CPUs. Reported: the per-launch time of each path (the
minimum and the median over the rounds) and the difference, the runtime layer's own cost
(target <= 2 us), and the time per cudaMemsetAsync of 4 bytes, a runtime call that is no
launch. The same program built with nvcc's default (NVIDIA's runtime linked statically, over
vgpu's libcuda and its export tables) runs next, for the same figures through NVIDIA's
runtime: the per-call cost of each runtime against the other's, same run.
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


def build(cache: Path, cudart: str) -> Path:
    from vgpu.shim.loader import shim_library_dir

    toolkit = find_toolkit(cache)
    return toolkit.executable((HERE / "bench_runtime_launch.cu").read_text(),
                              ["-cudart", cudart, "-O2", f"-L{shim_library_dir()}", "-lcuda"])


def _on_cpu(cpu: int | None):
    """A preexec_fn that keeps a process on one CPU (None: anywhere)."""
    return None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))


def run_lines(program: Path, args: list[str]) -> list[str]:
    """The output lines of `program ARGS` under `vgpu run`, the program on one CPU and the
    emu server that executes its kernels on another, so that client-side times do not
    include the server's work."""
    env = {k: v for k, v in os.environ.items() if k not in ("VGPU_SERVER", "VGPU_TRACE")}
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-server-") as tmp:
        address = f"ipc://{tmp}/server.sock"
        server = subprocess.Popen(
            [sys.executable, "-m", "vgpu.cli", "server", "--listen", address, "--backend",
             "emu"], stdout=subprocess.PIPE, text=True, env=env,
            preexec_fn=_on_cpu(server_cpu))
        try:
            server.stdout.readline()
            result = subprocess.run(
                [sys.executable, "-m", "vgpu.cli", "run", "--server", address, "--",
                 str(program), *args], capture_output=True, text=True,
                env=env, timeout=1800, preexec_fn=_on_cpu(client_cpu))
        finally:
            server.terminate()
            server.wait(timeout=10)
            server.stdout.close()
    if result.returncode != 0:
        raise SystemExit(f"benchmark program failed ({result.returncode}):\n"
                         f"{result.stdout}{result.stderr}")
    return result.stdout.splitlines()


def measure(program: Path, launches: int, rounds: int) -> dict[str, list[float]]:
    """Each path's microseconds per call, one value a round: `runtime` (<<<>>>), `driver`
    (cuLaunchKernel), `memset` (cudaMemsetAsync)."""
    figures = {"runtime": [], "driver": [], "memset": []}
    for line in run_lines(program, [str(launches), str(rounds)]):
        fields = line.split()
        for name, values in figures.items():
            values.append(float(fields[fields.index(f"{name}_us") + 1]))
    return figures

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=2000, help="launches per path per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-runtime-") as tmp:
        ours = measure(build(Path(tmp), "shared"), args.launches, args.rounds)
        theirs = measure(build(Path(tmp), "static"), args.launches, args.rounds)
    runtime, driver, nvidia = ours["runtime"], ours["driver"], theirs["runtime"]
    # Other processes share this machine's cores: the minimum is each path's undisturbed
    # cost, the median shows how much disturbance there was.
    rows = [("<<<>>> (libcudart over libcuda)", runtime), ("cuLaunchKernel (libcuda)", driver),
            ("<<<>>> (NVIDIA's runtime, static)", nvidia),
            ("cuLaunchKernel (same program)", theirs["driver"]),
            ("cudaMemsetAsync (vgpu's runtime)", ours["memset"]),
            ("cudaMemsetAsync (NVIDIA's runtime)", theirs["memset"])]
    print(f"{'us per call, ' + str(len(runtime)) + ' rounds':34} {'minimum':>10} {'median':>10}")
    for label, values in rows:
        print(f"{label:34} {min(values):>10.2f} {statistics.median(values):>10.2f}")
    cost = min(runtime) - min(driver)
    print(f"{'runtime layer cost per launch':34} {cost:>10.2f} "
          f"{statistics.median(runtime) - statistics.median(driver):>10.2f}   "
          f"(target <= {TARGET_US:.1f} us; ratio {min(runtime) / min(driver):.2f}x)")
    for label, (mine, nvidias) in (("launch", (runtime, nvidia)),
                                   ("memset", (ours["memset"], theirs["memset"]))):
        print(f"{'NVIDIA runtime over vgpu, ' + label:34} {min(nvidias) / min(mine):>10.2f}x "
              f"{statistics.median(nvidias) / statistics.median(mine):>9.2f}x")


if __name__ == "__main__":
    main()
