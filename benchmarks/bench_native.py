"""Benchmarks of the emulator's native compiler (server/emu/native); prints a table.

    python benchmarks/bench_native.py

Every figure is a ratio against a baseline measured in the same run: the same loop compiled
by the host's C compiler (cc -O2) for the one-thread Collatz walk and the matrix multiply,
numpy's `a * x + y` on the same arrays for the 1M-thread saxpy, the interpreter's launch of
the same kernel for the small launch (bench_emu's `straight`: 1 block of 256 threads, 110
instructions each, `launch()` to completion). The interpreter's figures are in the table
too (Collatz on a shorter range: the full one takes it most of a minute). Scaling rows
divide one thread's time by two threads', measured in interleaved rounds. For the saxpy,
the same rounds run the loop in C, vectorized, on the kernel's own bytes: on OpenMP threads
(a C program's way to use two cores) and on two threads with fixed halves and nothing
between the loops (what the machine's cores and memory allow at best), where cc has
OpenMP.
Kernels are compiled with nvcc (PATH, or the nvidia-cuda-nvcc wheel).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_emu import SOURCE as EMU_SOURCE
from bench_emu import Device, compile_ptx

from vgpu.server.emu import PtxModule, launch, native, prepare

SOURCE = r"""
extern "C" {
__global__ void collatz(unsigned long long* steps, int limit) {
    unsigned long long total = 0;
    for (int n = 1; n <= limit; ++n) {
        unsigned long long x = n;
        while (x != 1) { x = (x & 1) ? 3 * x + 1 : x >> 1; ++total; }
    }
    *steps = total;
}
__global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
}
"""

C_SOURCE = r"""
unsigned long long collatz(int limit) {
    unsigned long long total = 0;
    for (int n = 1; n <= limit; ++n) {
        unsigned long long x = n;
        while (x != 1) { x = (x & 1) ? 3 * x + 1 : x >> 1; ++total; }
    }
    return total;
}
void matmul(const float* A, const float* B, float* C, int n) {
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int k = 0; k < n; ++k) acc += A[i * n + k] * B[k * n + j];
            C[i * n + j] = acc;
        }
}
"""
LIMIT = 20_000
INTERPRETED_LIMIT = 300


# What two cores can do for a stream, from the saxpy loop in C vectorized for this CPU:
# - on one and two OpenMP threads (whose runtime keeps its threads spinning between loops,
#   as the emulator's helpers do), the way a C program would run it on two cores;
# - on two threads each looping over a fixed half, the helper spinning between runs, and
#   nothing between the loops but handing the helper its half: the machine's floor.
# The same rounds time the compiled kernel and both (the machine's state drifts), so the
# helpers that spin between runs sleep after IDLE_NS, leaving the next variant a free core
# (OpenMP's by GOMP_SPINCOUNT, set before its runtime loads).
STREAM_SOURCE = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

void saxpy(int n, float a, const float* x, float* y, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
}

#define IDLE_NS 200000
static struct { int n; float a; const float* x; float* y; } job;
static atomic_long posted, finished;
static atomic_int sleeping;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bell = PTHREAD_COND_INITIALIZER;

static void half(int first, int end) {
    for (int i = first; i < end; ++i) job.y[i] = job.a * job.x[i] + job.y[i];
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void* helper(void* unused) {
    long seen = 0;
    for (;;) {
        long long idle_since = now_ns();
        while (atomic_load(&posted) == seen)
            if (now_ns() - idle_since > IDLE_NS) {
                pthread_mutex_lock(&lock);
                /* counted asleep before a last look: a posting either sees it or is seen */
                atomic_store(&sleeping, 1);
                while (atomic_load(&posted) == seen) pthread_cond_wait(&bell, &lock);
                atomic_store(&sleeping, 0);
                pthread_mutex_unlock(&lock);
            }
        seen = atomic_load(&posted);
        half(job.n / 2, job.n);
        atomic_store(&finished, seen);
    }
    return unused;
}

void saxpy_halves(int n, float a, const float* x, float* y, int threads) {
    static pthread_t thread;
    job.n = n, job.a = a, job.x = x, job.y = y;
    if (threads == 1) {
        half(0, n);
        return;
    }
    if (!thread) pthread_create(&thread, 0, helper, 0);
    long serial = atomic_fetch_add(&posted, 1) + 1;
    if (atomic_load(&sleeping)) {
        pthread_mutex_lock(&lock);
        pthread_cond_signal(&bell);
        pthread_mutex_unlock(&lock);
    }
    half(0, n / 2);
    while (atomic_load(&finished) != serial) {}
}
"""
FLOOR = "C, fixed halves, spinning helper"
# OpenMP's threads spin this many looks (some 0.1-0.3 ms) after a loop, then sleep.
GOMP_SPINCOUNT = "10000"


