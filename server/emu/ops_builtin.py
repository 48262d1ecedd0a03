"""Functions the CUDA runtime provides to device code: vprintf (device printf) and
__assertfail (device assert), plus the device runtime's (device_runtime.py). Calls to them
compile to straight-line operations.

printf output is recorded per thread with a global sequence number; the launch returns it
ordered by block, then thread, then call order, so a launch always prints the same text.
A failed assert records CUDA's message ("file:line: function: block: [x,y,z], thread:
[x,y,z] Assertion `expr` failed.", from nvcc's `__assertfail(message, file, line, function,
char size)`) for every failing thread of the group that reached it, and fails the launch
with CUDA_ERROR_ASSERT; the messages go to stderr after the launch's printf output.
"""

from __future__ import annotations

import numpy as np

from .address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from .device_printf import ArgumentBuffer, fifo_record_size, format_printf
from .device_runtime import RUNTIME_FUNCTIONS
from .errors import CUDA_ERROR_ASSERT, CUDA_ERROR_ILLEGAL_ADDRESS
from .spaces import load, store
from .state import Fault, State

__all__ = ["BUILTINS", "read_c_string", "read_region"]

_U64 = np.dtype(np.uint64)
_U32 = np.dtype(np.uint32)


def read_region(state: State, address: int, lane: int) -> bytes:
    """The bytes from a generic `address` to the end of the memory that contains it."""
    tag = address >> 56
    if tag == GENERIC_SHARED_BASE >> 56:
        offset = address - GENERIC_SHARED_BASE
        if offset >= state.ctx.launch.shared_size:
            raise _bad_pointer(address, lane)
        start = int(state.layout.slot[lane]) * state.shared_stride
        return state.shared[start + offset:start + state.ctx.launch.shared_size].tobytes()
    if tag == GENERIC_LOCAL_BASE >> 56:
        offset = address - GENERIC_LOCAL_BASE
        if offset >= state.ctx.launch.local_size:
            raise _bad_pointer(address, lane)
        start = lane * state.local_stride
        return state.local[start + offset:start + state.ctx.launch.local_size].tobytes()
    if tag == GENERIC_PARAM_BASE >> 56:
        offset = address - GENERIC_PARAM_BASE
        return state.ctx.params[offset:].tobytes()
    found = state.ctx.memory.find(address)
    if found is None:
        raise _bad_pointer(address, lane)
    base, size = found
    return state.ctx.memory.read(address, base + size - address)


def read_c_string(state: State, address: int, lane: int) -> bytes:
    return read_region(state, address, lane).split(b"\0", 1)[0]


def _bad_pointer(address: int, lane: int) -> Fault:
    return Fault(CUDA_ERROR_ILLEGAL_ADDRESS, f"Invalid __global__ read at 0x{address:x}",
                 "device library string or argument pointer is out of bounds", lane)


def _offsets(variables):
    keys = [id(v) for v in variables]
    return lambda state: [state.ctx.launch.kernel.local_offsets[k] for k in keys]


def _vprintf(ctx, arguments, results):
    if len(arguments) != 2:
        raise ctx.error("vprintf takes a format and an argument buffer")
    offsets = _offsets(arguments)
    result_offsets = _offsets(results)
    line = ctx.instr.line

    def run(state, lanes):
        fmt_at, args_at = offsets(state)
        formats = load(state, "fparam", fmt_at, _U64, 1, lanes)
        buffers = load(state, "fparam", args_at, _U64, 1, lanes)
        lengths = np.zeros(len(formats), np.uint32)
        for k, lane in enumerate(state.lane_ids(lanes)):
            lane = int(lane)
            try:
                fmt = read_c_string(state, int(formats[k]), lane)
                data = read_region(state, int(buffers[k]), lane) if buffers[k] else b""
                args = ArgumentBuffer(data)
                text = format_printf(fmt, args,
                                     lambda a, lane=lane: read_c_string(state, a, lane))
            except Fault as fault:
                fault.line = line
                raise
            lengths[k] = len(text)
            _record(state, lane, fifo_record_size(args), text)
        for at in result_offsets(state)[:1]:
            store(state, "fparam", at, lengths, lanes)
    return run


def _record(state: State, lane: int, fifo_bytes: int, text: str) -> None:
    room = state.ctx.printf_room
    room[0] -= fifo_bytes
    room[1] -= len(text)
    if room[0] < 0 or room[1] < 0:  # the FIFO is full: this call's output is dropped
        room[0] = room[1] = -1  # and so is every later call's
        return
    printf = state.ctx.printf
    printf.append((state.block_linear(lane), int(state.layout.thread_linear[lane]),
                   len(printf), fifo_bytes, text))


def _assertfail(ctx, arguments, results):
    if len(arguments) != 5:
        raise ctx.error("__assertfail takes five arguments")
    offsets = _offsets(arguments)
    line = ctx.instr.line

    def run(state, lanes):
        message_at, file_at, line_at, function_at, _ = offsets(state)
        messages = load(state, "fparam", message_at, _U64, 1, lanes)
        files = load(state, "fparam", file_at, _U64, 1, lanes)
        lines = load(state, "fparam", line_at, _U32, 1, lanes)
        functions = load(state, "fparam", function_at, _U64, 1, lanes)
        first = None
        for k, lane in enumerate(state.lane_ids(lanes)):
            lane = int(lane)

            def text(address, lane=lane):
                return read_c_string(state, int(address), lane).decode("utf-8", "replace")
            tid, ctaid = state.thread_of(lane)
            message = (f"{text(files[k])}:{int(lines[k])}: {text(functions[k])}: "
                       f"block: [{ctaid[0]},{ctaid[1]},{ctaid[2]}], "
                       f"thread: [{tid[0]},{tid[1]},{tid[2]}] "
                       f"Assertion `{text(messages[k])}` failed.")
            state.ctx.assertions.append((state.block_linear(lane),
                                         int(state.layout.thread_linear[lane]), message))
            if first is None:
                first = Fault(CUDA_ERROR_ASSERT, message, "", lane, line, verbatim=True)
        if first is not None:
            raise first
    return run


BUILTINS = {"vprintf": _vprintf, "__assertfail": _assertfail, **RUNTIME_FUNCTIONS}
