"""Atomic read-modify-write: atom and red on global, shared and generic addresses.

Atomics are applied in lane order (block-major, then thread order), so a launch is
bit-reproducible: lanes that hit the same address see each other's updates in that order,
and float additions round in that order. Conflicting lanes are processed in rounds (the
k-th lane of every address at once) or, for addresses hit by many lanes, with one
`ufunc.accumulate` (or a closed form for inc/dec/cas with uniform operands) per address.
`atom.add.f32` does not flush subnormals here.
"""

from __future__ import annotations

import numpy as np

from . import float_rounding as fr
from .isa import CompileContext, opcode
from .memory import typed_elements
from .operands import reader, writer
from .ops_float import half_op
from .ops_memory import address_reader, memory_modifiers
from .ptx_types import TYPES
from .spaces import locate
from .state import lane_count

__all__ = ["ordered_update"]

_HEAVY = 16  # lanes per address above which one address is updated with accumulate


_HALF_ADD = {name: half_op(TYPES[name], "rn", fr.exact_add)
             for name in ("f16", "bf16", "f16x2", "bf16x2")}


def _apply(op: str, old, b, c):
    if op == "add":
        return old + b
    if op.startswith("add."):   # half-precision add on the bit patterns
        return _HALF_ADD[op[4:]](old, b).astype(old.dtype)
    if op == "exch":
        return np.broadcast_to(b, np.shape(old)).astype(old.dtype)
    if op == "and":
        return old & b
    if op == "or":
        return old | b
    if op == "xor":
        return old ^ b
    if op == "min":
        return np.minimum(old, b)
    if op == "max":
        return np.maximum(old, b)
    if op == "inc":
        return np.where(old >= b, old.dtype.type(0), old + old.dtype.type(1))
    if op == "dec":
        return np.where((old == 0) | (old > b), b, old - old.dtype.type(1)).astype(old.dtype)
    if op == "cas":
        return np.where(old == b, c, old).astype(old.dtype)
    raise ValueError(op)


_ACCUMULATE = {"add": np.add, "and": np.bitwise_and, "or": np.bitwise_or,
               "xor": np.bitwise_xor, "min": np.minimum, "max": np.maximum}


def _sequence(op: str, start, b, c, count: int, dtype):
    """Old values seen by `count` successive updates of one address, and the final value."""
    if op in _ACCUMULATE:
        values = np.concatenate([np.array([start], dtype), np.asarray(b, dtype)])
        running = _ACCUMULATE[op].accumulate(values).astype(dtype)
        return running[:-1], running[-1]
    if op == "exch":
        b = np.asarray(b, dtype)
        return np.concatenate([np.array([start], dtype), b[:-1]]), b[-1]
    uniform = np.all(b == b[0]) and (c is None or np.all(c == c[0]))
    if uniform and op in ("inc", "dec", "cas"):
        return _closed_form(op, int(start), int(b[0]), None if c is None else c[0], count,
                            dtype)
    old = np.empty(count, dtype)
    value = np.array(start, dtype)
    for k in range(count):
        old[k] = value
        value = _apply(op, value, b[k], None if c is None else c[k])
    return old, value


def _closed_form(op, start, b, c, count, dtype):
    r = np.arange(count, dtype=np.int64)
    if op == "inc":   # new = old >= b ? 0 : old + 1, a cycle of length b + 1
        period = b + 1
        if start <= b:
            old = (start + r) % period
        else:
            old = np.where(r == 0, start, (r - 1) % period)
    elif op == "dec":  # new = (old == 0 || old > b) ? b : old - 1
        period = b + 1
        if start <= b:
            old = (start - r) % period
        else:
            old = np.where(r == 0, start, (b - (r - 1)) % period)
    else:              # cas: after the first update the value no longer changes
        first = c if start == b else start
        old = np.where(r == 0, start, int(first) if np.ndim(first) == 0 else first)
    old = np.asarray(old).astype(dtype)
    final = _apply(op, old[-1:], dtype.type(b), None if c is None else dtype.type(c))[0]
    return old, final


