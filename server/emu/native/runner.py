"""Runs a compiled kernel: the launch record, per-worker buffers, blocks spread over the
workers of `team.py`, and faults turned into the interpreter's LaunchError and
memory-checker report, word for word.

A launch costs little besides its blocks: the launch record, each worker's buffers and the
team's job are kept between launches of the same shape (`_Frame`), and a cancelled launch
is stopped by `_watcher`, which sets the record's stop flag, so nobody polls the Event per
launch.
"""

from __future__ import annotations

import struct
import threading
import time

import numpy as np

from ..device_printf import DEFAULT_PRINTF_FIFO_BYTES
from ..errors import LaunchError
from ..memory import DENIED
from ..spaces import STRAYS_ALLOWED, STRAYS_FAULT, out_of_bounds
from . import control, device_io, team
from .codegen import FAULTED, SPACES, SYMBOL_SLOT, WHY
from .special_registers import CLOCK_SLOTS, GRAPH_SLOT, clock_slots
from .speculative import RUN_LANES

__all__ = ["NativeKernel"]

_LABEL = {"global": "__global__", "shared": "__shared__", "local": "__local__",
          "kparam": "__param__"}
_STRAY_MODE = {STRAYS_FAULT: 0, STRAYS_ALLOWED: 2}   # anything else: report the first
_KEPT_BYTES = 8 << 20   # a frame bigger than this is not kept for the next launch
# The launch record's slots (see codegen.py): those a launch's kernel and shape fix, written
# when a frame is bound to it, and those every launch writes.
_SHAPE, _SIZES = struct.Struct("<8q"), struct.Struct("<6q")    # slots 0-7, 20-25
_PER_LAUNCH = struct.Struct("<5q")                              # slots 8-12
_SIZES_AT, _PER_LAUNCH_AT = 20 * 8, 8 * 8


class _Watcher:
    """One thread for every running launch that can be cancelled: every 10 ms it sets the
    stop flag of those whose `cancelled` Event is set (the compiled code reads the flag at
    each block and every 65,536 backward branches). It sleeps while no such launch runs.
    A launch comes and goes under a plain lock (once `remove` returns, the thread no longer
    writes to its record, which the next launch of its shape reuses); only one that finds
    the thread asleep takes the condition, to wake it."""

    def __init__(self):
        self._running: dict[int, tuple] = {}
        self._lock = threading.Lock()          # guards _running
        self._changed = threading.Condition()  # where the thread sleeps
        self._asleep = True   # or not started
        self._thread: threading.Thread | None = None

    def add(self, launch: np.ndarray, cancelled) -> None:
        with self._lock:
            self._running[id(launch)] = (launch, cancelled)
        # The thread sets _asleep, under the condition, before it looks at _running a last
        # time: if it is not set yet, that look finds this launch.
        if self._asleep:
            with self._changed:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, daemon=True,
                                                    name="vgpu-native-cancel")
                    self._thread.start()
                    self._asleep = False
                self._changed.notify()

    def remove(self, launch: np.ndarray) -> None:
        with self._lock:
            self._running.pop(id(launch), None)

    def _watch(self) -> None:
        while True:
            if not self._running:
                with self._changed:
                    self._asleep = True
                    while not self._running:
                        self._changed.wait()
                    self._asleep = False
            with self._lock:
                for launch, cancelled in self._running.values():
                    if cancelled.is_set():
                        launch[10] = 1
            time.sleep(0.01)


_watcher = _Watcher()


class _Worker:
    """One worker's buffers: block-local memory, registers saved at barriers, thread states,
    its fault record and its global access sites' caches."""

    def __init__(self, kernel: NativeKernel, nthreads: int, shared_stride: int,
                 local_stride: int):
        self.arrays = (team.own_lines(max(shared_stride, 1), np.uint8),
                       team.own_lines(max(local_stride * nthreads, 1), np.uint8),
                       team.own_lines(kernel.spill * nthreads, np.int64),
                       team.own_lines(max(nthreads, RUN_LANES), np.int32))
        self.fault = team.own_lines(16, np.int64)
        self.cache = team.own_lines(3 * kernel.sites + 1, np.int64)
        self.nbytes = sum(a.nbytes for a in self.arrays) + self.cache.nbytes
        self.pointers = [a.ctypes.data for a in self.arrays]
        self.fault_pointer = self.fault.ctypes.data
        self.cache_pointer = self.cache.ctypes.data


