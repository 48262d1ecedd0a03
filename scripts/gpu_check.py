"""vgpu's cuda backend on a machine with an NVIDIA GPU, checked end to end (scripts/gpu-check
installs vgpu, then runs this). Steps, each bounded in time, all within eight minutes
(--budget):

1. the GPU is there and `vgpu server --backend cuda` starts on it;
2. end-to-end programs (runtime API, each built with `-cudart shared` and with nvcc's
   default, NVIDIA's static runtime; driver API; cuda-python; numba-cuda; on a machine with
   two GPUs a multi-GPU one too) natively and under `vgpu run` on that server: exit status
   and output compared;
3. the backend contract suite on the GPU (tests/backends, its `cuda` tests in process);
4. a running program's session migrated cuda -> emu -> cuda, ending as an unmoved run does;
5. one session's device fault beside another's on the same server (each session in a device
   process of its own): the other goes on with correct results, the faulting one recovers
   after its device reset, and the server serves programs after it;
6. benchmarks natively and under vgpu: per-call overhead, launch rate, copy bandwidth
   (benchmarks/bench_transport.c) and a kernel-bound program (bench_kernel_bound.cu);
7. CuPy's first kernels (NVRTC compile through vgpu's libnvrtc, module load, launch;
   benchmarks/bench_cupy_first_kernel.py) natively and under vgpu.

Figures and verdicts go to one Markdown file (--out, default gpu-check.md), whose tables go
into BENCHMARKS.md. Exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
BUDGET_S = 8 * 60
SERVER_LOG = "cuda-server.log"  # in the check's folder
KERNEL_BOUND_TARGET = 0.03  # at most 3% slower than native for kernel-bound work

# Runtime-API test programs that check their own results and behave the same on any GPU
# (those about what vgpu refuses are left out): name -> (nvcc flags, extra sources).
RUNTIME_PROGRAMS = {
    "vector_add": ((), ()), "matmul_tiled": ((), ()), "reduction": ((), ()),
    "atomics": ((), ()), "streams_events": ((), ()), "async_pinned": ((), ()),
    "zero_copy": ((), ()), "constant_memory": ((), ()), "device_printf": ((), ()),
    "kernel_assert": ((), ()),
    "templates": ((), ()), "host_callback": ((), ()), "occupancy": ((), ()),
    "device_management": ((), ()), "memory_api": ((), ()), "host_threads": ((), ()),
    "launch_configuration": ((), ()),
    "rdc_main": (("-rdc=true",), ("rdc_combine.cu",)),
}
# On NVIDIA's driver a device-side fault (an assert, an illegal address) is sticky for the
# whole process, for good: every context of it fails from then on, and no new one can be
# made (seen on an H200: after a trap in one context, cuMemAlloc in another returned
# CUDA_ERROR_LAUNCH_FAILED, and cuCtxCreate still did 20 s after every context was destroyed
# and the primary context reset). A cuda server runs each session in a device process of its
# own for that reason; the contract suite's in-process `cuda` tests that fault, and the
# faulting programs (to keep the other steps' figures apart from them), run apart.
FAULTING_PROGRAMS = {"kernel_assert"}
FAULTING_CONTRACT_TESTS = ("test_a_failed_assert_is_a_fault",
                           "test_a_kernel_storing_where_nothing_is_mapped",
                           "test_after_a_fault_and_a_recovery",
                           "test_kernels_and_copies_reach_a_host_buffer_shown_at_its_own")
# Multi-GPU programs, run where the machine has the two GPUs they expect.
TWO_GPU_PROGRAMS = {"multi_device": ((), ())}
# What bench_transport.c prints, compared: name -> what it is (a time per call, or a rate).
TRANSPORT_FIGURES = {
    "idle_sync_s": "idle cuCtxSynchronize, s per call",
    "query_round_trip_s": "cuMemGetInfo (a round trip), s per call",
    "launch_rate_client_per_s": "queued empty launches, client side, per s",
    "launch_rate_end_to_end_per_s": "empty launches end to end, per s",
    "htod_bytes_per_s": "HtoD pageable, bytes/s",
    "dtoh_bytes_per_s": "DtoH pageable, bytes/s",
    "htod_pinned_bytes_per_s": "HtoD pinned, bytes/s",
    "dtoh_pinned_bytes_per_s": "DtoH pinned, bytes/s",
}


# ----------------------------------------------------------------- what the steps compare

@dataclass
class Run:
    """A finished program: exit status and output."""

    code: int
    stdout: str
    stderr: str = ""


# Output that differs between two correct runs: device addresses, times, and the memory
# free on a device that other processes share.
_VOLATILE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(?:ms|us|ns|s)\b"), "? s"),
    (re.compile(r"(free\D{0,12})\d+"), r"\g<1>?"),
]


def masked(text: str) -> str:
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def compare_outputs(native: Run, vgpu: Run) -> list[str]:
    """How a run under vgpu differs from the native one (nothing: the same). Device printf
    from several blocks comes in the order the GPU ran them, so the same lines in another
    order are the same output."""
    differences = []
    if native.code != vgpu.code:
        differences.append(f"exit status {vgpu.code} under vgpu, {native.code} natively")
    ours, theirs = masked(vgpu.stdout).splitlines(), masked(native.stdout).splitlines()
    if ours != theirs and sorted(ours) != sorted(theirs):
        missing = [line for line in theirs if line not in ours]
        extra = [line for line in ours if line not in theirs]
        differences.append(f"stdout differs: native only {missing[:5]}, vgpu only {extra[:5]}")
    return differences


def parse_figures(output: str) -> dict[str, float]:
    """The "name value" lines a benchmark program prints."""
    figures = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 2:
            with contextlib.suppress(ValueError):
                figures[parts[0]] = float(parts[1])
    return figures


def ratio_rows(native: dict[str, float], vgpu: dict[str, float],
               names: dict[str, str]) -> list[tuple[str, float, float, float]]:
    """(what, native, vgpu, vgpu / native) for each figure both runs have."""
    return [(what, native[key], vgpu[key], vgpu[key] / native[key])
            for key, what in names.items()
            if key in native and key in vgpu and native[key] > 0]


def kernel_bound_verdict(native_s: float, vgpu_s: float) -> tuple[float, bool]:
    """The overhead of the kernel-bound program under vgpu, and whether it meets the bar."""
    overhead = vgpu_s / native_s - 1
    return overhead, overhead <= KERNEL_BOUND_TARGET


# ----------------------------------------------------------------- steps and the report

@dataclass
class Step:
    name: str
    passed: bool = False
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)  # what it found, for the report


class Budget:
    """`total` seconds (eight minutes unless --budget says otherwise) from `started` (when the
    installation began): each step gets what is left, at most its own limit."""

    def __init__(self, started: float, total: float = BUDGET_S):
        self.deadline = started + total

    def left(self, limit: float) -> float:
        left = min(limit, self.deadline - time.time())
        if left <= 5:
            raise TimeoutError("the check's time is spent")
        return left


def report(steps: list[Step], gpu: str) -> str:
    lines = ["# vgpu GPU check", "", f"GPU: {gpu}", ""]
    if steps:
        lines += ["| step | verdict | seconds |", "|---|---|---|"]
    lines += [f"| {s.name} | {'passed' if s.passed else 'FAILED'} | {s.seconds:.1f} |"
              for s in steps]
    for step in steps:
        lines += ["", f"## {step.name}", "", *step.lines]
    return "\n".join(lines) + "\n"


def ratio_table(rows: list[tuple[str, float, float, float]]) -> list[str]:
    return ["| figure | native | vgpu | vgpu / native |", "|---|---|---|---|",
            *(f"| {what} | {n:.4g} | {v:.4g} | {r:.3f} |" for what, n, v, r in rows)]


def run_step(steps: list[Step], name: str, action: Callable[[Step], None]) -> None:
    """Run one step; an exception fails it (with its message), never the whole check."""
    step = Step(name)
    started = time.monotonic()
    try:
        action(step)
    except Exception as exc:  # any failure is this step's verdict
        step.passed = False
        step.lines.append(f"stopped: {type(exc).__name__}: {exc}")
    step.seconds = time.monotonic() - started
    steps.append(step)
    print(f"gpu-check: {name}: {'passed' if step.passed else 'FAILED'} "
          f"({step.seconds:.0f} s)", flush=True)


# ----------------------------------------------------------------- running programs

def gpu_names() -> list[str]:
    """The GPUs' names, none without a usable NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    result = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=30)
    return result.stdout.strip().splitlines() if result.returncode == 0 else []


