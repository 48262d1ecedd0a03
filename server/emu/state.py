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

from dataclasses import dataclass, field

import numpy as np

from .device_printf import DEFAULT_PRINTF_FIFO_BYTES

__all__ = ["Chunk", "Fault", "LaunchContext", "State", "ThreadLayout", "lane_count"]


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


class LaunchContext:
    """One run of a launch, shared by its chunks: its memory, parameters, output and
    counters. `launch` (a PreparedLaunch) holds what every run of the same kernel and shape
    shares: program, kernel, grid, block, symbols, shared and local memory sizes."""

    __slots__ = ("launch", "memory", "params", "strays", "printf", "printf_room", "assertions",
                 "reports", "lane_instructions", "runtime", "grid_workspace", "depth",
                 "children", "last_errors", "environment")

    def __init__(self, launch, memory, params: np.ndarray, strays: str,
                 printf_fifo_bytes: int = DEFAULT_PRINTF_FIFO_BYTES, runtime=None,
                 depth: int = 0, environment=None):
        self.launch = launch
        self.memory = memory             # memory.DeviceMemory
        self.params = params             # the parameter buffer, uint8
        self.strays = strays             # what stray global accesses do (spaces.STRAYS_*)
        # (block, thread, sequence number, text) of each printf call
        self.printf: list[tuple[int, int, int, str]] = []
        # What the printf FIFO still takes: its bytes, and as many bytes of formatted text
        # (a record holds arguments; the text made of them is kept, and bounded too). Once a
        # call does not fit, it and every later one are dropped, as a full FIFO drops them.
        self.printf_room = [printf_fifo_bytes, printf_fifo_bytes]
        self.assertions: list[tuple[int, int, str]] = []  # (block, thread, CUDA's message)
        self.reports: list[str] = []     # the memory checker's reports, for stderr
        self.lane_instructions = 0       # instructions executed, summed over lanes
        # The device runtime (device_runtime.DeviceRuntime: heap, device-side launches,
        # the grid barrier of a cooperative launch), None where the caller gives none.
        self.runtime = runtime
        # a cooperative launch's grid barrier (or a device graph's cooperative kernel's)
        self.grid_workspace = runtime.grid_barrier(launch, depth) if runtime is not None else 0
        self.depth = depth               # 0 for a host launch, 1 for its children, ...
        self.children: list = []         # device-side launches, run once this grid is done
        # (block, thread) -> the last error of its device runtime calls (cudaGetLastError)
        self.last_errors: dict[tuple[int, int], int] = {}
        # The graph run this grid is a node of (device_runtime.GraphEnvironment), or None
        self.environment = environment


class Chunk:
    """Blocks [first_block, first_block + nblocks) of a launch, run together as numpy lanes,
    with their thread and block coordinates (read-only: runs of a shape may share them)."""

    __slots__ = ("first_block", "nblocks", "layout", "ctaid")

    def __init__(self, grid: tuple[int, int, int], block: tuple[int, int, int],
                 first_block: int, nblocks: int):
        self.first_block = first_block
        self.nblocks = nblocks
        self.layout = ThreadLayout(block, nblocks)
        gx, gy, _ = grid
        block_linear = np.arange(first_block, first_block + nblocks, dtype=np.uint32)
        ctaid = (block_linear % np.uint32(gx), (block_linear // np.uint32(gx)) % np.uint32(gy),
                 block_linear // np.uint32(gx * gy))
        self.ctaid = tuple(c[self.layout.slot] for c in ctaid)  # per lane
        for array in (*self.ctaid, *self.layout.tid, self.layout.slot, self.layout.laneid,
                      self.layout.warpid, self.layout.thread_linear):
            array.flags.writeable = False  # an op writing in place would corrupt later runs


_NO_MEMORY = np.zeros(0, np.uint8)
_NO_MEMORY.flags.writeable = False


class State:
    """One chunk's execution state: registers, shared and local memory, barriers."""

    __slots__ = ("ctx", "layout", "first_block", "nblocks", "n", "ctaid", "regs",
                 "reg_dtypes", "carry", "shared_stride", "shared", "local_stride", "local",
                 "barrier_values", "barrier_arrived", "frames")

    def __init__(self, ctx: LaunchContext, chunk: Chunk, register_dtypes: list[np.dtype]):
        self.ctx = ctx
        layout = self.layout = chunk.layout
        self.first_block = chunk.first_block
        nblocks = self.nblocks = chunk.nblocks
        n = self.n = layout.threads * nblocks
        self.ctaid = chunk.ctaid
        self.regs: list[np.ndarray | None] = [None] * len(register_dtypes)
        self.reg_dtypes = register_dtypes
        self.carry: np.ndarray | None = None
        launch = ctx.launch
        # Kernels without shared or local memory never touch these buffers: every access
        # is checked against a size of 0 first.
        self.shared_stride = launch.shared_stride
        self.shared = (np.zeros(launch.shared_stride * nblocks, np.uint8) if launch.shared_size
                       else _NO_MEMORY)
        self.local_stride = launch.local_stride
        self.local = (np.zeros(launch.local_stride * n, np.uint8) if launch.local_size
                      else _NO_MEMORY)
        # bar.red: each arriving lane's predicate, and which lanes arrived, until release
        self.barrier_values: np.ndarray | None = None
        self.barrier_arrived: np.ndarray | None = None
        # callee stack -> the caller frames a recursive call set aside (executor.py)
        self.frames: dict[tuple, object] = {}

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
