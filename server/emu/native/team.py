"""The threads that run a launch's blocks: the launching thread and a team of helpers, who
hand blocks out among themselves in native code, without the GIL.

Why not a Python thread pool: on a virtual machine a thread's wake-up takes 20-30 us, and
Python code claiming blocks between native calls makes two threads wait on each other's
wake-ups for the GIL. A launch of 0.2 ms then gained nothing from a second thread. Here:
- The launching thread posts the launch as a *job* and starts on its blocks at once.
- Helpers are threads of their own that stay in native code: while launches come back to
  back (`BACK_TO_BACK_US`), after a job they keep looking for the next one for
  `MEMBER_SPIN_US` (as OpenMP's runtimes do), so a host loop's launches find them awake;
  otherwise they go to sleep on a condition the next launch signals.
- Every worker claims runs of blocks with an atomic add and runs them (`vgpu_work`): a
  share of what is left (guided, as OpenMP's schedule(guided)), so that workers end
  together, down to a smallest run of a block count / (32 x workers); the
  launching thread, out of blocks, takes the job down and waits until no helper is inside.

A job (int64 slots; one array per frame and number of workers, reused): 0 the next
unclaimed block, 1 the number of blocks, 2 the smallest claim, 3 the workers inside, 4 the
workers that joined (the launching thread is worker 0), 5 the workers the launch has
buffers for, 6 the kernel's run_blocks, 7 the launch record; then 7 slots a worker from
slot 8: its shared, local, spill, resume, fault and cache buffers (runner.py) and its
status (0, FAULTED or STOPPED).
The team (int64 slots): 0 the open job's address (0: none), 1 a serial bumped at each
posting (what idle helpers watch), 2 how many looks an idle helper makes before it sleeps
(set by the launching thread), 8 the helpers between reading slot 0 and counting
themselves inside that job: the launching thread waits for none to be there before its
job's memory may go.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import struct
import threading
import time

import numpy as np
from llvmlite import ir

from .codegen import FAULTED, I32, I64, P8, P32, P64
from .engine import (
    cache_key,
    compile_object,
    load_cached,
    load_functions,
    store_cached,
    target_triple,
)

__all__ = ["Job", "own_lines", "run"]

NEXT, BLOCKS, PER_CLAIM, INSIDE, JOINED, WORKERS, KERNEL, LAUNCH = range(8)
FIRST_WORKER, WORKER_SLOTS, STATUS = 8, 7, 6
OPEN_JOB, SERIAL, SPIN, READERS = 0, 1, 2, 8
MEMBER_SPIN_US = 100   # how long an idle helper keeps looking for the next launch, when
BACK_TO_BACK_US = 50   # the launches come this soon after the previous one's end
FINISH_SPIN_US = 500   # how long the launching thread spins for helpers' last runs
_STOP_SLOT = 10        # the launch record's stop flag (codegen.py): 2 once a worker faulted
_VERSION = "2"         # of _Builder's code, in the disk cache's key: bump when it changes

_KERNEL = ir.FunctionType(I32, [P64, P8, P8, P64, P32, I64, I64, P64, P64])
_WORK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64)
_MEMBER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
_POST = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_LEAD = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_native: dict[str, object] = {}
_lock = threading.Lock()          # guards _native
_teams: dict[int, _Team] = {}     # by their number of helpers
_teams_lock = threading.Lock()


_LINE = 128   # bytes: a cache line, or the pair an adjacent-line prefetcher fetches together


def own_lines(count: int, dtype) -> np.ndarray:
    """`count` zeros of `dtype` on cache lines no other array has: workers write their
    buffers at every block, and a line two workers write would bounce between their cores."""
    size = count * np.dtype(dtype).itemsize
    raw = np.zeros(size + 2 * _LINE, np.uint8)
    start = -raw.ctypes.data % _LINE
    return raw[start:start + size].view(dtype)


class _Builder:
    """The team's native functions, as one LLVM module."""

    def __init__(self, triple: str):
        self.module = ir.Module(name="vgpu_team")
        self.module.triple = ""
        if triple.startswith(("x86_64", "i686")):
            self.pause = (ir.Function(self.module, ir.FunctionType(ir.VoidType(), []),
                                      "llvm.x86.sse2.pause"), [])
        elif triple.startswith(("aarch64", "arm64")):
            self.pause = (ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I32]),
                                      "llvm.aarch64.hint"), [ir.Constant(I32, 1)])   # yield
        else:
            self.pause = None
        self.work = self._work()
        self.finish = self._finish()
        self._member()
        self._post()
        self._lead()

    @staticmethod
    def _slot(b, pointer, k):
        return b.gep(pointer, [k if isinstance(k, ir.Value) else ir.Constant(I64, k)])

    def _spin(self, b):
        if self.pause is not None:
            b.call(*self.pause)

    def _work(self) -> ir.Function:
        """i32 vgpu_work(job, k): worker k (counted inside by its caller) runs claimed runs
        of blocks until none are left or the kernel stops; stores its status, leaves."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [P64, I64]), "vgpu_work")
        job, k = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))

        def slot(n):
            return self._slot(b, job, n)
        base = b.add(ir.Constant(I64, FIRST_WORKER), b.mul(k, ir.Constant(I64, WORKER_SLOTS)))
        own = [b.add(base, ir.Constant(I64, n)) for n in range(WORKER_SLOTS)]
        shared, local, spill, resume, fault, cache = (
            b.inttoptr(b.load(slot(own[n])), ty)
            for n, ty in enumerate((P8, P8, P64, P32, P64, P64)))
        kernel = b.inttoptr(b.load(slot(KERNEL)), _KERNEL.as_pointer())
        launch = b.inttoptr(b.load(slot(LAUNCH)), P64)
        blocks, per_claim = b.load(slot(BLOCKS)), b.load(slot(PER_CLAIM))
        workers = b.load(slot(WORKERS))
        claim = fn.append_basic_block("claim")
        run = fn.append_basic_block("run")
        failed = fn.append_basic_block("failed")
        leave = fn.append_basic_block("leave")
        b.branch(claim)

        b.position_at_end(claim)
        # Guided: a worker's share of what is left (OpenMP's schedule(guided)), down to the
        # smallest claim (PER_CLAIM), so that workers end together; a stale look at NEXT
        # only makes a claim bigger or smaller. (Half a share a claim made twice as many
        # claims, and a 1M-thread saxpy on two threads 2 us slower: each claim costs a
        # cache line moving between the cores and a new stream for the prefetchers.)
        left = b.sub(blocks, b.load_atomic(slot(NEXT), "monotonic", 8))
        share = b.sdiv(left, workers)
        size = b.select(b.icmp_signed(">", share, per_claim), share, per_claim)
        first = b.atomic_rmw("add", slot(NEXT), size, "seq_cst")
        b.cbranch(b.icmp_signed("<", first, blocks), run, leave)

        b.position_at_end(run)
        following = b.add(first, size)
        end = b.select(b.icmp_signed("<", following, blocks), following, blocks)
        result = b.call(kernel, [launch, shared, local, spill, resume, first, end, fault,
                                 cache])
        b.cbranch(b.icmp_signed("==", result, ir.Constant(I32, 0)), claim, failed)

        b.position_at_end(failed)
        with b.if_then(b.icmp_signed("==", result, ir.Constant(I32, FAULTED))):
            # the others stop at their next block
            b.store_atomic(ir.Constant(I64, 2), self._slot(b, launch, _STOP_SLOT),
                           "monotonic", 8)
        stopped = b.block
        b.branch(leave)

        b.position_at_end(leave)
        status = b.phi(I32)
        status.add_incoming(ir.Constant(I32, 0), claim)
        status.add_incoming(result, stopped)
        b.store(b.sext(status, I64), slot(own[STATUS]))
        b.atomic_rmw("sub", slot(INSIDE), ir.Constant(I64, 1), "seq_cst")
        b.ret(status)
        return fn

    def _finish(self) -> ir.Function:
        """i32 vgpu_finish(team, job, looks): take the job down (unless another launch's
        replaced it) and look until no helper is reading the team's job slot or inside
        this job: 1 once so, 0 if still not after `looks` looks."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [P64, P64, I64]), "vgpu_finish")
        team, job, looks = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.cmpxchg(self._slot(b, team, OPEN_JOB), b.ptrtoint(job, I64), ir.Constant(I64, 0),
                  "seq_cst", "seq_cst")
        start = b.block
        look = fn.append_basic_block("look")
        again = fn.append_basic_block("again")
        idle = fn.append_basic_block("idle")
        busy = fn.append_basic_block("busy")
        b.branch(look)
        b.position_at_end(look)
        count = b.phi(I64)
        count.add_incoming(ir.Constant(I64, 0), start)
        readers = b.load_atomic(self._slot(b, team, READERS), "seq_cst", 8)
        inside = b.load_atomic(self._slot(b, job, INSIDE), "seq_cst", 8)
        b.cbranch(b.icmp_signed("==", b.or_(readers, inside), ir.Constant(I64, 0)), idle,
                  again)
        b.position_at_end(again)
        self._spin(b)
        following = b.add(count, ir.Constant(I64, 1))
        count.add_incoming(following, again)
        b.cbranch(b.icmp_signed("<", following, looks), look, busy)
        ir.IRBuilder(idle).ret(ir.Constant(I32, 1))
        ir.IRBuilder(busy).ret(ir.Constant(I32, 0))
        return fn

    def _member(self) -> None:
        """i64 vgpu_member(team, seen): a helper's life in native code: at each new serial,
        join the open job (if it still has room) and work; return the last serial seen once
        the team's SPIN slot's count of looks in a row found nothing new."""
        fn = ir.Function(self.module, ir.FunctionType(I64, [P64, I64]), "vgpu_member")
        team, seen0 = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
        start = b.block
        look = fn.append_basic_block("look")
        new = fn.append_basic_block("new")
        secured = fn.append_basic_block("secured")
        join = fn.append_basic_block("join")
        full = fn.append_basic_block("full")
        idle = fn.append_basic_block("idle")
        tired = fn.append_basic_block("tired")
        b.branch(look)

        b.position_at_end(look)
        seen, count = b.phi(I64), b.phi(I64)
        seen.add_incoming(seen0, start)
        count.add_incoming(zero, start)
        serial = b.load_atomic(self._slot(b, team, SERIAL), "acquire", 8)
        b.cbranch(b.icmp_signed("!=", serial, seen), new, idle)

        b.position_at_end(idle)
        self._spin(b)
        following = b.add(count, one)
        seen.add_incoming(seen, idle)
        count.add_incoming(following, idle)
        looks = b.load_atomic(self._slot(b, team, SPIN), "monotonic", 8)
        b.cbranch(b.icmp_signed("<", following, looks), look, tired)
        ir.IRBuilder(tired).ret(seen)

        b.position_at_end(new)   # count ourselves inside the open job before it may go
        readers = self._slot(b, team, READERS)
        b.atomic_rmw("add", readers, one, "seq_cst")
        address = b.load_atomic(self._slot(b, team, OPEN_JOB), "seq_cst", 8)
        job = b.inttoptr(address, P64)
        present = b.icmp_signed("!=", address, zero)
        with b.if_then(present):
            b.atomic_rmw("add", self._slot(b, job, INSIDE), one, "seq_cst")
        b.atomic_rmw("sub", readers, one, "seq_cst")
        after_new = b.block
        b.cbranch(present, secured, look)
        seen.add_incoming(serial, after_new)
        count.add_incoming(zero, after_new)

        b.position_at_end(secured)
        k = b.atomic_rmw("add", self._slot(b, job, JOINED), one, "seq_cst")
        b.cbranch(b.icmp_signed("<", k, b.load(self._slot(b, job, WORKERS))), join, full)

        b.position_at_end(join)
        b.call(self.work, [job, k])
        b.branch(look)
        seen.add_incoming(serial, join)
        count.add_incoming(zero, join)

        b.position_at_end(full)
        b.atomic_rmw("sub", self._slot(b, job, INSIDE), one, "seq_cst")
        b.branch(look)
        seen.add_incoming(serial, full)
        count.add_incoming(zero, full)

    def _post(self) -> None:
        """void vgpu_post(team, job): open the job to helpers and bump the serial."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64, P64]), "vgpu_post")
        team, job = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store_atomic(b.ptrtoint(job, I64), self._slot(b, team, OPEN_JOB), "seq_cst", 8)
        b.atomic_rmw("add", self._slot(b, team, SERIAL), ir.Constant(I64, 1), "seq_cst")
        b.ret_void()

    def _lead(self) -> None:
        """i32 vgpu_lead(team, job, looks): run worker 0's share of a posted job, finish."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [P64, P64, I64]), "vgpu_lead")
        team, job, looks = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.call(self.work, [job, ir.Constant(I64, 0)])
        b.ret(b.call(self.finish, [team, job, looks]))


