"""The threads that run a launch's blocks: the launching thread and a team of helpers, who
hand blocks out among themselves in native code, without the GIL.

Why not a Python thread pool: on a virtual machine a thread's wake-up takes 20-30 us, and
Python code claiming blocks between native calls makes two threads wait on each other's
wake-ups for the GIL. A launch of 0.2 ms then gained nothing from a second thread. Here:
- The launching thread posts the launch as a *job* and starts on its blocks at once.
- Helpers are threads of their own that never leave native code: while launches come back
  to back (`BACK_TO_BACK_US`), after a job they keep looking for the next one for
  `MEMBER_SPIN_US` (as OpenMP's runtimes do), so a host loop's launches find them awake;
  otherwise they sleep on a futex that the next posting rings, unless its launch is
  shorter than their wake-up would be (`RING_WORTH_US`). (Sleeping on a Python
  condition made a helper take the GIL at every sleep and wake-up, from the launching
  thread in the middle of its launch: launches a client's round trip apart ran slower on
  two threads than on one.)
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
(set by the launching thread), 3 the helpers asleep or about to be, 4 the stop flag,
5 the bell (an int32 futex word, rung for sleepers), 6 the CPU helpers are kept off (that of
the last posting; -1 before any), 7 the address of the CPUs the process
may use (a cpu_set_t), 8 the helpers between reading slot 0 and counting themselves inside
that job: the launching thread waits for none to be there before its job's memory may go,
9 the number of helpers, 10 the address of their thread ids (int64s).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import struct
import sys
import threading
import time

import numpy as np
from llvmlite import ir

from . import calls
from .codegen import (
    FAULTED,
    I1,
    I8,
    I32,
    I64,
    P8,
    P32,
    P64,
    WAKE_FUNCTION_SLOT,
    WAKE_SLOT,
)
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
(OPEN_JOB, SERIAL, SPIN, SLEEPERS, STOPPING, BELL, AVOIDED, CPUS, READERS, HELPERS,
 THREAD_IDS) = range(11)
_MASK_BYTES = 128   # a cpu_set_t: CPUs 0-1023
MEMBER_SPIN_US = 100   # how long an idle helper keeps looking for the next launch, when
BACK_TO_BACK_US = 50   # the launches come this soon after the previous one's end
FINISH_SPIN_US = 500   # how long the launching thread spins for helpers' last runs
RING_WORTH_US = 100    # the least work (one worker's time) a launch wakes sleepers for
_STOP_SLOT = 10        # the launch record's stop flag (codegen.py): 2 once a worker faulted

_KERNEL = ir.FunctionType(I32, [P64, P8, P8, P64, P32, I64, I64, P64, P64])
_WORK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64)
_MEMBER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
_POST = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_TEAM = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Linux's futex system call, by machine (the helpers sleep on it); elsewhere launches run
# on the launching thread alone.
_FUTEX_CALL = ({"x86_64": 202, "aarch64": 98, "riscv64": 98}.get(platform.machine())
               if sys.platform.startswith("linux") else None)
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129   # FUTEX_WAIT and FUTEX_WAKE, process-private
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
        self.member = self._member()
        self._lead()
        if _FUTEX_CALL is not None:   # helpers (Linux's system calls)
            self.ring = self._ring()
            self._post()
            self._helper()
            self._stop()

    @staticmethod
    def _blocks(fn, *names: str) -> list:
        """New basic blocks of `fn`, one per name, in order."""
        return [fn.append_basic_block(name) for name in names]

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
        claim, run, failed, leave = self._blocks(fn, "claim", "run", "failed", "leave")
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
        launch = b.inttoptr(b.load(self._slot(b, job, LAUNCH)), P64)   # nothing more to wake
        b.store_atomic(ir.Constant(I64, 0), self._slot(b, launch, WAKE_SLOT), "monotonic", 8)
        start = b.block
        look, again, idle, busy = self._blocks(fn, "look", "again", "idle", "busy")
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

    def _futex(self, b, operation: int, word, value) -> None:
        """The futex system call on the int32 at `word`."""
        syscall = self._libc("syscall", I64, [I64], var_arg=True)
        zero = ir.Constant(I64, 0)
        b.call(syscall, [ir.Constant(I64, _FUTEX_CALL), b.ptrtoint(word, I64),
                         ir.Constant(I64, operation), b.sext(value, I64), zero, zero, zero])

    def _libc(self, name: str, returns, arguments, var_arg: bool = False) -> ir.Function:
        """The C library's function `name`, declared once in the module."""
        return self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(returns, arguments, var_arg=var_arg), name)

    def _cpu(self, b):
        """The CPU this thread runs on (glibc's sched_getcpu: no system call)."""
        return b.sext(b.call(self._libc("sched_getcpu", I32, []), []), I64)

    def _keep_off(self, b, team, cpu, mask) -> None:
        """Let every helper run on the process's CPUs but `cpu` (where a process may use one
        CPU only, the system call refuses the empty set and nothing changes); `mask`: room
        for a cpu_set_t."""
        size = ir.Constant(I64, _MASK_BYTES)
        cpus = b.inttoptr(b.load(self._slot(b, team, CPUS)), P8)
        b.call(calls.memcpy(self.module), [mask, cpus, size, ir.Constant(I1, 0)])
        byte = b.gep(mask, [b.lshr(cpu, ir.Constant(I64, 3))])
        bit = b.trunc(b.shl(ir.Constant(I64, 1), b.and_(cpu, ir.Constant(I64, 7))), I8)
        b.store(b.and_(b.load(byte), b.not_(bit)), byte)
        thread_ids = b.inttoptr(b.load(self._slot(b, team, THREAD_IDS)), P64)
        helpers = b.load(self._slot(b, team, HELPERS))
        set_affinity = self._libc("sched_setaffinity", I32, [I32, I64, P8])
        start = b.block
        each, done = self._blocks(b.function, "each_helper", "helpers_kept_off")
        b.cbranch(b.icmp_signed(">", helpers, ir.Constant(I64, 0)), each, done)
        b.position_at_end(each)
        k = b.phi(I64)
        k.add_incoming(ir.Constant(I64, 0), start)
        b.call(set_affinity, [b.trunc(b.load(b.gep(thread_ids, [k])), I32), size, mask])
        following = b.add(k, ir.Constant(I64, 1))
        k.add_incoming(following, b.block)
        b.cbranch(b.icmp_signed("<", following, helpers), each, done)
        b.position_at_end(done)

    def _bell(self, b, team):
        return b.bitcast(self._slot(b, team, BELL), P32)

    def _ring(self) -> ir.Function:
        """void vgpu_ring(team): wake every sleeping helper."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64]), "vgpu_ring")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bell = self._bell(b, fn.args[0])
        b.atomic_rmw("add", bell, ir.Constant(I32, 1), "seq_cst")
        self._futex(b, _FUTEX_WAKE, bell, ir.Constant(I32, 0x7FFF_FFFF))
        b.ret_void()
        return fn

    def _helper(self) -> None:
        """void vgpu_helper(team): a helper thread's whole life: work and look for work
        (`vgpu_member`), sleep on the bell, until the stop flag is set. A helper counts
        itself a sleeper before it looks at the serial a last time, and a posting bumps the
        serial before it looks for sleepers: either the helper sees the new serial or the
        posting rings (and the futex wait returns at once if the bell rang since the
        helper read it)."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64]), "vgpu_helper")
        team = fn.args[0]
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        start = b.block
        loop, rest, sleep, awake, leave = self._blocks(fn, "loop", "rest", "sleep", "awake",
                                                      "leave")
        b.branch(loop)

        b.position_at_end(loop)
        seen = b.phi(I64)
        seen.add_incoming(ir.Constant(I64, 0), start)
        last = b.call(self.member, [team, seen])
        stopping = self._slot(b, team, STOPPING)
        b.cbranch(b.icmp_signed("!=", b.load_atomic(stopping, "seq_cst", 8),
                                ir.Constant(I64, 0)), leave, rest)

        b.position_at_end(rest)
        bell = self._bell(b, team)
        rung = b.load_atomic(bell, "seq_cst", 4)
        sleepers = self._slot(b, team, SLEEPERS)
        b.atomic_rmw("add", sleepers, ir.Constant(I64, 1), "seq_cst")
        quiet = b.and_(
            b.icmp_signed("==", b.load_atomic(self._slot(b, team, SERIAL), "seq_cst", 8),
                          last),
            b.icmp_signed("==", b.load_atomic(stopping, "seq_cst", 8), ir.Constant(I64, 0)))
        b.cbranch(quiet, sleep, awake)

        b.position_at_end(sleep)
        self._futex(b, _FUTEX_WAIT, bell, rung)
        b.branch(awake)

        b.position_at_end(awake)
        b.atomic_rmw("sub", sleepers, ir.Constant(I64, 1), "seq_cst")
        seen.add_incoming(last, awake)
        b.branch(loop)
        ir.IRBuilder(leave).ret_void()

    def _stop(self) -> None:
        """void vgpu_stop(team): set the stop flag and wake the sleepers, who leave."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64]), "vgpu_stop")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store_atomic(ir.Constant(I64, 1), self._slot(b, fn.args[0], STOPPING), "seq_cst", 8)
        b.call(self.ring, [fn.args[0]])
        b.ret_void()

    def _member(self) -> ir.Function:
        """i64 vgpu_member(team, seen): a helper between sleeps: at each new serial, join
        the open job (if it still has room) and work; return the last serial seen once the
        team's SPIN slot's count of looks in a row found nothing new."""
        fn = ir.Function(self.module, ir.FunctionType(I64, [P64, I64]), "vgpu_member")
        team, seen0 = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
        start = b.block
        look, new, secured, join, full, idle, tired = self._blocks(
            fn, "look", "new", "secured", "join", "full", "idle", "tired")
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
        return fn

    def _post(self) -> None:
        """void vgpu_post(team, job, ring): open the job to helpers, bump the serial, ring
        the bell if a helper sleeps and `ring` (else leave its launch record the means to
        ring it)."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [P64, P64, I64]),
                         "vgpu_post")
        team, job, ring = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        zero = ir.Constant(I64, 0)
        mask = b.bitcast(b.alloca(ir.ArrayType(I8, _MASK_BYTES)), P8)
        # Linux may wake a thread on its waker's CPU (on virtual machines, whose idle CPUs
        # look busy, it does): queued there behind the launch it came to help, a helper
        # waited until the launching thread was done, the other CPU idle. And a helper
        # kept off some other CPU has nowhere else to go when the launching thread moves
        # onto its own. So helpers are kept off the CPU the launching thread posts from
        # (system calls only when that is not the one they were kept off last).
        cpu = self._cpu(b)
        avoided = self._slot(b, team, AVOIDED)
        with b.if_then(b.icmp_signed("!=", cpu, b.load_atomic(avoided, "monotonic", 8))):
            b.store_atomic(cpu, avoided, "monotonic", 8)
            self._keep_off(b, team, cpu, mask)
        b.store_atomic(b.ptrtoint(job, I64), self._slot(b, team, OPEN_JOB), "seq_cst", 8)
        b.atomic_rmw("add", self._slot(b, team, SERIAL), ir.Constant(I64, 1), "seq_cst")
        sleepers = b.icmp_signed("!=", b.load_atomic(self._slot(b, team, SLEEPERS), "seq_cst",
                                                     8), zero)
        # A launch that leaves sleepers asleep (expected short) has its kernel wake them
        # should a thread run long after all (codegen.py's loop_check).
        launch = b.inttoptr(b.load(self._slot(b, job, LAUNCH)), P64)
        b.store(b.ptrtoint(self.ring, I64), self._slot(b, launch, WAKE_FUNCTION_SLOT))
        left_asleep = b.and_(sleepers, b.icmp_signed("==", ring, zero))
        b.store_atomic(b.select(left_asleep, b.ptrtoint(team, I64), zero),
                       self._slot(b, launch, WAKE_SLOT), "release", 8)
        with b.if_then(b.and_(sleepers, b.icmp_signed("!=", ring, zero))):
            b.call(self.ring, [team])
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
            names = {"work": _WORK, "member": _MEMBER, "finish": _LEAD, "lead": _LEAD}
            if _FUTEX_CALL is not None:
                names.update(post=_POST, helper=_TEAM, stop=_TEAM)
            address = load_functions(_object(), [f"vgpu_{name}" for name in names])
            _native.update({name: kind(address[f"vgpu_{name}"])
                            for name, kind in names.items()})
            _native["looks_per_us"] = _calibrate(_native["member"])
        return _native


