"""Runs a compiled kernel: the launch record, per-worker buffers, blocks spread over a pool of
native threads (the compiled code holds no GIL: ctypes releases it), and faults turned into
the interpreter's LaunchError and memory-checker report, word for word."""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from ..device_printf import DEFAULT_PRINTF_FIFO_BYTES
from ..errors import LaunchError
from ..memory import DENIED
from ..spaces import STRAYS_ALLOWED, STRAYS_FAULT, out_of_bounds
from . import control, device_io
from .codegen import FAULTED, SPACES, STOPPED, SYMBOL_SLOT, WHY
from .special_registers import CLOCK_SLOTS, clock_slots

__all__ = ["NativeKernel"]

_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 5, ctypes.c_int64,
                              ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
_LABEL = {"global": "__global__", "shared": "__shared__", "local": "__local__",
          "kparam": "__param__"}
_STRAY_MODE = {STRAYS_FAULT: 0, STRAYS_ALLOWED: 2}   # anything else: report the first
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="vgpu-native")
        return _pools[threads]


class NativeKernel:
    def __init__(self, address: int, symbols: list[str], spill: int, sites: int):
        self.function = _SIGNATURE(address)
        self.symbols = symbols
        self.spill = spill      # int64 slots per thread in the spill buffer
        self.sites = sites

    def run(self, prepared, params: bytes, memory, checker, strays: str, threads: int,
            cancelled, printf_fifo_bytes: int = DEFAULT_PRINTF_FIFO_BYTES,
            runtime=None) -> tuple[str, str]:
        """Run every block; returns the printf output and the checker's report of a stray
        access ("" if none). Raises LaunchError as the interpreter does, and the executor's
        LaunchCancelled once `cancelled` is set."""
        launch = np.zeros(SYMBOL_SLOT + len(self.symbols), np.int64)
        if not device_io.uses_callback(prepared.kernel):
            return "", self._run(launch, prepared, params, memory, checker, strays, threads,
                                 cancelled, None)
        launch[device_io.CALLBACK_SLOT] = device_io.callback_address()
        with device_io.Sink(launch.ctypes.data, prepared, memory, params,
                            printf_fifo_bytes, runtime) as sink:
            report = self._run(launch, prepared, params, memory, checker, strays, threads,
                               cancelled, sink)
        failure = sink.failure(report)
        if failure is not None:
            raise failure
        return sink.output(), report

    def _run(self, launch, prepared, params, memory, checker, strays, threads, cancelled,
             sink) -> str:
        grid, block = prepared.grid, prepared.block
        nthreads = block[0] * block[1] * block[2]
        nblocks = grid[0] * grid[1] * grid[2]
        parameters = np.frombuffer(params, np.uint8) if params else np.zeros(1, np.uint8)
        table = memory.native_table()
        launch[0:6] = (*grid, *block)
        launch[6:10] = (parameters.ctypes.data, len(params), table.ctypes.data, len(table))
        launch[11] = _STRAY_MODE.get(strays, 1)
        shared_stride = prepared.shared_stride if prepared.shared_size else 0
        local_stride = prepared.local_stride if prepared.local_size else 0
        launch[20:26] = (prepared.shared_size, prepared.local_size, prepared.shared_bytes,
                         shared_stride, local_stride, nthreads)
        launch[list(CLOCK_SLOTS)] = clock_slots()
        for k, name in enumerate(self.symbols):
            launch[SYMBOL_SLOT + k] = prepared.symbols[name]
        workers = max(1, min(threads, nblocks))
        per_claim = max(1, nblocks // (workers * 8))
        claims = iter(range(0, nblocks, per_claim))
        claim_lock = threading.Lock()
        faults: list[np.ndarray] = []

        def worker() -> int:
            shared = np.zeros(max(shared_stride, 1), np.uint8)
            local = np.zeros(max(local_stride * nthreads, 1), np.uint8)
            spill = np.zeros(self.spill * nthreads, np.int64)
            resume = np.zeros(nthreads, np.int32)
            fault = np.zeros(16, np.int64)
            cache = np.zeros(3 * self.sites + 1, np.int64)
            pointers = [a.ctypes.data for a in (launch, shared, local, spill, resume)]
            while True:
                with claim_lock:
                    first = next(claims, None)
                if first is None:
                    return 0
                status = self.function(*pointers, first, min(first + per_claim, nblocks),
                                       fault.ctypes.data, cache.ctypes.data)
                if status == FAULTED:
                    launch[10] = 2            # the other workers stop
                    faults.append(fault)
                    return status
                if status == STOPPED:
                    return status

        if workers == 1 and cancelled is None:
            worker()
        else:
            futures = [_pool(threads).submit(worker) for _ in range(workers)]
            while wait(futures, timeout=0.05).not_done:
                if cancelled is not None and cancelled.is_set():
                    launch[10] = 1
            for future in futures:
                future.result()
        if faults:
            first = min(faults, key=lambda f: (int(f[5]), int(f[6])))
            if sink is not None and sink.error is not None and control.is_runtime(first[8]):
                raise LaunchError(sink.error.code, sink.error.message, output=sink.output(),
                                  diagnostics=_stray_report(launch, prepared, memory, checker))
            raise LaunchError(int(first[0]), _message(first, prepared, memory),
                              output=sink.output() if sink is not None else "",
                              diagnostics=_stray_report(launch, prepared, memory, checker))
        if launch[10] == 1 or (cancelled is not None and cancelled.is_set()):
            from ..executor import LaunchCancelled
            raise LaunchCancelled
        return _stray_report(launch, prepared, memory, checker)


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
    if not launch[12] or checker is None:
        return ""
    address, size, need, line, space, block, thread = (int(v) for v in launch[13:20])
    message = _describe(prepared, memory, address, size, need, line, SPACES[space],
                        "out of bounds", block, thread)
    return checker.report(prepared.kernel_name, message)
