"""printf (vprintf), assert (__assertfail), malloc and free in compiled code: the thread
calls back into Python, which formats and records as the interpreter's built-ins do
(ops_builtin.py), so the output, its order (block, thread, call), the FIFO limit and the
assert lines are the interpreter's; malloc and free use the launch's device heap
(device_runtime.py) as the interpreter's do, one thread at a time (the heap's first fit
gives other addresses than the interpreter's lane order when threads allocate in loops).

The compiled code calls one process-wide ctypes callback, whose address the runner puts in
the launch record (CALLBACK_SLOT: a cached object works in any process), with the launch
record's address, which names the launch's `Sink`. A call takes the GIL: printf is slow
next to compiled code, as it is on a GPU. A failed assert records CUDA's line and ends the
thread; the launch runs to its end (so every thread prints what it would before the
interpreter's failing group) and then fails with 710, the first line (block, thread order)
its message, every line for stderr. A string or argument pointer outside memory ends the
thread with the interpreter's fault (700), a bad free the heap's.
"""

from __future__ import annotations

import ctypes
import threading

from llvmlite import ir

from ..address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from ..device_printf import ArgumentBuffer, fifo_record_size, format_printf, within_fifo
from ..errors import CUDA_ERROR_ASSERT, LaunchError
from ..executor import fault_message
from ..ptx_types import TYPES
from ..state import Fault
from . import control, surfaces, textures
from .codegen import I32, I64, P64, NotCompiled

__all__ = ["CALLBACK_SLOT", "SURFACE", "TEXTURE", "Sink", "call", "callback_address", "lower",
           "uses_callback", "uses_heap"]

CALLBACK_SLOT = 29
_PRINTF, _ASSERT, _MALLOC, _FREE = 0, 1, 2, 3
TEXTURE = 4   # a texture fetch (textures.py)
SURFACE = 5   # a bad surface access (surfaces.py)
_KINDS = {"vprintf": (_PRINTF, 2), "__assertfail": (_ASSERT, 5), "malloc": (_MALLOC, 1),
          "free": (_FREE, 1)}   # name -> (kind, arguments)
_sinks: dict[int, Sink] = {}
_sinks_lock = threading.Lock()


class _BadPointer(Exception):
    def __init__(self, address: int):
        super().__init__(f"0x{address:x}")
        self.address = address


