"""Warp-level operations: shfl, vote, activemask, match, redux (and their .sync forms).

A warp is 32 consecutive threads of a block. The lanes that execute a warp instruction
together are the group the scheduler is running: threads of the warp at the same program
point. Threads of the warp that are elsewhere (diverged, exited) do not take part: they
contribute nothing to vote/ballot/activemask/match/redux, whatever `membermask` says, and
each executing thread's result is further limited to the lanes its own `membermask`
names. A shuffle reads the source thread's register even if that thread is not executing
(its current value), and a source lane beyond the end of a short last warp counts as out
of range (the thread keeps its own value, predicate false).
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, Modifiers, opcode
from .operands import reader, writer
from .ptx_types import TYPES

__all__: list[str] = []

_U32 = TYPES["u32"]
_PRED = TYPES["pred"]


def _warp_bits(state, lanes, flags) -> np.ndarray:
    """Per-warp OR of `1 << laneid` over executing lanes where `flags` is true."""
    ids = state.lane_ids(lanes)
    laneid = state.layout.laneid[ids]
    weights = np.where(flags, np.left_shift(1, laneid.astype(np.int64)), 0).astype(np.float64)
    sums = np.bincount(state.layout.warp_index[ids], weights=weights,
                       minlength=state.layout.nwarps)
    return sums.astype(np.uint64).astype(np.uint32)


def _executing(state, lanes) -> np.ndarray:
    mask = np.zeros(state.n, bool)
    mask[state.lane_ids(lanes)] = True
    return mask


@opcode("shfl")
def _shfl(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("sync")
    mode = mods.take("up", "down", "bfly", "idx")
    ptype = mods.type({"b32"})
    mods.done()
    if mode is None:
        raise ctx.error("shfl needs .up, .down, .bfly or .idx")
    ctx.operand_count(4, 5)
    write = writer(instr.operands[0], ptype, ctx)
    write_p = writer(instr.pair, _PRED, ctx) if instr.pair is not None else None
    read_a = reader(instr.operands[1], ptype, ctx)
    read_b = reader(instr.operands[2], _U32, ctx)
    read_c = reader(instr.operands[3], _U32, ctx)

    def run(state, lanes):
        ids = state.lane_ids(lanes)
        layout = state.layout
        lane = layout.laneid[ids].astype(np.int64)
        b = np.asarray(read_b(state, lanes)).astype(np.int64) & 31
        c = np.asarray(read_c(state, lanes)).astype(np.int64)
        segment = (c >> 8) & 31
        clamp = c & 31
        max_lane = (lane & segment) | (clamp & ~segment)
        min_lane = lane & segment
        if mode == "up":
            j = lane - b
            valid = j >= max_lane
        elif mode == "down":
            j = lane + b
            valid = j <= max_lane
        elif mode == "bfly":
            j = lane ^ b
            valid = j <= max_lane
        else:
            j = min_lane | (b & ~segment)
            valid = j <= max_lane
        valid &= j < layout.warp_size[ids]
        source = np.where(valid, layout.warp_first[ids] + j, ids)
        values = read_a(state, None)
        write(state, lanes, values[source] if np.ndim(values) else values)
        if write_p is not None:
            write_p(state, lanes, valid)
    return ctx.op(run)


@opcode("vote")
def _vote(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    sync = mods.has("sync")
    mode = mods.take("all", "any", "uni", "ballot")
    ptype = mods.type({"pred", "b32"})
    mods.done()
    if mode is None or (mode == "ballot") != (ptype.name == "b32"):
        raise ctx.error("expected vote.all/any/uni.pred or vote.ballot.b32")
    ctx.operand_count(3 if sync else 2)
    write = writer(instr.operands[0], ptype, ctx)
    read_p = reader(instr.operands[1], _PRED, ctx)
    read_mask = reader(instr.operands[2], _U32, ctx) if sync else (
        lambda state, lanes: np.uint32(0xFFFFFFFF))

    def run(state, lanes):
        ids = state.lane_ids(lanes)
        warp = state.layout.warp_index[ids]
        pred = np.broadcast_to(read_p(state, lanes), ids.shape)
        member = np.asarray(read_mask(state, lanes), np.uint32)
        active = _warp_bits(state, lanes, True)[warp] & member
        ballot = _warp_bits(state, lanes, pred)[warp] & member
        if mode == "ballot":
            write(state, lanes, ballot)
        elif mode == "all":
            write(state, lanes, ballot == active)
        elif mode == "any":
            write(state, lanes, ballot != 0)
        else:
            write(state, lanes, (ballot == 0) | (ballot == active))
    return ctx.op(run)


@opcode("activemask")
def _activemask(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.type({"b32"})
    mods.done()
    ctx.operand_count(1)
    write = writer(instr.operands[0], TYPES["b32"], ctx)

    def run(state, lanes):
        ids = state.lane_ids(lanes)
        write(state, lanes, _warp_bits(state, lanes, True)[state.layout.warp_index[ids]])
    return ctx.op(run)


@opcode("match")
def _match(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("sync")
    mode = mods.take("any", "all")
    ptype = mods.type({"b32", "b64"})
    mods.done()
    if mode is None:
        raise ctx.error("match needs .any or .all")
    ctx.operand_count(3)
    write = writer(instr.operands[0], TYPES["b32"], ctx)
    write_p = writer(instr.pair, _PRED, ctx) if instr.pair is not None else None
    if write_p is not None and mode == "any":
        raise ctx.error("match.any has no predicate result")
    read_a = reader(instr.operands[1], ptype, ctx)
    read_mask = reader(instr.operands[2], _U32, ctx)

    def run(state, lanes):
        ids = state.lane_ids(lanes)
        layout = state.layout
        executing = _executing(state, lanes)
        values = np.broadcast_to(read_a(state, None), (state.n,))
        mine = values[ids]
        member = np.asarray(read_mask(state, lanes), np.uint32)
        first = layout.warp_first[ids]
        size = layout.warp_size[ids]
        same = np.zeros(len(ids), np.uint32)
        participants = np.zeros(len(ids), np.uint32)
        for k in range(32):
            inside = k < size
            source = np.where(inside, first + k, ids)
            takes_part = inside & executing[source] & ((member >> np.uint32(k)) & 1 != 0)
            bit = np.uint32(1 << k)
            participants |= np.where(takes_part, bit, np.uint32(0))
            same |= np.where(takes_part & (values[source] == mine), bit, np.uint32(0))
        if mode == "any":
            write(state, lanes, same)
            return
        uniform = same == participants
        write(state, lanes, np.where(uniform, participants, np.uint32(0)))
        if write_p is not None:
            write_p(state, lanes, uniform)
    return ctx.op(run)


_REDUX = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
          "or": np.bitwise_or, "xor": np.bitwise_xor}


@opcode("redux")
def _redux(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    mods.take("sync")
    op = mods.take(*_REDUX)
    ptype = mods.type({"u32", "s32", "b32"})
    mods.done()
    if op is None:
        raise ctx.error("redux needs an operation")
    ctx.operand_count(3)
    write = writer(instr.operands[0], ptype, ctx)
    read_a = reader(instr.operands[1], ptype, ctx)
    read_mask = reader(instr.operands[2], _U32, ctx)
    dtype = ptype.dtype
    ufunc = _REDUX[op]
    info = np.iinfo(dtype)
    identity = {"add": 0, "min": info.max, "max": info.min, "and": info.max if
                dtype.kind == "u" else -1, "or": 0, "xor": 0}[op]

    def run(state, lanes):
        # Each thread reduces over the executing lanes of its warp that its membermask names
        # (cooperative groups pass tile masks, so one warp may hold several reductions).
        ids = state.lane_ids(lanes)
        layout = state.layout
        executing = _executing(state, lanes)
        values = np.broadcast_to(read_a(state, None), (state.n,)).astype(dtype)
        member = np.broadcast_to(np.asarray(read_mask(state, lanes), np.uint32), ids.shape)
        first = layout.warp_first[ids]
        size = layout.warp_size[ids]
        result = np.full(len(ids), identity, dtype)
        for k in range(32):
            inside = k < size
            source = np.where(inside, first + k, ids)
            takes_part = inside & executing[source] & (((member >> np.uint32(k)) & 1) != 0)
            result = ufunc(result, np.where(takes_part, values[source], dtype.type(identity)))
        write(state, lanes, result.astype(dtype))
    return ctx.op(run)