def _compiler() -> str:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def host_library(directory: str) -> ctypes.CDLL:
    source = Path(directory) / "loops.c"
    source.write_text(C_SOURCE)
    library = Path(directory) / "loops.so"
    subprocess.run([_compiler(), "-O2", "-shared", "-fPIC", str(source), "-o", str(library)],
                   check=True)
    loops = ctypes.CDLL(str(library))
    loops.collatz.restype = ctypes.c_ulonglong
    return loops


def stream_library(directory: str) -> ctypes.CDLL | None:
    """STREAM_SOURCE built with OpenMP, or None where the compiler has no OpenMP."""
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    source = Path(directory) / "stream.c"
    source.write_text(STREAM_SOURCE)
    library = Path(directory) / "stream.so"
    built = subprocess.run([_compiler(), "-O3", "-march=native", "-fopenmp", "-pthread",
                            "-shared", "-fPIC", str(source), "-o", str(library)],
                           capture_output=True)
    if built.returncode != 0:
        return None
    stream = ctypes.CDLL(str(library))
    for loop in (stream.saxpy, stream.saxpy_halves):
        loop.argtypes = [ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int]
    return stream


def timed(fn, repeat: int) -> tuple[float, float]:
    """(best, median) seconds: the machine is shared, so both are reported."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def interleaved(variants: dict, rounds: int = 5, repeat: int = 9) -> dict:
    """(best, median) seconds of each variant ((setup, fn) by name), in `rounds` rounds that
    run every variant `repeat` times in turn: the machine's state drifts over seconds (the
    same process runs a memory-bound loop 1.5x faster in one minute than in the next), and
    interleaving gives each variant the same share of it."""
    times: dict = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (setup, fn) in variants.items():
            setup()
            for _ in range(repeat):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


# Launches in a row per variant and round, for the scaling rows: after a stretch on one
# thread the first launches on two are slow (the helper, which between a server's
# launches sleeps to leave its core to others, wakes, and its idle core takes a while to
# get back up to speed: with 9 in a row a 1M saxpy on two threads took 60-67 us at best,
# with 30 46-48 us, as a program launching in a loop sees it).
IN_A_ROW = 30


def launcher(module, device, kernel, grid, block, params: bytes):
    """A function that launches the compiled kernel, after a first launch (which touches
    fresh pages)."""
    prepared = prepare(module, kernel, grid, block)
    prepared.run(params, device.memory)
    return lambda: prepared.run(params, device.memory)


def on_threads(module, device, kernel, grid, block, params: bytes) -> dict:
    """A compiled kernel on one and on two threads, interleaved: {threads: (best, median)}."""
    launch = launcher(module, device, kernel, grid, block, params)
    return interleaved({threads: (lambda t=threads: native.configure(threads=t), launch)
                        for threads in (1, 2)}, repeat=IN_A_ROW)


# Between a server's launches come a client's round trips: the helpers sleep, and each
# launch wakes them. Launches this far apart, timed one by one.
APART_SECONDS = 0.002


def apart(module, device, kernel, grid, block, params: bytes, rounds: int = 10,
          launches: int = 10) -> dict:
    """Launches APART_SECONDS apart on one and on two threads, in alternating rounds:
    {threads: (best, median)}."""
    launch = launcher(module, device, kernel, grid, block, params)
    times: dict = {1: [], 2: []}
    for _ in range(rounds):
        for threads, seconds in times.items():
            native.configure(threads=threads)
            for _ in range(launches):
                time.sleep(APART_SECONDS)
                start = time.perf_counter()
                launch()
                seconds.append(time.perf_counter() - start)
    return {threads: (min(t), statistics.median(t)) for threads, t in times.items()}


def run(module, device, kernel, grid, block, params: bytes, threads: int = 1):
    native.configure(threads=threads)
    return timed(launcher(module, device, kernel, grid, block, params), 9)


def parameters(module, kernel: str, *fields: bytes) -> bytes:
    """A kernel's parameter buffer: `fields` in order, padded to its size."""
    packed = b"".join(fields)
    return packed + b"\0" * (module.kernels[kernel].param_size - len(packed))


def row(name: str, seconds, baseline, unit: float = 1e3, suffix: str = "ms"):
    """A table row: best / median time and their ratios to the baseline's."""
    best, median = seconds
    ratio = f"{best / baseline[0]:.2f} / {median / baseline[1]:.2f}" if baseline else "1"
    return (name, f"{best * unit:.2f} / {median * unit:.2f} {suffix}", ratio)