class Sink:
    """A launch's printf records and failed asserts (registered under its launch record's
    address while it runs)."""

    def __init__(self, launch_address: int, prepared, memory, params: bytes, fifo_bytes: int,
                 runtime=None):
        self.key = launch_address
        self.prepared = prepared
        self.memory = memory
        self.params = params
        self.fifo_bytes = fifo_bytes
        self.records: list[tuple] = []      # (block, thread, sequence, FIFO bytes, text)
        self.room = [fifo_bytes, fifo_bytes]
        self.assertions: list[tuple[int, int, str]] = []
        # the device heap, made before the launch so that its memory is in the allocation
        # table the compiled code checks against (None: malloc gives NULL, as on the
        # interpreter without a runtime)
        self.heap = runtime.heap if runtime is not None and uses_heap(prepared.kernel) \
            else None
        self.error: LaunchError | None = None   # a bad free's

    def __enter__(self):
        with _sinks_lock:
            _sinks[self.key] = self
        return self

    def __exit__(self, *exc):
        with _sinks_lock:
            _sinks.pop(self.key, None)

    def output(self) -> str:
        return "".join(text for *_, text in sorted(within_fifo(self.records, self.fifo_bytes)))

    def failure(self, report: str) -> LaunchError | None:
        """The launch's 710 if a thread failed an assert."""
        if not self.assertions:
            return None
        lines = sorted(self.assertions)
        return LaunchError(CUDA_ERROR_ASSERT, lines[0][2], output=self.output(),
                           diagnostics=report + "".join(f"{text}\n" for *_, text in lines))

    # -- what the callback does ------------------------------------------------------------
    def region(self, address: int, local: int, shared: int) -> bytes:
        """The bytes from a generic address to the end of its memory (read_region's)."""
        prepared = self.prepared
        tag = address >> 56
        if tag == GENERIC_SHARED_BASE >> 56:
            offset = address - GENERIC_SHARED_BASE
            if offset >= prepared.shared_size:
                raise _BadPointer(address)
            return ctypes.string_at(shared + offset, prepared.shared_size - offset)
        if tag == GENERIC_LOCAL_BASE >> 56:
            offset = address - GENERIC_LOCAL_BASE
            if offset >= prepared.local_size:
                raise _BadPointer(address)
            return ctypes.string_at(local + offset, prepared.local_size - offset)
        if tag == GENERIC_PARAM_BASE >> 56:
            return self.params[address - GENERIC_PARAM_BASE:]
        found = self.memory.find(address)
        if found is None:
            raise _BadPointer(address)
        base, size = found
        return self.memory.read(address, base + size - address)

    def string(self, address: int, local: int, shared: int) -> bytes:
        return self.region(address, local, shared).split(b"\0", 1)[0]

    def printf(self, block: int, thread: int, fmt: int, buffer: int, local: int,
               shared: int) -> int:
        data = self.region(buffer, local, shared) if buffer else b""
        args = ArgumentBuffer(data)
        text = format_printf(self.string(fmt, local, shared), args,
                             lambda a: self.string(a, local, shared))
        fifo = fifo_record_size(args)
        room = self.room
        room[0] -= fifo
        room[1] -= len(text)
        if room[0] < 0 or room[1] < 0:   # the FIFO is full: this and later output dropped
            room[0] = room[1] = -1
        else:
            self.records.append((block, thread, len(self.records), fifo, text))
        return len(text)

    def coordinates(self, block: int, thread: int):
        """(tid, ctaid) of linear thread and block numbers."""
        bx, by, _ = self.prepared.block
        gx, gy, _ = self.prepared.grid
        return ((thread % bx, thread // bx % by, thread // (bx * by)),
                (block % gx, block // gx % gy, block // (gx * gy)))

    def malloc(self, size: int) -> int:
        return self.heap.malloc([size])[0] if self.heap is not None else 0

    def free(self, block: int, thread: int, address: int, line: int) -> int:
        if self.heap is None:
            return 0
        try:
            self.heap.free([address], [0], line)
        except Fault as fault:
            return self.failed(fault, block, thread, line)
        return 0

    def fetch(self, kind: int, block: int, thread: int, handle: int, words: int, form: int,
              line: int) -> int:
        try:
            if kind == SURFACE:
                surfaces.fault(self.memory, handle, words, form)
            else:
                textures.fetch(self.memory, handle, words, form)
        except Fault as fault:
            return self.failed(fault, block, thread, line)
        return 0

    def failed(self, fault: Fault, block: int, thread: int, line: int) -> int:
        """-1, the thread's fault kept as the launch's error."""
        tid, ctaid = self.coordinates(block, thread)
        self.error = LaunchError(fault.code, fault_message(
            fault.head, fault.reason, tid, ctaid, self.prepared.kernel_name, line))
        return -1

    def failed_assert(self, block: int, thread: int, message: int, file: int, line: int,
                      function: int, local: int, shared: int) -> None:
        def text(address):
            return self.string(address, local, shared).decode("utf-8", "replace")
        tid, ctaid = self.coordinates(block, thread)
        self.assertions.append((block, thread, (
            f"{text(file)}:{line}: {text(function)}: "
            f"block: [{ctaid[0]},{ctaid[1]},{ctaid[2]}], "
            f"thread: [{tid[0]},{tid[1]},{tid[2]}] Assertion `{text(message)}` failed.")))


_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                              *[ctypes.c_uint64] * 4, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _called(launch, kind, a, b, c, d, block, thread, local, shared, fault) -> int:
    """printf: the text's length; malloc: the address; else 0. -1 when the call faults
    (fault[1] a printf's bad pointer; a bad free's error in the sink)."""
    sink = _sinks[launch]
    try:
        if kind == _PRINTF:
            return sink.printf(block, thread, a, b, local or 0, shared or 0)
        if kind == _MALLOC:
            return sink.malloc(a)
        if kind == _FREE:
            return sink.free(block, thread, a, c)
        if kind in (TEXTURE, SURFACE):
            return sink.fetch(kind, block, thread, a, b, c, d)
        sink.failed_assert(block, thread, a, b, c, d, local or 0, shared or 0)
        return 0
    except _BadPointer as bad:
        ctypes.c_int64.from_address(fault + 8).value = bad.address - (1 << 64) \
            if bad.address >= 1 << 63 else bad.address
        return -1


_CALLBACK = _SIGNATURE(_called)


def callback_address() -> int:
    return ctypes.cast(_CALLBACK, ctypes.c_void_p).value


def uses_callback(kernel) -> bool:
    return bool(kernel.builtins_called & _KINDS.keys()) or textures.uses_textures(kernel)


def uses_heap(kernel) -> bool:
    return bool(kernel.builtins_called & {"malloc", "free"})


def lower(c, instr, name: str, arguments: list, results: list) -> None:
    """A call to vprintf, __assertfail, malloc or free (calls.py hands them over); the
    other built-ins: NotCompiled."""
    if name not in _KINDS or len(arguments) != _KINDS[name][1]:
        raise NotCompiled(f"{instr.text} to {name}", instr.line)
    kind = _KINDS[name][0]
    b = c.b
    values = []
    for k, operand in enumerate(arguments[:4]):
        ptype = TYPES["u32"] if name == "__assertfail" and k == 2 else TYPES["u64"]
        values.append(b.zext(_argument(c, operand, ptype, instr), I64)
                      if ptype.bits == 32 else _argument(c, operand, ptype, instr))
    if kind == _FREE:
        values.append(ir.Constant(I64, 0))
        values.append(ir.Constant(I64, instr.line))   # the heap's fault names it
    values += [ir.Constant(I64, 0)] * (4 - len(values))
    result = _callback(c, kind, values)
    if name == "__assertfail":
        b.ret(ir.Constant(I32, 0))      # the thread ends; the launch fails at its end
        c.b = ir.IRBuilder(c.fn.append_basic_block("after_assert"))
        return
    if kind == _MALLOC:
        for operand in results[:1]:
            _result(c, operand, result, TYPES["u64"], instr)
        return
    bad = c.fn.append_basic_block("bad_call")
    fine = c.fn.append_basic_block("called")
    b.cbranch(b.icmp_signed("<", result, ir.Constant(I64, 0)), bad, fine)
    c.b = ir.IRBuilder(bad)
    address = c.b.load(c.b.gep(c.fault, [ir.Constant(I64, 1)]))
    control.fail(c, "pointer" if kind == _PRINTF else "runtime", address, instr.line)
    c.b = ir.IRBuilder(fine)
    for operand in results[:1]:   # printf's length; free returns 0
        _result(c, operand, c.b.trunc(result, I32), TYPES["s32"], instr)


def _callback(c, kind: int, values: list):
    """The callback's result for `kind` and its four arguments."""
    b = c.b
    function_type = ir.FunctionType(I64, [P64, I64, I64, I64, I64, I64, I64, I64,
                                          c.local.type, c.shared.type, P64])
    callee = b.inttoptr(c.launch_slot(CALLBACK_SLOT), function_type.as_pointer())
    block = b.load(b.gep(c.fault, [ir.Constant(I64, 5)]))
    return b.call(callee, [c.L, ir.Constant(I64, kind), *values, block, c.t, c.local,
                           c.shared, c.fault])


def call(c, kind: int, values: list, line: int) -> None:
    """A callback of `kind` with four i64 arguments that ends the thread with the sink's
    error (a "runtime" fault) when it returns -1."""
    result = _callback(c, kind, values)
    bad = c.fn.append_basic_block("bad_call")
    fine = c.fn.append_basic_block("called")
    c.b.cbranch(c.b.icmp_signed("<", result, ir.Constant(I64, 0)), bad, fine)
    c.b = ir.IRBuilder(bad)
    control.fail(c, "runtime", ir.Constant(I64, 0), line)
    c.b = ir.IRBuilder(fine)


def _argument(c, operand, ptype, instr):
    """An argument's value: a .param variable's (local memory) or the operand's."""
    variable = getattr(operand, "variable", None)
    if variable is not None and variable.space == "param":
        at = c.b.gep(c.local, [ir.Constant(I64, c.kernel.local_offsets[id(variable)])])
        return c.b.load(c.b.bitcast(at, ir.IntType(ptype.bits).as_pointer()), align=1)
    return c.read(operand, ptype, instr)


def _result(c, operand, value, ptype, instr) -> None:
    variable = getattr(operand, "variable", None)
    if variable is not None and variable.space == "param":
        at = c.b.gep(c.local, [ir.Constant(I64, c.kernel.local_offsets[id(variable)])])
        c.b.store(value, c.b.bitcast(at, value.type.as_pointer()), align=1)
    else:
        c.write(operand, ptype, value, instr)