def _object() -> bytes:
    """The team's functions compiled, from the disk cache when there (a process's first
    compiled launch would otherwise spend some 25 ms compiling them)."""
    key = cache_key("team")
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
        self._cpus = np.zeros(_MASK_BYTES, np.uint8)   # the CPUs the process may use
        for cpu in os.sched_getaffinity(0):
            if cpu < 8 * _MASK_BYTES:
                self._cpus[cpu // 8] |= 1 << cpu % 8
        self.record[CPUS] = self._cpus.ctypes.data
        native = _functions()
        self._stop = native["stop"]
        self.member_looks = int(MEMBER_SPIN_US * native["looks_per_us"])
        self.last_end = 0.0   # when the last launch through the team ended (perf_counter)
        self.spin = 0         # what the record's SPIN slot holds
        self.finish_looks = int(FINISH_SPIN_US * native["looks_per_us"])
        # each runs vgpu_helper to its end, in native code (ctypes lets the GIL go)
        self._threads = [threading.Thread(target=native["helper"], args=(self.address,),
                                          daemon=True, name=f"vgpu-native-{k + 1}")
                         for k in range(size)]
        self._thread_ids = own_lines(size, np.int64)   # for the posting's sched_setaffinity
        for k, thread in enumerate(self._threads):
            thread.start()
            self._thread_ids[k] = thread.native_id   # known once start() returns
        self.record[THREAD_IDS] = self._thread_ids.ctypes.data
        self.record[HELPERS] = size
        self.record[AVOIDED] = -1   # none yet: the first posting keeps them off its CPU

    def stop(self, timeout: float) -> None:
        """Sleeping helpers leave at once, the others once they stop looking
        (MEMBER_SPIN_US after their last job)."""
        self._stop(self.address)
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
        self.block_seconds = float("inf")   # a block's time on one worker, last launch

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
    if job.workers == 1 or _FUTEX_CALL is None:   # no helpers that can sleep: no helpers
        native["work"](job.address, 0)
        return
    team = _teams.get(threads - 1) or _team(threads - 1)
    # Helpers keep looking after a job only while launches come back to back: between a
    # server's launches (a client's round trip) they would take a core from the client.
    started = time.perf_counter()
    back_to_back = started - team.last_end < BACK_TO_BACK_US * 1e-6
    spin = team.member_looks if back_to_back else 0
    if team.spin != spin:
        team.spin = team.record[SPIN] = spin
    # Waking sleeping helpers costs this thread a system call (7-9 us on a virtual machine,
    # where they joined some 45 us later): worth it for a launch that takes longer, or for
    # the first of launches back to back (the helpers then keep looking between them).
    ring = back_to_back or job.block_seconds * blocks >= RING_WORTH_US * 1e-6
    native["post"](team.address, job.address, ring)
    if not native["lead"](team.address, job.address, team.finish_looks):
        while not native["finish"](team.address, job.address, team.finish_looks):
            time.sleep(0.0002)
    team.last_end = time.perf_counter()
    job.block_seconds = (team.last_end - started) * job.joined() / blocks
