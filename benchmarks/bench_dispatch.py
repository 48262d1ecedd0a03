"""Dispatch benchmark: the cost of a call from C through the shim to its Python implementation,
against a bare cffi `extern "Python"` callback with the same signature, in the same run.

    python benchmarks/bench_dispatch.py [--calls N] [--rounds R]

In this process our libcuda is loaded by its soname, as cuda-python loads it, and its callbacks
are attached to no-op implementations of cuCtxSynchronize (0 arguments) and cuLaunchKernel
(11). A C loop, compiled here with cffi, calls the shim's exported symbols N times; the same
loop calls bare callbacks of the same signatures attached to the same no-ops (the floor: what
cffi itself costs). Reported: ns per call, the median over R rounds with the paths interleaved,
and the ratio. Then the start-up cost: attaching every callback (in this process), and the
first call of a C program into the shim, which starts the embedded Python runtime and boots it
(median over R fresh processes).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cffi

from vgpu.api import cudadefs
from vgpu.api.table import driver_functions
from vgpu.shim.dispatch import attach_callbacks, driver_results
from vgpu.shim.loader import shim_library_dir

LAUNCH_PARAMS = ("CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, "
                 "unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared, "
                 "CUstream stream, void **params, void **extra")

HELPER_TYPES = """
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_UNKNOWN = 999 } CUresult;
"""

HELPER_CDEF = HELPER_TYPES + f"""
extern "Python" CUresult baseline_sync(void);
extern "Python" CUresult baseline_launch({LAUNCH_PARAMS});
void *baseline(int arity);
double seconds_per_call(void *function, int arity, long calls);
"""

# Calls `function` (a 0- or 11-argument CUresult function) `calls` times; -1 if one failed.
HELPER_SOURCE = HELPER_TYPES + f"""
#include <time.h>

static CUresult baseline_sync(void);
static CUresult baseline_launch({LAUNCH_PARAMS});
typedef CUresult (*sync_fn)(void);
typedef CUresult (*launch_fn)({LAUNCH_PARAMS});

void *baseline(int arity)
{{
    return arity == 0 ? (void *)baseline_sync : (void *)baseline_launch;
}}

double seconds_per_call(void *function, int arity, long calls)
{{
    struct timespec start, end;
    void *params[1] = {{0}};
    unsigned failed = 0;

    clock_gettime(CLOCK_MONOTONIC, &start);
    if (arity == 0)
        for (long i = 0; i < calls; i++)
            failed |= ((sync_fn)function)();
    else
        for (long i = 0; i < calls; i++)
            failed |= ((launch_fn)function)((CUfunction)params, 1, 1, 1, 32, 1, 1, 0, 0,
                                            params, 0);
    clock_gettime(CLOCK_MONOTONIC, &end);
    if (failed)
        return -1;
    return ((end.tv_sec - start.tv_sec) + 1e-9 * (end.tv_nsec - start.tv_nsec)) / calls;
}}
"""

# A C program's first two calls into the shim (linked against it, as tests/shim's programs
# are): "first_call second_call", in seconds.
COLD_START = r"""
#include <stdio.h>
#include <time.h>

int cuDriverGetVersion(int *version);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void)
{
    int version = 0, rc;
    double t0 = now(), t1, t2;

    rc = cuDriverGetVersion(&version);
    t1 = now();
    rc |= cuDriverGetVersion(&version);
    t2 = now();
    printf("%.9f %.9f\n", t1 - t0, t2 - t1);
    return rc != 0;
}
"""


class NoOps:
    """The implementation the shim's callbacks are attached to for the measurement."""

    @staticmethod
    def cuCtxSynchronize() -> int:
        return 0

    @staticmethod
    def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> int:
        return 0


def build_helper(work: Path):
    builder = cffi.FFI()
    builder.cdef(HELPER_CDEF)
    builder.set_source("_bench_dispatch_helper", HELPER_SOURCE)
    builder.compile(tmpdir=str(work))
    sys.path.insert(0, str(work))
    helper = importlib.import_module("_bench_dispatch_helper")
    helper.ffi.def_extern(name="baseline_sync", error=999)(NoOps.cuCtxSynchronize)
    helper.ffi.def_extern(name="baseline_launch", error=999)(NoOps.cuLaunchKernel)
    return helper