def _functions() -> dict[str, object]:
    with _lock:
        if not _native:
            address = load_functions(_object(), ("vgpu_work", "vgpu_member", "vgpu_finish",
                                                 "vgpu_post", "vgpu_lead"))
            _native.update(work=_WORK(address["vgpu_work"]),
                           member=_MEMBER(address["vgpu_member"]),
                           finish=_LEAD(address["vgpu_finish"]),
                           post=_POST(address["vgpu_post"]),
                           lead=_LEAD(address["vgpu_lead"]))
            _native["looks_per_us"] = _calibrate(_native["member"])
        return _native


def _object() -> bytes:
    """The team's functions compiled, from the disk cache when there (a process's first
    compiled launch would otherwise spend some 25 ms compiling them)."""
    key = cache_key("team", _VERSION)
    cached = load_cached(key, ())
    if cached is not None:
        return cached[0]
    data = compile_object(str(_Builder(target_triple()).module))
    store_cached(key, data, {})
    return data


def _calibrate(member) -> float:
    """Looks per microsecond: a helper's idle look, timed on a team nobody posts to."""
    quiet = np.zeros(16, np.int64)
    looks = quiet[SPIN] = 20_000
    start = time.perf_counter()
    member(quiet.ctypes.data, 0)
    return looks / max((time.perf_counter() - start) * 1e6, 1.0)