class _Frame:
    """What one launch of a given shape uses: the launch record and a worker per thread that
    runs blocks (made as launches need them)."""

    def __init__(self, symbols: int, param_size: int):
        self.launch = team.own_lines(SYMBOL_SLOT + symbols, np.int64)   # workers read it
        self.launch[list(CLOCK_SLOTS)] = clock_slots()   # the process's, fixed
        self.launch_pointer = self.launch.ctypes.data
        # A copy of the launch's parameters, at an address the record keeps: a copy costs
        # less than finding the address of the caller's bytes through ctypes.
        self.params = team.own_lines(max(param_size, 1), np.uint8)
        self.params_view = memoryview(self.params)[:param_size]
        self.prepared = None   # the launch whose shape the record holds (see `bind`)
        self.workers: list[_Worker] = []
        self.jobs: dict[int, team.Job] = {}   # by the number of workers
        self.table = self.table_address = None   # the allocation table it last ran with
        self.nbytes = 0   # what its workers' buffers hold

    def bind(self, prepared, symbols: list[str]) -> None:
        """Write the record's slots that stay the same while `prepared` launches again."""
        launch, shape = self.launch, prepared.block_buffers
        _SHAPE.pack_into(launch, 0, *prepared.grid, *prepared.block, self.params.ctypes.data,
                         len(self.params_view))
        _SIZES.pack_into(launch, _SIZES_AT, prepared.shared_size, prepared.local_size,
                         prepared.shared_bytes, shape[1], shape[2], shape[0])
        for k, name in enumerate(symbols):
            launch[SYMBOL_SLOT + k] = prepared.symbols[name]
        self.prepared = prepared


class NativeKernel:
    def __init__(self, address: int, symbols: list[str], spill: int, sites: int):
        self.address = address   # run_blocks (codegen.py), which team.py's workers call
        self.symbols = symbols
        self.spill = spill      # int64 slots per thread in the spill buffer
        self.sites = sites
        self._frames: dict[tuple, list[_Frame]] = {}   # shape -> frames not in use
        self.calls_back: bool | None = None   # whether it prints, asserts, allocates, samples

    # Frames are taken and given back without a lock: list.pop and list.append are atomic.
    def _frame(self, shape: tuple, param_size: int) -> _Frame:
        try:
            return self._frames[shape].pop()
        except (KeyError, IndexError):
            return _Frame(len(self.symbols), param_size)

    def _keep(self, shape: tuple, frame: _Frame) -> None:
        if frame.nbytes <= _KEPT_BYTES:
            self._frames.setdefault(shape, []).append(frame)

    def run(self, prepared, params: bytes, memory, checker, strays: str, threads: int,
            cancelled, printf_fifo_bytes: int = DEFAULT_PRINTF_FIFO_BYTES,
            runtime=None, environment=None) -> tuple[str, str]:
        """Run every block; returns the printf output and the checker's report of a stray
        access ("" if none). Raises LaunchError as the interpreter does, and the executor's
        LaunchCancelled once `cancelled` is set. `environment`: the graph run the kernel
        is a node of (device_runtime.GraphEnvironment), or None."""
        shape = prepared.block_buffers
        frame = self._frame(shape, prepared.kernel.param_size)
        frame.launch[GRAPH_SLOT] = environment.graph if environment is not None else 0
        if self.calls_back is None:   # the kernel's (this object is its module's)
            self.calls_back = device_io.uses_callback(prepared.kernel)
        try:
            if not self.calls_back:
                return "", self._run(frame, prepared, params, memory, checker, strays,
                                     threads, cancelled, None)
            frame.launch[device_io.CALLBACK_SLOT] = device_io.callback_address()
            with device_io.Sink(frame.launch_pointer, prepared, memory, params,
                                printf_fifo_bytes, runtime) as sink:
                report = self._run(frame, prepared, params, memory, checker, strays,
                                   threads, cancelled, sink)
        finally:
            self._keep(shape, frame)
        failure = sink.failure(report)
        if failure is not None:
            raise failure
        return sink.output(), report

    def _job(self, frame: _Frame, workers: int, shape: tuple) -> team.Job:
        """The frame's job for this many workers, with the workers' buffers it lacks."""
        while len(frame.workers) < workers:
            frame.workers.append(_Worker(self, *shape))
            frame.nbytes += frame.workers[-1].nbytes
        frame.jobs[workers] = team.Job(self.address, frame.launch_pointer,
                                       frame.workers[:workers])
        return frame.jobs[workers]

    def _run(self, frame: _Frame, prepared, params, memory, checker, strays, threads,
             cancelled, sink) -> str:
        if frame.prepared is not prepared:
            frame.bind(prepared, self.symbols)
        frame.params_view[:] = params
        table = memory.native_table()
        launch = frame.launch
        if table is not frame.table:   # the allocations changed since its last launch
            frame.table, frame.table_address = table, table.ctypes.data
            for worker in frame.workers:
                worker.cache[:] = 0    # what the access sites' lookups found in the old ones
        _PER_LAUNCH.pack_into(launch, _PER_LAUNCH_AT, frame.table_address, len(table), 0,
                              _STRAY_MODE.get(strays, 1), 0)
        nblocks = prepared.nblocks
        count = threads if threads < nblocks else nblocks
        job = frame.jobs.get(count) or self._job(frame, count, prepared.block_buffers)
        if cancelled is not None:
            _watcher.add(launch, cancelled)
        try:
            team.run(job, nblocks, threads)
        finally:
            if cancelled is not None:
                _watcher.remove(launch)
        stopped = launch[10]   # 2 once a worker faulted, 1 once the launch was cancelled
        if stopped:
            self._raise_faults(frame, job, prepared, memory, checker, sink)
        if stopped == 1 or (cancelled is not None and cancelled.is_set()):
            from ..executor import LaunchCancelled
            raise LaunchCancelled
        return _stray_report(launch, prepared, memory, checker) if launch[12] else ""

    @staticmethod
    def _raise_faults(frame: _Frame, job: team.Job, prepared, memory, checker, sink) -> None:
        """Raise the fault of the first thread (by block, then thread) that faulted, if
        any: the interpreter, running blocks in order, would have stopped there."""
        faults = [frame.workers[k].fault.copy() for k in range(job.joined())
                  if job.statuses[k] == FAULTED]
        if not faults:
            return
        first = min(faults, key=lambda f: (int(f[5]), int(f[6])))
        report = _stray_report(frame.launch, prepared, memory, checker)
        if sink is not None and sink.error is not None and control.is_runtime(first[8]):
            raise LaunchError(sink.error.code, sink.error.message, output=sink.output(),
                              diagnostics=report)
        raise LaunchError(int(first[0]), _message(first, prepared, memory),
                          output=sink.output() if sink is not None else "", diagnostics=report)