def ordered_update(array: np.ndarray, index: np.ndarray, op: str, b, c=None) -> np.ndarray:
    """Apply `op` at `array[index[k]]` for k in lane order; return the old values."""
    n = len(index)
    b = np.broadcast_to(b, (n,)) if np.ndim(b) == 0 else b
    c = None if c is None else (np.broadcast_to(c, (n,)) if np.ndim(c) == 0 else c)
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    first = np.ones(n, bool)
    first[1:] = sorted_index[1:] != sorted_index[:-1]
    if first.all():
        old = array[index]
        array[index] = _apply(op, old, b, c)
        return old
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, n))
    old = np.empty(n, array.dtype)
    rank_sorted = np.arange(n) - np.repeat(starts, sizes)
    rank = np.empty(n, np.int64)
    rank[order] = rank_sorted
    heavy_lanes = np.zeros(n, bool)
    for start, size in zip(starts[sizes > _HEAVY], sizes[sizes > _HEAVY], strict=True):
        lanes = order[start:start + size]   # this address's lanes, in lane order
        heavy_lanes[lanes] = True
        where = index[lanes[0]]
        seen, final = _sequence(op, array[where], b[lanes],
                                None if c is None else c[lanes], size, array.dtype)
        old[lanes] = seen
        array[where] = final
    light = ~heavy_lanes
    for r in range(int(rank[light].max(initial=-1)) + 1):
        select = np.flatnonzero(light & (rank == r))
        where = index[select]
        current = array[where]
        old[select] = current
        array[where] = _apply(op, current, b[select], None if c is None else c[select])
    return old


_TYPES_BY_OP = {
    "add": {"u32", "s32", "u64", "s64", "f32", "f64"},
    "min": {"u32", "s32", "u64", "s64"},
    "max": {"u32", "s32", "u64", "s64"},
    "inc": {"u32"}, "dec": {"u32"},
    "and": {"b32", "b64"}, "or": {"b32", "b64"}, "xor": {"b32", "b64"},
    "exch": {"b32", "b64"}, "cas": {"b16", "b32", "b64"},
}


def _pick(values, positions):
    """The operand values of the lanes at `positions` (all lanes when None)."""
    if positions is None or np.ndim(values) == 0:
        return values
    return values[positions]


@opcode("atom", "red")
def _atom(instr, ctx: CompileContext):
    mods, space, hint = memory_modifiers(ctx)
    if space not in ("global", "shared", "generic"):
        raise ctx.unsupported(f"atomics on .{space} are not supported")
    op = mods.take(*_TYPES_BY_OP)
    if op is None:
        raise ctx.error("missing atomic operation")
    noftz = mods.has("noftz")
    halves = {"f16", "bf16", "f16x2", "bf16x2"} if op == "add" and noftz else set()
    ptype = mods.type(_TYPES_BY_OP[op] | halves | ({"u32", "s32", "u64", "s64", "f32"}
                                                   if op == "exch" else set()))
    mods.done()
    if ptype.name in halves:
        op = f"add.{ptype.name}"
    is_red = instr.opcode == "red"
    operand_count = (2 if is_red else 3) + (op == "cas") + hint
    ctx.operand_count(operand_count)
    ops = instr.operands if is_red else instr.operands[1:]
    write = None if is_red else writer(instr.operands[0], ptype, ctx)
    where, address = address_reader(ops[0], space, ctx)
    read_b = reader(ops[1], ptype, ctx)
    read_c = reader(ops[2], ptype, ctx) if op == "cas" else None
    dtype = ptype.dtype
    size = dtype.itemsize

    def run(state, lanes):
        k = lane_count(state, lanes)
        b = read_b(state, lanes)
        c = None if read_c is None else read_c(state, lanes)
        old = np.empty(k, dtype)
        for buf, offsets, positions in locate(state, where, address(state, lanes), size,
                                              lanes, "atomic"):
            typed, index = typed_elements(buf, offsets, dtype)  # aligned: never None
            seen = ordered_update(typed, index, op, _pick(b, positions),
                                  None if c is None else _pick(c, positions))
            if positions is None:
                old = seen
            else:
                old[positions] = seen
        if write is not None:
            write(state, lanes, old)
    return ctx.op(run)