def load_shim(shim_dir: Path) -> tuple[ctypes.CDLL, float]:
    """Our libcuda, booted, its callbacks then attached to NoOps (seconds that took)."""
    libcuda = ctypes.CDLL(str(shim_dir / "libcuda.so.1"))
    if libcuda.cuDriverGetVersion(ctypes.byref(ctypes.c_int())) != 0:
        raise SystemExit("the shim did not start: see stderr")
    shim = sys.modules["vgpu.shim._libcuda"]  # the embedded init registered it
    with open(os.devnull, "w") as quiet:  # no "not implemented" lines
        start = time.perf_counter()
        attach_callbacks(shim.ffi, shim.lib, driver_functions(), NoOps, driver_results(),
                         cudadefs, stream=quiet)
        attach_seconds = time.perf_counter() - start
    return libcuda, attach_seconds


def per_call(helper, libcuda: ctypes.CDLL, calls: int, rounds: int) -> dict[str, float]:
    """Median ns per call of each path; the paths alternate within every round."""
    def address(function) -> object:
        return helper.ffi.cast("void *", ctypes.cast(function, ctypes.c_void_p).value)

    paths = {
        ("shim", 0): address(libcuda.cuCtxSynchronize),
        ("baseline", 0): helper.lib.baseline(0),
        ("shim", 11): address(libcuda.cuLaunchKernel),
        ("baseline", 11): helper.lib.baseline(11),
    }
    samples: dict[tuple[str, int], list[float]] = {key: [] for key in paths}
    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for (path, arity), function in paths.items():
            seconds = helper.lib.seconds_per_call(function, arity, calls)
            if seconds < 0:
                raise SystemExit(f"{path} calls with {arity} arguments failed")
            samples[(path, arity)].append(seconds * 1e9)
    return {key: statistics.median(values[1:]) for key, values in samples.items()}


def cold_start(work: Path, shim_dir: Path, runs: int) -> tuple[float, float]:
    """Median seconds of a fresh C program's first call into the shim, and of its second."""
    program = work / "cold_start"
    source = work / "cold_start.c"
    source.write_text(COLD_START)
    subprocess.run(["cc", "-O1", "-o", str(program), str(source), f"-L{shim_dir}", "-lcuda"],
                   check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VGPU_"))}
    env["LD_LIBRARY_PATH"] = str(shim_dir)
    first, second = [], []
    for _ in range(runs):
        out = subprocess.run([str(program)], env=env, capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
        first.append(float(out[0]))
        second.append(float(out[1]))
    return statistics.median(first), statistics.median(second)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per path per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-dispatch-") as tmp:
        work = Path(tmp)
        shim_dir = shim_library_dir()  # found before the shim is loaded here
        helper = build_helper(work)
        libcuda, attach_seconds = load_shim(shim_dir)
        ns = per_call(helper, libcuda, args.calls, args.rounds)
        first, second = cold_start(work, shim_dir, args.rounds)
    print(f"{'call from C (median of ' + str(args.rounds) + ' rounds)':44} {'shim':>9} "
          f"{'baseline':>9} {'ratio':>7}")
    for arity, name in ((0, "cuCtxSynchronize"), (11, "cuLaunchKernel")):
        shim, base = ns[("shim", arity)], ns[("baseline", arity)]
        print(f"{f'no-op {name}, {arity} arguments':44} {shim:>6.0f} ns {base:>6.0f} ns "
              f"{shim / base:>7.2f}")
    print(f"{'attaching every callback (driver shim)':44} {attach_seconds * 1e3:>6.2f} ms")
    print(f"{'C program: first call (starts the runtime)':44} {first * 1e3:>6.2f} ms")
    print(f"{'C program: second call':44} {second * 1e6:>6.2f} us")


if __name__ == "__main__":
    main()
