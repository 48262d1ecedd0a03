"""ldmatrix and movmatrix: 8x8 matrices of 16-bit elements moved between shared memory (or
another thread's register) and the mma.sync fragment layout.

ldmatrix .x1/.x2/.x4 loads one, two or four matrices; threads 8j..8j+7 give the addresses
of matrix j's eight rows (16 bytes each). Thread l receives, in register j, row l/4 and
columns 2(l%4), 2(l%4)+1 of matrix j (lower half first), or with .trans the same elements
of the transposed matrix. movmatrix.trans transposes a matrix held in that layout.
"""

from __future__ import annotations

import numpy as np

from .isa import CompileContext, Modifiers, opcode
from .matrix_elements import ELEMENTS
from .ops_memory import address_reader
from .ops_mma import Operand
from .spaces import load
from .warp_fragments import WarpLanes

__all__: list[str] = []

_B16 = ELEMENTS["f16"]          # 16-bit fields, two to a register: only their bits matter
_LANE = np.arange(32)
_GROUP, _THREAD = _LANE // 4, _LANE % 4


def _fragment_words(matrices: np.ndarray, trans: bool) -> np.ndarray:
    """(warps, count, 8, 8) uint16 matrices -> (warps, 32, count) register words."""
    if trans:
        matrices = matrices.swapaxes(2, 3)
    low = matrices[:, :, _GROUP, 2 * _THREAD].astype(np.uint32)
    high = matrices[:, :, _GROUP, 2 * _THREAD + 1].astype(np.uint32)
    return (low | (high << np.uint32(16))).swapaxes(1, 2)


@opcode("ldmatrix")
def _ldmatrix(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    aligned = mods.has("sync") and mods.has("aligned")
    shape = mods.take("m8n8")
    number = mods.take("x1", "x2", "x4")
    trans = mods.has("trans")
    space = mods.take("shared", "shared::cta") and "shared" or "generic"
    mods.type({"b16"})
    mods.done()
    if not aligned or shape is None or number is None:
        raise ctx.error("expected ldmatrix.sync.aligned.m8n8.x1/.x2/.x4")
    count = int(number[1:])
    ctx.operand_count(2)
    destination = Operand(ctx, instr.operands[0], _B16, count, destination=True)
    where, address = address_reader(instr.operands[1], space, ctx)

    def run(state, lanes):
        warps = WarpLanes(state, lanes)
        sources = warps.members[:, :8 * count].ravel()
        addresses = np.broadcast_to(np.asarray(address(state, None), np.uint64), (state.n,))
        rows = load(state, where, addresses[sources], np.dtype(np.uint16), 8, sources)
        matrices = rows.reshape(warps.count, count, 8, 8)
        warps.scatter(state, lanes, destination.access, _fragment_words(matrices, trans))
    return ctx.op(run)


@opcode("movmatrix")
def _movmatrix(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    aligned = mods.has("sync") and mods.has("aligned")
    if not (aligned and mods.has("m8n8") and mods.has("trans")):
        raise ctx.error("expected movmatrix.sync.aligned.m8n8.trans.b16")
    mods.type({"b16"})
    mods.done()
    ctx.operand_count(2)
    destination = Operand(ctx, instr.operands[0], _B16, 1, destination=True)
    source = Operand(ctx, instr.operands[1], _B16, 1)

    def run(state, lanes):
        warps = WarpLanes(state, lanes)
        words = warps.gather(state, source.access)[:, :, 0].astype(np.uint32)
        matrix = np.zeros((warps.count, 1, 8, 8), np.uint16)
        matrix[:, 0, _GROUP, 2 * _THREAD] = words & np.uint32(0xFFFF)
        matrix[:, 0, _GROUP, 2 * _THREAD + 1] = words >> np.uint32(16)
        warps.scatter(state, lanes, destination.access, _fragment_words(matrix, True))
    return ctx.op(run)