class _Team:
    """`size` helper threads: daemons, stopped at exit (`_stop_teams`) so that none is
    still running compiled code while the interpreter tears its modules down."""

    def __init__(self, size: int):
        self.record = own_lines(16, np.int64)
        self.address = self.record.ctypes.data
        self._condition = threading.Condition()
        self._sleepers = 0
        self._stopping = False
        native = _functions()
        self.member_looks = int(MEMBER_SPIN_US * native["looks_per_us"])
        self.last_end = 0.0   # when the last launch through the team ended (perf_counter)
        self.spin = 0         # what the record's SPIN slot holds
        self.finish_looks = int(FINISH_SPIN_US * native["looks_per_us"])
        self._threads = [threading.Thread(target=self._helper, args=(native["member"],),
                                          daemon=True, name=f"vgpu-native-{k + 1}")
                         for k in range(size)]
        for thread in self._threads:
            thread.start()

    def _helper(self, member) -> None:
        seen = 0
        while not self._stopping:
            seen = member(self.address, seen)
            with self._condition:
                self._sleepers += 1
                # a job posted since the last look: no sleep (see `wake`)
                while self.record[SERIAL] == seen and not self._stopping:
                    self._condition.wait()
                self._sleepers -= 1

    def wake(self) -> None:
        """After a job is posted. A helper counts itself a sleeper before it looks at the
        serial, under the condition: one not counted yet will see the new serial."""
        if self._sleepers:
            with self._condition:
                self._condition.notify_all()

    def stop(self, timeout: float) -> None:
        """Helpers leave once they stop looking (MEMBER_SPIN_US after their last job)."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join(timeout)


def _team(helpers: int) -> _Team:
    with _teams_lock:
        if helpers not in _teams:
            _teams[helpers] = _Team(helpers)
        return _teams[helpers]


def _stop_teams() -> None:
    with _teams_lock:
        teams = list(_teams.values())
        _teams.clear()
    for team in teams:
        team.stop(1.0)   # a helper inside a kernel that long is left to the exit


def _forget_teams() -> None:
    """In a forked child: its parent's helpers are not there (nor maybe the lock's owner)."""
    global _teams_lock
    _teams.clear()
    _teams_lock = threading.Lock()


atexit.register(_stop_teams)
os.register_at_fork(after_in_child=_forget_teams)


class Job:
    """A launch's job for `workers` (runner.py's _Worker), reused by the next launch of the
    same frame: once `run` returns no helper holds it, as none can reach a job but through
    the team's slot, which `run` empties and waits out."""

    def __init__(self, kernel: int, launch: int, workers):
        self.slots = own_lines(FIRST_WORKER + WORKER_SLOTS * len(workers), np.int64)
        self.slots[WORKERS], self.slots[KERNEL], self.slots[LAUNCH] = (len(workers), kernel,
                                                                        launch)
        for k, worker in enumerate(workers):
            at = FIRST_WORKER + WORKER_SLOTS * k
            self.slots[at:at + STATUS] = (*worker.pointers, worker.fault_pointer,
                                          worker.cache_pointer)
        self.address = self.slots.ctypes.data
        self.workers = len(workers)
        self.statuses = self.slots[FIRST_WORKER + STATUS::WORKER_SLOTS]

    def joined(self) -> int:
        """How many workers ran the last launch: the first this many statuses are its (the
        others are from earlier launches)."""
        return min(int(self.slots[JOINED]), self.workers)


_START = struct.Struct("<5q")   # slots NEXT to JOINED


def run(job: Job, blocks: int, threads: int) -> None:
    """Run a launch's blocks on this thread and up to `threads - 1` helpers; each worker's
    status is then in `job.statuses`."""
    # this thread is worker 0, inside and joined from the start
    _START.pack_into(job.slots, 0, 0, blocks, max(1, blocks // (job.workers * 32)), 1, 1)
    native = _native or _functions()
    if job.workers == 1:
        native["work"](job.address, 0)
        return
    team = _teams.get(threads - 1) or _team(threads - 1)
    # Helpers keep looking after a job only while launches come back to back: between a
    # server's launches (a client's round trip) they would take a core from the client.
    started = time.perf_counter()
    spin = team.member_looks if started - team.last_end < BACK_TO_BACK_US * 1e-6 else 0
    if team.spin != spin:
        team.spin = team.record[SPIN] = spin
    native["post"](team.address, job.address)
    team.wake()
    if not native["lead"](team.address, job.address, team.finish_looks):
        while not native["finish"](team.address, job.address, team.finish_looks):
            time.sleep(0.0002)
    team.last_end = time.perf_counter()