def scaling(name: str, seconds: dict) -> tuple[str, str, str]:
    """A table row: one thread's time over two threads' (best / median)."""
    one, two = seconds[1], seconds[2]
    return (name, "", f"{one[0] / two[0]:.2f} / {one[1] / two[1]:.2f}")


def main() -> None:
    directory = tempfile.mkdtemp()
    os.environ["VGPU_CACHE_DIR"] = directory   # a cold cache: the compile time is measured
    loops = host_library(directory)
    stream = stream_library(directory)
    ptx = compile_ptx(SOURCE + EMU_SOURCE)   # bench_emu's matmul
    rows: list[tuple[str, str, str]] = []

    # Collatz, one thread; the interpreter first (the compiler is on by default)
    native.configure(enabled=False)
    device = Device()
    out = device.upload(np.zeros(1, np.uint64))
    interpreted = PtxModule.parse(ptx)
    short = out.to_bytes(8, "little") + INTERPRETED_LIMIT.to_bytes(4, "little")
    interpreter = timed(lambda: prepare(interpreted, "collatz", 1, 1).run(short, device.memory),
                        3)
    short_steps = loops.collatz(INTERPRETED_LIMIT)
    native.configure(enabled=True)
    module = PtxModule.parse(ptx)
    start = time.perf_counter()
    prepare(module, "collatz", 1, 1)
    collatz_compile = time.perf_counter() - start
    params = out.to_bytes(8, "little") + LIMIT.to_bytes(4, "little")
    compiled = run(module, device, "collatz", 1, 1, params)
    steps = int(np.frombuffer(device.memory.read(out, 8), np.uint64)[0])
    assert steps == loops.collatz(LIMIT), "the compiled kernel disagrees with C"
    host = timed(lambda: loops.collatz(LIMIT), 9)
    rows.append(row(f"Collatz 1..{LIMIT}, one thread, {steps:,} iterations: C (cc -O2)", host,
                    None))
    rows.append(row("  compiled kernel", compiled, host))
    per_iteration = tuple(t / short_steps * steps for t in interpreter)
    rows.append(row(f"  interpreter (1..{INTERPRETED_LIMIT}, scaled to {LIMIT})",
                    per_iteration, host, 1, "s"))

    # saxpy, 1M threads, and 16M (where two threads have enough work to share: 1M
    # threads take about 0.2 ms, near what handing half of them to a second thread costs)
    for n in (1 << 20, 1 << 24):
        rng = np.random.default_rng(0)
        x, y = rng.random(n, np.float32), rng.random(n, np.float32)
        a = np.float32(2.5)
        dx, dy = device.upload(x), device.upload(y)
        params = parameters(module, "saxpy", a.tobytes(), bytes(4), dx.to_bytes(8, "little"),
                            dy.to_bytes(8, "little"), n.to_bytes(4, "little"))
        baseline = timed(lambda a=a, x=x, y=y: a * x + y, 21)
        rows.append(row(f"saxpy, {n >> 20}M threads of 256: numpy a * x + y", baseline, None))
        launch_saxpy = launcher(module, device, "saxpy", (n // 256,), (256,), params)
        variants = {("compiled", threads): (lambda t=threads: native.configure(threads=t),
                                            launch_saxpy) for threads in (1, 2)}
        if stream is not None:   # on the kernel's own bytes: the same pages, placed the same
            hx, hy = (np.frombuffer(device.memory.view(v, n * 4), np.float32).ctypes.data
                      for v in (dx, dy))
            for name, loop in (("C -O3 -march=native, OpenMP", stream.saxpy),
                               (FLOOR, stream.saxpy_halves)):
                variants.update({(name, threads): (lambda: None, lambda loop=loop, t=threads,
                                                   n=n, a=a, hx=hx, hy=hy: loop(n, a, hx, hy, t))
                                 for threads in (1, 2)})
        timings = interleaved(variants, repeat=IN_A_ROW)
        for name in dict.fromkeys(name for name, _ in variants):
            for threads in (1, 2):
                rows.append(row(f"  {name}, {threads} thread(s)", timings[name, threads],
                                baseline, 1e6, "us"))
            rows.append(scaling(f"  two threads against one: {name}",
                                {threads: timings[name, threads] for threads in (1, 2)}))
        if stream is not None:
            rows.append(row("  two threads, compiled against C's fixed halves",
                            timings["compiled", 2], timings[FLOOR, 2], 1e6, "us"))
        if n == 1 << 20:
            rows.append(scaling(f"  two threads against one, launches {APART_SECONDS * 1e3:g} ms "
                                f"apart", apart(module, device, "saxpy", (n // 256,), (256,),
                                                params)))
            native.configure(enabled=False)
            rows.append(row("  interpreter", run(interpreted, device, "saxpy", (n // 256,),
                                                 (256,), params), baseline))
            native.configure(enabled=True)

    # a small launch, launch to completion (prepare included, as the server's first launch
    # of a shape; later launches reuse the prepared shape)
    data = device.upload(np.arange(256, dtype=np.uint32))
    floats = device.upload(np.ones(256, np.float32))
    params = data.to_bytes(8, "little") + floats.to_bytes(8, "little")

    def small(which):
        return lambda: launch(which, "straight", (1,), (256,), params=params,
                              memory=device.memory)
    native.configure(enabled=False)
    interpreted_small = timed(small(interpreted), 50)
    native.configure(enabled=True, threads=1)
    small(module)()
    rows.append(row("1 block x 256 threads, 110 instructions, launch to completion: "
                    "interpreter", interpreted_small, None, 1e6, "us"))
    rows.append(row("  compiled", timed(small(module), 200), interpreted_small, 1e6, "us"))

    # matmul 256x256
    size = 256
    A = rng.standard_normal((size, size)).astype(np.float32)
    B = rng.standard_normal((size, size)).astype(np.float32)
    C = np.zeros((size, size), np.float32)
    dA, dB, dC = device.upload(A), device.upload(B), device.upload(C)

    def matmul_params(n: int) -> bytes:   # A, B, C as n x n matrices
        return parameters(module, "matmul", *(v.to_bytes(8, "little") for v in (dA, dB, dC)),
                          n.to_bytes(4, "little"))
    params = matmul_params(size)
    pointer = ctypes.POINTER(ctypes.c_float)
    host = timed(lambda: loops.matmul(A.ctypes.data_as(pointer), B.ctypes.data_as(pointer),
                                      C.ctypes.data_as(pointer), size), 5)
    start = time.perf_counter()
    prepare(module, "matmul", (size // 16, size // 16), (16, 16))
    cold = time.perf_counter() - start
    rows.append(row("tiled matmul 256x256 (16x16 tiles, barriers): C triple loop", host, None))
    compiled = on_threads(module, device, "matmul", (size // 16, size // 16), (16, 16), params)
    for threads, seconds in compiled.items():
        rows.append(row(f"  compiled, {threads} thread(s)", seconds, host))
    rows.append(scaling("  two threads against one: compiled", compiled))
    got = np.frombuffer(device.memory.read(dC, C.nbytes), np.float32).reshape(size, size)
    np.testing.assert_allclose(got, A @ B, rtol=1e-3, atol=1e-3)
    small = size // 2   # 2 ms on one thread: what waking the helpers gains at that length
    rows.append(scaling(f"  two threads against one, {small}x{small}, launches "
                        f"{APART_SECONDS * 1e3:g} ms apart",
                        apart(module, device, "matmul", (small // 16, small // 16), (16, 16),
                              matmul_params(small))))
    cached, next_cached = cached_compile_seconds(ptx, directory)
    rows.append(("compile matmul: cold / from the disk cache (new process)",
                 f"{cold * 1e3:.0f} / {cached * 1e3:.1f} ms", f"{cached / cold:.3f}"))
    rows.append(("  the next kernel from the disk cache (saxpy, same process)",
                 f"{next_cached * 1e3:.2f} ms", ""))
    rows.append(("compile collatz: cold", f"{collatz_compile * 1e3:.0f} ms", ""))
    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'best / median':>24}  ratio (best / median)")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:>24}  {ratio}")
    shutil.rmtree(directory, ignore_errors=True)


def cached_compile_seconds(ptx: str, directory: str) -> tuple[float, float]:
    """The first prepare() of matmul in a new process whose disk cache holds it (the
    process's first kernel: loading LLVM and the compiler's modules is part of it), and of
    saxpy after it (what each further kernel costs)."""
    script = ("import sys, time\n"
              "from vgpu.server.emu import PtxModule, native, prepare\n"
              "native.configure(enabled=True)\n"
              "module = PtxModule.parse(sys.stdin.read())\n"
              "for name, shape in (('matmul', (16, 16)), ('saxpy', (4,))):\n"
              "    start = time.perf_counter()\n"
              "    assert prepare(module, name, shape, shape).native is not None\n"
              "    print(time.perf_counter() - start)\n")
    result = subprocess.run([sys.executable, "-c", script], input=ptx, text=True,
                            capture_output=True, check=True,
                            env={**os.environ, "VGPU_CACHE_DIR": directory})
    first, following = map(float, result.stdout.split())
    return first, following


if __name__ == "__main__":
    main()