def run(command: list, timeout: float, env: dict | None = None) -> Run:
    try:
        result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                                timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Run(124, "", f"no end within {timeout:.0f} s")
    return Run(result.returncode, result.stdout, result.stderr)


class Machine:
    """What the steps share: the toolkit, a cuda server, and how to run a program natively
    and under vgpu."""

    def __init__(self, work: Path, budget: Budget, gpus: int):
        sys.path[:0] = [str(TESTS), str(TESTS / "e2e")]
        from toolkit import find_toolkit
        from vgpu_processes import VGPU, start_cuda_server, stop_server, vgpu_environment

        self.work, self.budget, self.gpus = work, budget, gpus
        self.toolkit = find_toolkit(work / "build")
        self.vgpu, self.environment = VGPU, vgpu_environment
        self._start_server, self._stop_server = start_cuda_server, stop_server
        # The server's log goes to a file, whose end the report shows when a step failed.
        with (work / SERVER_LOG).open("w") as log:
            self.server = start_cuda_server(f"ipc://{work}/cuda.sock", stderr=log)
        # Natively, `-cudart shared` programs need NVIDIA's runtime on the library path.
        library_path = os.environ.get("LD_LIBRARY_PATH", "")
        native_env = {**vgpu_environment(), "LD_LIBRARY_PATH":
                      f"{self.toolkit.cudart_library.parent}:{library_path}"}
        # How a program is started: "native" or "vgpu" -> (command prefix, environment).
        self.launchers = {
            "native": ([], native_env),
            "vgpu": ([*VGPU, "run", "--server", self.server.endpoint, "--"],
                     vgpu_environment())}

    def native(self, command: list, limit: float = 60) -> Run:
        return self._run("native", command, limit)

    def under_vgpu(self, command: list, limit: float = 60) -> Run:
        return self._run("vgpu", command, limit)

    def under_own_server(self, command: list, limit: float = 30) -> Run:
        """Under vgpu on a cuda server of its own, stopped after it (see FAULTING_PROGRAMS)."""
        with (self.work / SERVER_LOG).open("a") as log:
            server = self._start_server(f"ipc://{self.work}/own-cuda.sock", stderr=log)
        try:
            return run([*self.vgpu, "run", "--server", server.endpoint, "--", *command],
                       self.budget.left(limit), self.environment())
        finally:
            self._stop_server(server)

    def _run(self, where: str, command: list, limit: float) -> Run:
        prefix, env = self.launchers[where]
        return run([*prefix, *command], self.budget.left(limit), env)

    def close(self) -> None:
        self._stop_server(self.server)


