"""mbarrier: split arrive/wait barriers in shared memory (cuda::barrier, cuda::pipeline and
cooperative groups' memcpy_async on sm_80 and later), and cp.async.mbarrier.arrive.

An mbarrier is an 8-byte shared-memory object. Its layout here: bits 0-19 hold the pending
arrivals of the current phase, bits 20-39 the expected arrivals per phase, bit 63 the phase
parity. An arrival that brings the pending count to zero completes the phase: the parity
flips and the pending count starts again from the expected count. Lanes arriving in one
instruction arrive in lane order, each getting the state before its own arrival as its
token; a wait is complete once the barrier's phase differs from the token's (or from the
parity it names). Waiting threads poll (test_wait/try_wait loops): the scheduler lets the
threads they wait for run. cp.async copies complete at once, so the arrival cp.async
attaches to a barrier happens at once too. `.noComplete` arrivals (what cuda::barrier's
arrive(n) makes of all but the last of its n) lower the pending count without ever
completing the phase. Transaction counts (.expect_tx, sm_90's
bulk copies) and cluster scopes are not implemented.
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, opcode
from .memory import typed_elements
from .operands import reader, writer
from .ops_memory import address_reader, memory_modifiers
from .ptx_types import TYPES
from .spaces import locate
from .state import lane_count

__all__: list[str] = []

_U64 = TYPES["u64"]
_COUNT_MASK = (1 << 20) - 1
_EXPECTED_SHIFT = 20
_PHASE_BIT = 1 << 63


def _barrier_access(instr, ctx: CompileContext, address_operand):
    """(modifiers, run-time `words(state, lanes) -> [(typed view, indices, positions)]`)."""
    mods, space, _ = memory_modifiers(ctx)
    if space not in ("shared", "generic"):
        raise ctx.unsupported(f"mbarrier objects in .{space} are not supported")
    where, address = address_reader(address_operand, space, ctx)

    def words(state, lanes):
        found = []
        for buf, offsets, positions in locate(state, where, address(state, lanes), 8, lanes,
                                              "atomic"):
            typed, index = typed_elements(buf, offsets, np.uint64)  # aligned: never None
            found.append((typed, index, positions))
        return found
    return mods, words


def _in_lane_order(state, lanes, words, each):
    """Call `each(old_state, k) -> new_state` for every lane k (in lane order) on its
    barrier word; returns the old states, one per lane."""
    count = lane_count(state, lanes)
    olds = np.zeros(count, np.uint64)
    for typed, index, positions in words(state, lanes):
        ks = np.arange(count) if positions is None else np.asarray(positions)
        for k, i in zip(ks.tolist(), np.asarray(index).tolist(), strict=True):
            old = int(typed[i])
            olds[k] = old
            typed[i] = each(old, k)
    return olds


def _arrive(word: int, count: int, drop: bool, complete: bool = True) -> int:
    """The barrier word after `count` arrivals; `complete=False` (.noComplete) arrivals
    never complete the phase (the PTX ISA leaves one that would undefined)."""
    pending = word & _COUNT_MASK
    expected = (word >> _EXPECTED_SHIFT) & _COUNT_MASK
    phase = word & _PHASE_BIT
    if drop:
        expected = max(expected - count, 0)
    pending = max(pending - count, 0)
    if pending == 0 and complete:
        phase ^= _PHASE_BIT
        pending = expected
    return phase | (expected << _EXPECTED_SHIFT) | pending


@opcode("mbarrier")
def _mbarrier(instr, ctx: CompileContext):
    kind = instr.modifiers[0] if instr.modifiers else ""
    if kind not in ("init", "inval", "arrive", "arrive_drop", "test_wait", "try_wait"):
        raise ctx.unsupported(f"mbarrier.{kind} is not supported")
    operands = instr.operands
    if kind in ("init", "inval"):
        mods, words = _barrier_access(instr, ctx, operands[0])
        mods.take(kind)
        mods.type({"b64"})
        mods.done()
        ctx.operand_count(2 if kind == "init" else 1)
        read_count = reader(operands[1], TYPES["u32"], ctx) if kind == "init" else None

        def init(state, lanes):
            counts = None if read_count is None else np.broadcast_to(
                np.asarray(read_count(state, lanes), np.uint64) & np.uint64(_COUNT_MASK),
                (lane_count(state, lanes),))
            _in_lane_order(state, lanes, words, lambda old, k: 0 if counts is None else
                           (int(counts[k]) << _EXPECTED_SHIFT) | int(counts[k]))
        return ctx.op(init)
    if kind in ("arrive", "arrive_drop"):
        mods, words = _barrier_access(instr, ctx, operands[1])
        mods.take(kind)
        no_complete = mods.has("noComplete")
        mods.type({"b64"})
        mods.done()
        ctx.operand_count(3 if no_complete else 2, 3)
        write = writer(operands[0], _U64, ctx)
        read_count = reader(operands[2], TYPES["u32"], ctx) if len(operands) == 3 else None
        drop = kind == "arrive_drop"

        def arrive(state, lanes):
            n = lane_count(state, lanes)
            counts = np.broadcast_to(np.asarray(
                1 if read_count is None else read_count(state, lanes), np.int64), (n,))
            olds = _in_lane_order(state, lanes, words,
                                  lambda old, k: _arrive(old, int(counts[k]), drop,
                                                         not no_complete))
            write(state, lanes, olds)
        return ctx.op(arrive)
    return _wait(instr, ctx, kind)


def _wait(instr, ctx: CompileContext, kind: str):
    mods, words = _barrier_access(instr, ctx, instr.operands[1])
    mods.take(kind)
    parity = mods.has("parity")
    mods.type({"b64"})
    mods.done()
    ctx.operand_count(3, 4)  # try_wait may name a time limit; waits here never time out
    write = writer(instr.operands[0], TYPES["pred"], ctx)
    read_token = reader(instr.operands[2], TYPES["u32"] if parity else _U64, ctx)

    def wait(state, lanes):
        n = lane_count(state, lanes)
        token = np.broadcast_to(np.asarray(read_token(state, lanes), np.uint64), (n,))
        current = _in_lane_order(state, lanes, words, lambda old, k: old)
        current_parity = current >> np.uint64(63)
        waited = (token & np.uint64(1)) if parity else token >> np.uint64(63)
        write(state, lanes, current_parity != waited)
    return ctx.op(wait)


def cp_async_arrive(instr, ctx: CompileContext):
    """cp.async.mbarrier.arrive{.noinc}.shared.b64 [addr]: an arrival once the thread's
    earlier cp.async copies are done (they are, at once). Without .noinc the pending count
    is first raised by one, so the arrival changes nothing."""
    mods, words = _barrier_access(instr, ctx, instr.operands[0])
    mods.take("async")
    mods.take("mbarrier")
    mods.take("arrive")
    noinc = mods.has("noinc")
    mods.type({"b64"})
    mods.done()
    ctx.operand_count(1)
    if not noinc:
        return ctx.op(lambda state, lanes: None)

    def arrive(state, lanes):
        _in_lane_order(state, lanes, words, lambda old, k: _arrive(old, 1, False))
    return ctx.op(arrive)
