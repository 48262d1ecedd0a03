"""Execution state of one batch of blocks ("chunk") that runs as numpy lanes.

Lanes are the threads of `nblocks` consecutive blocks, block-major, threads in linear order
(x fastest) inside a block, so warps are runs of 32 lanes that start at each block's first
lane. Registers are immutable numpy arrays, one per register and lane: a write to some lanes
builds a new array. That keeps aliasing harmless (a `mov` may share its source's array) and
costs one copy per partially-written register, which divergent code pays anyway.

`lanes` everywhere means the lanes an instruction executes for: None for all lanes of the
chunk, or a sorted array of lane indices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Fault", "LaunchContext", "State", "ThreadLayout", "block_coordinates", "lane_count"]


class Fault(Exception):
    """A failed instruction; the executor adds the kernel, thread and block to the message.

    `head` reads like "Invalid __global__ read of size 4 at 0x10", `reason` like "address is
    out of bounds"; `lane` is the chunk lane that failed. A `verbatim` fault (a failed
    assert) already carries CUDA's complete message in `head`.
    """

    def __init__(self, code: int, head: str, reason: str, lane: int, line: int = 0,
                 verbatim: bool = False):
        super().__init__(head)
        self.code = code
        self.head = head
        self.reason = reason
        self.lane = lane
        self.line = line
        self.verbatim = verbatim


def lane_count(state: State, lanes) -> int:
    return state.n if lanes is None else len(lanes)


@dataclass
class ThreadLayout:
    """Lane-indexed thread coordinates for a chunk of `nblocks` blocks of `block` shape."""
    block: tuple[int, int, int]
    nblocks: int
    threads: int = 0
    nwarps: int = 0
    thread_linear: np.ndarray = field(default=None)
    slot: np.ndarray = field(default=None)       # block slot in the chunk, per lane
    tid: tuple[np.ndarray, np.ndarray, np.ndarray] = field(default=None)
    laneid: np.ndarray = field(default=None)
    warpid: np.ndarray = field(default=None)     # warp inside its block
    warp_index: np.ndarray = field(default=None)  # warp inside the chunk
    warp_first: np.ndarray = field(default=None)  # chunk lane of the warp's lane 0
    warp_size: np.ndarray = field(default=None)   # lanes in this lane's warp (last may be short)
    lanemask_lt: np.ndarray = field(default=None)

    def __post_init__(self) -> None:
        bx, by, _ = self.block
        t = bx * by * self.block[2]
        self.threads = t
        n = t * self.nblocks
        lin = np.tile(np.arange(t, dtype=np.uint32), self.nblocks)
        self.thread_linear = lin
        self.slot = np.repeat(np.arange(self.nblocks, dtype=np.intp), t)
        self.tid = (lin % np.uint32(bx), (lin // np.uint32(bx)) % np.uint32(by),
                    lin // np.uint32(bx * by))
        self.laneid = lin & np.uint32(31)
        self.warpid = lin >> np.uint32(5)
        warps_per_block = (t + 31) // 32
        self.nwarps = warps_per_block * self.nblocks
        self.warp_index = self.slot * warps_per_block + self.warpid.astype(np.intp)
        self.warp_first = np.arange(n, dtype=np.intp) - self.laneid.astype(np.intp)
        self.warp_size = np.minimum(32, t - self.warpid.astype(np.intp) * 32)
        self.lanemask_lt = ((np.uint64(1) << self.laneid.astype(np.uint64))
                            - np.uint64(1)).astype(np.uint32)


@dataclass
class LaunchContext:
    """Everything a launch shares between its chunks."""
    program: object                  # program.Program
    kernel: object                   # program.KernelProgram
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    memory: object                   # memory.DeviceMemory
    symbols: dict[str, int]
    params: np.ndarray               # the kernel parameter buffer, uint8
    shared_offsets: dict[int, int]   # id(Variable) -> offset in the block's shared memory
    shared_size: int                 # static + dynamic bytes per block
    dynamic_shared: int
    local_size: int                  # bytes of local memory per thread
    printf: list[tuple[int, int, int, str]] = field(default_factory=list)
    clock: int = 0                   # executed block-steps: what %clock reads
    lane_instructions: int = 0       # instructions executed, summed over lanes
    start_ns: int = field(default_factory=time.time_ns)


class State:
    """One chunk: `nblocks` blocks starting at linear block `first_block`."""

    def __init__(self, ctx: LaunchContext, layout: ThreadLayout, first_block: int,
                 nblocks: int, ctaid: tuple[np.ndarray, np.ndarray, np.ndarray],
                 register_count: int, register_dtypes: list[np.dtype]):
        self.ctx = ctx
        self.layout = layout
        self.first_block = first_block
        self.nblocks = nblocks
        self.n = layout.threads * nblocks
        self.regs: list[np.ndarray | None] = [None] * register_count
        self.reg_dtypes = register_dtypes
        self.carry: np.ndarray | None = None
        # Shared memory: one region per block; regions are 16-byte multiples so that every
        # naturally aligned access is element-aligned in the flat buffer.
        self.shared_stride = _round16(max(ctx.shared_size, 1))
        self.shared = np.zeros(self.shared_stride * nblocks, np.uint8)
        self.local_stride = _round16(max(ctx.local_size, 1))
        self.local = np.zeros(self.local_stride * self.n, np.uint8)
        # bar.red: each arriving lane's predicate, and which lanes arrived, until release
        self.barrier_values: np.ndarray | None = None
        self.barrier_arrived: np.ndarray | None = None
        self.ctaid = ctaid  # per lane, from block_coordinates

    def reg(self, index: int) -> np.ndarray:
        value = self.regs[index]
        if value is None:
            value = self.regs[index] = np.zeros(self.n, self.reg_dtypes[index])
        return value

    def lane_ids(self, lanes) -> np.ndarray:
        return np.arange(self.n, dtype=np.intp) if lanes is None else lanes

    def thread_of(self, lane: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """((tid.x, tid.y, tid.z), (ctaid.x, ctaid.y, ctaid.z)) of a chunk lane."""
        tid = tuple(int(a[lane]) for a in self.layout.tid)
        ctaid = tuple(int(a[lane]) for a in self.ctaid)
        return tid, ctaid

    def block_linear(self, lane: int) -> int:
        return self.first_block + int(self.layout.slot[lane])


def block_coordinates(grid: tuple[int, int, int], layout: ThreadLayout, first_block: int,
                      nblocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """%ctaid.x/y/z of every lane of the chunk of `nblocks` blocks from `first_block`."""
    gx, gy, _ = grid
    block_linear = np.arange(first_block, first_block + nblocks, dtype=np.uint32)
    ctaid = (block_linear % np.uint32(gx), (block_linear // np.uint32(gx)) % np.uint32(gy),
             block_linear // np.uint32(gx * gy))
    return tuple(c[layout.slot] for c in ctaid)


def _round16(value: int) -> int:
    return (value + 15) & ~15