# ----------------------------------------------------------------- the steps

def contract_suite(machine: Machine, step: Step) -> None:
    faulting = " or ".join(FAULTING_CONTRACT_TESTS)
    selections = [f"cuda and not ({faulting})",
                  *(f"cuda and {name}" for name in FAULTING_CONTRACT_TESTS)]
    step.passed = True
    for selection in selections:
        result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "--tb=line", "-k", selection, TESTS / "backends"],
                     machine.budget.left(180), machine.environment(VGPU_CONTRACT_CUDA="direct"))
        step.lines += [f"`-k '{selection}'`:", "", "```",
                       *result.stdout.strip().splitlines()[-30:], "```", ""]
        step.passed = step.passed and result.code == 0


def fault_beside_another(machine: Machine, step: Step) -> None:
    """tests/e2e/programs/fault_neighbours.py on the shared cuda server: a neighbour works,
    a faulter faults, the neighbour works again and checks its results, the faulter resets
    its device and works again; then a program runs on the server as before."""
    program = TESTS / "e2e" / "programs" / "fault_neighbours.py"
    prefix, env = machine.launchers["vgpu"]

    def start(role: str) -> subprocess.Popen:
        return subprocess.Popen([*prefix, sys.executable, str(program), role],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    def line(proc: subprocess.Popen) -> str:
        ready, _, _ = select.select([proc.stdout], [], [], machine.budget.left(60))
        return proc.stdout.readline().strip() if ready else "(nothing in time)"

    def finish(proc: subprocess.Popen) -> str:
        proc.stdin.write("\n")
        proc.stdin.flush()
        try:
            out, err = proc.communicate(timeout=machine.budget.left(60))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return (out + err).strip()

    neighbour = start("neighbour")
    said = [line(neighbour), line(neighbour)]
    faulter = start("faulter")
    said += [line(faulter), line(faulter)]
    neighbour_end, faulter_end = finish(neighbour), finish(faulter)
    follow = run([*prefix, sys.executable, "-c", _SERVED_AFTER], machine.budget.left(60), env)
    step.lines += ["```", *said[1::2], f"neighbour after the fault: {neighbour_end}",
                   f"faulter after its reset: {faulter_end}",
                   f"a new program afterwards: {follow.stdout.strip()} {follow.stderr.strip()}",
                   "```"]
    step.passed = (said[3] == "fault CUDA_ERROR_ILLEGAL_ADDRESS"
                   and neighbour_end == "words all 2"
                   and faulter_end == "after reset words all 1"
                   and follow.code == 0 and follow.stdout.strip() == "served")


# A program that needs the server's device: a context and an allocation.
_SERVED_AFTER = ("from cuda.bindings import driver as cu\n"
                 "assert cu.cuInit(0)[0] == 0\n"
                 "context = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]\n"
                 "assert cu.cuCtxSetCurrent(context)[0] == 0\n"
                 "assert cu.cuMemAlloc(1 << 20)[0] == 0\n"
                 "print('served')\n")


def programs(machine: Machine) -> dict[str, list]:
    """The end-to-end programs, built (nvcc runs in parallel: builds are most of the step's
    time): name -> command."""
    toolkit, runtime, e2e = machine.toolkit, TESTS / "runtime" / "programs", TESTS / "e2e"
    chosen = {**RUNTIME_PROGRAMS, **(TWO_GPU_PROGRAMS if machine.gpus == 2 else {})}

    # Each program twice: with `-cudart shared` (vgpu's libcudart under vgpu) and with nvcc's
    # default, NVIDIA's static runtime on vgpu's libcuda.
    builds = {**{name: ("-cudart", "shared") for name in chosen},
              **{f"{name} (static)": () for name in chosen}}

    def build(label: str) -> Path:
        name = label.removesuffix(" (static)")
        flags, extra = chosen[name]
        return toolkit.executable(
            (runtime / f"{name}.cu").read_text(), [*builds[label], f"-I{runtime}", *flags],
            {file: (runtime / file).read_text() for file in extra})

    first, *rest = builds
    commands = {first: [build(first)]}  # alone: it sets up what every build links with
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        commands.update({label: [path] for label, path in zip(rest, pool.map(build, rest),
                                                              strict=True)})
    ptx = machine.work / "kernels.ptx"
    ptx.write_text(toolkit.ptx((e2e / "kernels.cu").read_text()))
    for name in ("driver_app", "driver_api_tour", "driver_zero_copy", "driver_vmm"):
        commands[name] = [toolkit.c_program((e2e / f"{name}.c").read_text()), ptx]
    for name in ("vector_add", "numba_axpy"):
        commands[f"{name}.py"] = [sys.executable, ROOT / "examples" / f"{name}.py"]
    return commands


def end_to_end(machine: Machine, step: Step) -> None:
    failed, details = 0, []
    step.lines += ["| program | native exit | vgpu exit | verdict |", "|---|---|---|---|"]
    for name, command in programs(machine).items():
        vgpu_run = (machine.under_own_server
                    if name.removesuffix(" (static)") in FAULTING_PROGRAMS else machine.under_vgpu)
        native, vgpu = machine.native(command, 30), vgpu_run(command, 30)
        differences = compare_outputs(native, vgpu)
        failed += bool(differences) or native.code != 0
        verdict = "same output" if not differences else "; ".join(differences)
        step.lines.append(f"| {name} | {native.code} | {vgpu.code} | {verdict} |")
        if differences or native.code != 0:
            details += [f"### {name}", "", "```",
                        *(f"{where}: {line}" for where, run_ in (("native", native),
                                                                 ("vgpu", vgpu))
                          for line in (run_.stdout + run_.stderr).strip().splitlines()[-8:]),
                        "```", ""]
    step.lines += ["", *details]
    step.passed = failed == 0


def cupy_first_kernel(machine: Machine, step: Step) -> None:
    """bench_cupy_first_kernel's program natively and under vgpu, each with CuPy's kernel
    cache empty and then filled (the difference is NVRTC's compile)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_cupy_first_kernel as first_kernel

    times = {}
    for where, (launcher, env) in machine.launchers.items():
        with tempfile.TemporaryDirectory() as cache:
            try:
                times[where] = [first_kernel.run_once(cache, launcher, env,
                                                      machine.budget.left(120))
                                for _ in ("cache empty", "cache filled")]
            except subprocess.CalledProcessError as failed:
                step.lines.append(f"{where}: exit {failed.returncode}: "
                                  f"{failed.stderr.strip()[-800:]}")
                return
    step.lines += ["| kernel, call | native s | vgpu s | vgpu / native |", "|---|---|---|---|"]
    for kernel in times["native"][0]:
        for label, run_index, call in (("first call, cache empty", 0, 0),
                                       ("first call, cache filled", 1, 0),
                                       ("second call", 1, 1)):
            native, vgpu = (times[w][run_index][kernel][call] for w in ("native", "vgpu"))
            step.lines.append(f"| {kernel}, {label} | {native:.4g} | {vgpu:.4g} | "
                              f"{vgpu / native:.2f} |")
    step.passed = times["native"][0].keys() == times["vgpu"][0].keys()


def benchmarks(machine: Machine, step: Step) -> None:
    toolkit, bench = machine.toolkit, ROOT / "benchmarks"
    transport = [toolkit.c_program((bench / "bench_transport.c").read_text()), 2000, 20000, 256]
    native, vgpu = machine.native(transport, 120), machine.under_vgpu(transport, 120)
    rows = ratio_rows(parse_figures(native.stdout), parse_figures(vgpu.stdout),
                      TRANSPORT_FIGURES)
    step.lines += ["bench_transport.c (2000 calls, 20000 launches, 256 MiB copies):", "",
                   *ratio_table(rows), ""]
    kernel_bound = [toolkit.executable((bench / "bench_kernel_bound.cu").read_text(),
                                       ["-cudart", "shared", "-O2"])]
    native_kb, vgpu_kb = machine.native(kernel_bound, 120), machine.under_vgpu(kernel_bound, 120)
    figures_native, figures_vgpu = parse_figures(native_kb.stdout), parse_figures(vgpu_kb.stdout)
    same = figures_native.get("checksum") == figures_vgpu.get("checksum")
    if "kernel_bound_s" in figures_native and "kernel_bound_s" in figures_vgpu:
        overhead, met = kernel_bound_verdict(figures_native["kernel_bound_s"],
                                             figures_vgpu["kernel_bound_s"])
        step.lines.append(f"bench_kernel_bound.cu: native {figures_native['kernel_bound_s']:.3f}"
                          f" s, vgpu {figures_vgpu['kernel_bound_s']:.3f} s: overhead "
                          f"{100 * overhead:.2f}% ({'meets' if met else 'misses'} the "
                          f"{100 * KERNEL_BOUND_TARGET:.0f}% bar); checksums "
                          f"{'equal' if same else 'DIFFER'}")
    else:
        step.lines.append(f"bench_kernel_bound.cu did not run: native {native_kb.stderr!r}, "
                          f"vgpu {vgpu_kb.stderr!r}")
    step.passed = (len(rows) == len(TRANSPORT_FIGURES) and same
                   and "kernel_bound_s" in figures_vgpu)


def migration(machine: Machine, step: Step) -> None:
    """state_loop (tests/e2e/programs) on the cuda server, moved to an emu server at
    iteration 3 and back at 6: the same checksum, pointers and counter as an unmoved run."""
    from running_program import RunningProgram, pause_at
    from state_model import expected_checksum
    from vgpu_processes import start_emu_server, stop_server

    programs_dir = TESTS / "e2e" / "programs"
    loop = machine.toolkit.c_program((programs_dir / "state_loop.c").read_text())
    ptx = machine.work / "state_kernels.ptx"
    ptx.write_text(machine.toolkit.ptx((programs_dir / "state_kernels.cu").read_text()))
    shape = (4, 65536, 20, 1)  # 64 MiB in 4 allocations, 20 iterations
    pause = machine.work / "pause"
    pause_at(pause, 3)
    cuda = machine.server.endpoint
    emu = start_emu_server(f"ipc://{machine.work}/emu.sock", stderr=subprocess.DEVNULL)
    program = RunningProgram([loop, ptx, *shape, "--pause-file", pause],
                             machine.budget.left(60), VGPU_SERVER=cuda)
    def migrate(here: str, there: str) -> None:
        moved = run([*machine.vgpu, "migrate", program.pid, "--to", there, "--server", here],
                    machine.budget.left(60), machine.environment())
        step.lines.append(f"migrate to {there}: exit {moved.code} {moved.stderr.strip()}")

    try:
        program.wait_for("paused 3")
        migrate(cuda, emu.endpoint)
        pause_at(pause, 6)
        program.wait_for("paused 6")
        migrate(emu.endpoint, cuda)
        pause_at(pause, 20)
        program.wait_for("paused 20")
        pause.unlink()
        code = program.finish()
        lines = program.lines
        checksum = [line.split()[1] for line in lines if line.startswith("checksum ")]
        pointers = [line for line in lines if line.startswith("pointers ")]
        counters = [line.split()[2] for line in lines if line.startswith("counter ")]
        expected = expected_checksum(*shape)
        step.lines.append(f"exit {code}, checksum {checksum} (unmoved: {expected}), "
                          f"pointers kept: {len(pointers) == 2 and pointers[0] == pointers[1]}, "
                          f"counter {counters} (unmoved: ['1000', '1020'])")
        step.passed = (code == 0 and checksum == [expected] and len(pointers) == 2
                       and pointers[0] == pointers[1] and counters == ["1000", "1020"])
    finally:
        program.stop()
        stop_server(emu)


# ----------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"),
                        help="the file the figures and verdicts go to")
    parser.add_argument("--budget", type=float, default=BUDGET_S, metavar="SECONDS",
                        help="the whole check's time, installation included (default: "
                        "%(default)s)")
    args = parser.parse_args(argv)
    budget = Budget(float(os.environ.get("GPU_CHECK_STARTED", time.time())), args.budget)
    gpus = gpu_names()
    if not gpus:
        args.out.write_text(report([], "none: no NVIDIA GPU with a working driver"))
        print("gpu-check: no NVIDIA GPU with a working driver here (nvidia-smi finds none); "
              "this check needs one", file=sys.stderr)
        return 2
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-gpu-check-") as folder:
        os.environ["XDG_RUNTIME_DIR"] = folder  # its servers stay out of the user's registry
        machine = None

        def start(step: Step) -> None:
            nonlocal machine
            machine = Machine(Path(folder), budget, len(gpus))
            step.lines.append(f"`vgpu server --backend cuda` listens at {machine.server.endpoint}")
            step.passed = True

        run_step(steps, "cuda server starts", start)
        if machine is not None:
            try:
                for name, action in (("programs natively and under vgpu", end_to_end),
                                     ("contract suite on cuda", contract_suite),
                                     ("a fault beside another session", fault_beside_another),
                                     ("migration cuda -> emu -> cuda", migration),
                                     ("benchmarks against native", benchmarks),
                                     ("CuPy's first kernels", cupy_first_kernel)):
                    run_step(steps, name, lambda step, action=action: action(machine, step))
            finally:
                machine.close()
        text = report(steps, ", ".join(gpus))
        log = Path(folder) / SERVER_LOG
        if not all(step.passed for step in steps) and log.exists():
            tail = log.read_text(errors="replace").splitlines()[-40:]
            text += "\n## The cuda server's log, last lines\n\n```\n" + "\n".join(tail) + "\n```\n"
    args.out.write_text(text)
    print(f"gpu-check: figures and verdicts in {args.out}")
    return 0 if steps and all(step.passed for step in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