def _coordinates(linear: int, dims) -> tuple[int, int, int]:
    return linear % dims[0], linear // dims[0] % dims[1], linear // (dims[0] * dims[1])


def _describe(prepared, memory, address, size, need, line, space, why, block, thread,
              access=0) -> str:
    from ..executor import fault_message
    head = f"Invalid {_LABEL[space]} {'read' if need == 1 else 'write'} of size {size} " \
           f"at 0x{address & 0xFFFF_FFFF_FFFF_FFFF:x}"
    if why == "misaligned":
        reason = "address is misaligned"
    elif why == "denied":
        reason = DENIED[access]
    elif space == "global":
        reason = out_of_bounds(memory, address & 0xFFFF_FFFF_FFFF_FFFF)
    else:
        reason = "address is out of bounds"
    return fault_message(head, reason, _coordinates(thread, prepared.block),
                         _coordinates(block, prepared.grid), prepared.kernel_name, line)


def _message(fault: np.ndarray, prepared, memory) -> str:
    values = [int(v) for v in fault]
    described = control.describe(values[8], values[1])
    if described is not None:
        from ..executor import fault_message
        return fault_message(*described, _coordinates(values[6], prepared.block),
                             _coordinates(values[5], prepared.grid), prepared.kernel_name,
                             values[4])
    return _describe(prepared, memory, values[1], values[2], values[3], values[4],
                     SPACES[values[7]], WHY[values[8]], values[5], values[6], values[9])


def _stray_report(launch: np.ndarray, prepared, memory, checker) -> str:
    """The checker's report of the launch's first stray access, "" if none."""
    if not launch[12] or checker is None:
        return ""
    address, size, need, line, space, block, thread = (int(v) for v in launch[13:20])
    message = _describe(prepared, memory, address, size, need, line, SPACES[space],
                        "out of bounds", block, thread)
    return checker.report(prepared.kernel_name, message)
