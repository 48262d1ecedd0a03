"""Special registers beyond the thread and block coordinates, as the interpreter's
`operands.special_reader` has them: lane masks, shared memory sizes, the fixed values of a
device without clusters or performance counters, the device graph the kernel is a node of
(%current_graph_exec: the launch record's GRAPH_SLOT, which the runner fills from the
launch's graph environment), and the clocks in real time (`timers.py`: the same clock, read
with clock_gettime; the launch record carries the process's start and epoch offset, so a
cached object works in any process)."""

from __future__ import annotations

from math import gcd

from llvmlite import ir

from ..ptx_types import TYPES
from ..timers import _EPOCH_OFFSET_NS, _START_NS, CLOCK_RATE_KHZ
from .codegen import _DYN_SHARED, _SHARED_SIZE, I32, I64, NotCompiled

__all__ = ["CLOCK_SLOTS", "GRAPH_SLOT", "clock_slots", "read"]

CLOCK_SLOTS = (30, 31)   # launch[] slots: the timers' start and epoch offset (nanoseconds)
GRAPH_SLOT = 26          # launch[] slot: %current_graph_exec
_U32, _U64 = TYPES["u32"], TYPES["u64"]
_FIXED32 = {"%cluster_ctarank": 0, "%cluster_nctarank": 1, "%is_explicit_cluster": 0}
_SCALE = gcd(CLOCK_RATE_KHZ, 1_000_000)


def clock_slots() -> tuple[int, int]:
    """What the runner puts in CLOCK_SLOTS."""
    return _START_NS, _EPOCH_OFFSET_NS


def read(c, name: str, instr):
    """(value, type) of special register `name`; NotCompiled for those left to the
    interpreter (%envreg1/2: a cooperative launch's grid barrier)."""
    b = c.b
    base, _, component = name.partition(".")
    axis = {"x": 0, "y": 1, "z": 2}.get(component)
    if axis is not None and base == "%clusterid":       # every cluster is a single block
        return c.ctaid[axis], _U32
    if axis is not None and base == "%nclusterid":
        return c._special(f"%nctaid.{component}", instr)
    if axis is not None and base in ("%cluster_ctaid", "%cluster_nctaid"):
        return ir.Constant(I32, int(base == "%cluster_nctaid")), _U32
    if name in _FIXED32:
        return ir.Constant(I32, _FIXED32[name]), _U32
    if name.startswith("%lanemask_"):
        lane = b.and_(b.trunc(c.t, I32), ir.Constant(I32, 31))
        bit = b.shl(ir.Constant(I32, 1), lane)
        below = b.sub(bit, ir.Constant(I32, 1))
        upto = b.or_(below, bit)
        mask = {"eq": bit, "lt": below, "le": upto, "gt": b.not_(upto),
                "ge": b.not_(below)}.get(name[len("%lanemask_"):])
        if mask is not None:
            return mask, _U32
    if name == "%dynamic_smem_size":
        return b.trunc(c.launch_slot(_DYN_SHARED), I32), _U32
    if name in ("%total_smem_size", "%aggr_smem_size", "%reserved_smem_offset_begin"):
        return b.trunc(c.launch_slot(_SHARED_SIZE), I32), _U32
    if name in ("%envreg1", "%envreg2"):
        raise NotCompiled(f"{instr.text}: special register {name}", instr.line)
    if name.startswith("%envreg") or (name.startswith("%pm") and not name.endswith("_64")):
        return ir.Constant(I32, 0), _U32
    if name.startswith("%pm"):
        return ir.Constant(I64, 0), _U64
    if name == "%gridid":
        return ir.Constant(I64, 1), _U64
    if name == "%current_graph_exec":
        return c.launch_slot(GRAPH_SLOT), _U64
    if name.startswith(("%clock", "%globaltimer")):
        return _clock(c, name, instr)
    raise NotCompiled(f"{instr.text}: special register {name}", instr.line)


def _clock(c, name: str, instr):
    b = c.b
    now = _monotonic_ns(c)
    if name.startswith("%clock"):
        elapsed = b.sub(now, c.launch_slot(CLOCK_SLOTS[0]))
        value = b.sdiv(b.mul(elapsed, ir.Constant(I64, CLOCK_RATE_KHZ // _SCALE)),
                       ir.Constant(I64, 1_000_000 // _SCALE))
    else:
        value = b.add(now, c.launch_slot(CLOCK_SLOTS[1]))
    if name in ("%clock64", "%globaltimer"):
        return value, _U64
    if name in ("%clock", "%globaltimer_lo"):
        return b.trunc(value, I32), _U32
    if name in ("%clock_hi", "%globaltimer_hi"):
        return b.trunc(b.lshr(value, ir.Constant(I64, 32)), I32), _U32
    raise NotCompiled(f"{instr.text}: special register {name}", instr.line)


def _monotonic_ns(c):
    """clock_gettime(CLOCK_MONOTONIC) in nanoseconds, as time.monotonic_ns()."""
    module = c.module
    gettime = module.globals.get("clock_gettime") or ir.Function(
        module, ir.FunctionType(I32, [I32, I64.as_pointer()]), "clock_gettime")
    b = c.b
    with b.goto_entry_block():
        spec = b.alloca(ir.ArrayType(I64, 2), name="timespec")
    pointer = b.bitcast(spec, I64.as_pointer())
    b.call(gettime, [ir.Constant(I32, 1), pointer])   # CLOCK_MONOTONIC
    seconds = b.load(pointer)
    nanoseconds = b.load(b.gep(pointer, [ir.Constant(I64, 1)]))
    return b.add(b.mul(seconds, ir.Constant(I64, 1_000_000_000)), nanoseconds)
