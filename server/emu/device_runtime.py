"""The device runtime that kernels call (what libcudadevrt provides on a GPU): malloc and
free on the device heap (C++ new and delete compile to them), device-side kernel launches
(dynamic parallelism), the device API around them, and the condition of graphs'
conditional nodes.

A launch gets a `DeviceRuntime` from its backend: the heap allocation, the allocation that
holds device-side launches' parameter buffers (cudaLimitDevRuntimePendingLaunchCount slots
of `PARAMETER_BUFFER_BYTES`), both made when first used, and for a cooperative launch the
grid barrier cooperative groups' grid.sync() uses (read through %envreg1/%envreg2, as the
driver passes it).

Device-side launches follow CUDA's dynamic parallelism (CDP2) semantics: a launch made by
a thread is recorded with its parameters when `cudaLaunchDevice` is called, and runs after
the launching grid's blocks have all finished (children never run concurrently with their
parent here, which CUDA allows); the parent grid completes only once its children have, so
the host sees their results after synchronizing with the parent. Launches into the tail
stream run after the parent's other children; the others run in the order they were made,
each with its own children before the next. A child's fault fails the whole launch, as it
fails the parent's stream on a GPU.

Graphs launched by kernels (cudaGraphLaunch) follow CUDA's execution environments: a graph
runs in an environment of its own (`GraphEnvironment`), which its kernels' fire-and-forget
launches join; the graphs they launch into the tail stream run once the graph and that work
are done, one at a time in the order they were launched, a tail graph's own tail launches
before the rest of the list. A kernel that is a node of a graph launched from the host
enqueues its tail launches in that graph's environment, which the server finishes after the
graph's last node; %current_graph_exec (cudaGetCurrentGraphExec) reads the environment's
graph when it was instantiated for device launch, else 0. A graph launched from the device
is not launched from the device again before it completes (cudaErrorInvalidValue, as on
CUDA), but for one tail launch of itself at a time (`RunningGraphs`).

The PTX names these functions as nvcc 12+ emits them (`__cudaCDP2*`), and as the PTX ISA
documents the ABI (`cudaGetParameterBuffer`, `cudaLaunchDevice`, and the V2 forms).
Cooperative groups' grid functions (`cudaCG*`, which numba-cuda calls; nvcc's headers use
%envreg1/2 and atomics instead) work in cooperative launches, and in the cooperative kernel
nodes of graphs that kernels launch.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .device_heap import DeviceHeap
from .errors import CUDA_ERROR_LAUNCH_FAILED, LaunchError
from .spaces import load, store
from .state import Fault, State, lane_count

__all__ = ["DeviceRuntime", "GraphEnvironment", "GraphLaunch", "PARAMETER_BUFFER_BYTES",
           "RunningGraphs",
           "RUNTIME_FUNCTIONS", "uses_heap", "uses_launches", "uses_grid_launches"]

# The most parameter bytes a device-side launch takes (CUDA's limit for them).
PARAMETER_BUFFER_BYTES = 4096
MAX_NESTING_DEPTH = 24  # a grid and 23 generations of children, as on CUDA
# What one graph's environment may hold, as on CUDA: graphs pending in its tail launch
# list, and fire-and-forget graphs launched in one run of it.
MAX_PENDING_TAIL_LAUNCHES = 255
MAX_FIRE_AND_FORGET = 120

# cudaError_t values the device runtime returns
_SUCCESS = 0
_INVALID_VALUE = 1
_MEMORY_ALLOCATION = 2
_INVALID_CONFIGURATION = 9
_LAUNCH_MAX_DEPTH_EXCEEDED = 65
_LAUNCH_PENDING_COUNT_EXCEEDED = 69
_INVALID_DEVICE_FUNCTION = 98

TAIL_LAUNCH_STREAM = 0x3  # cudaStreamTailLaunch
# The streams a kernel launches graphs into: cudaStreamGraphTailLaunch,
# cudaStreamGraphFireAndForget, cudaStreamGraphFireAndForgetAsSibling
GRAPH_TAIL_LAUNCH, GRAPH_FIRE_AND_FORGET, GRAPH_SIBLING = (k << 56 for k in (1, 2, 3))
_FIRST_DEVICE_STREAM = 0x100

_U64 = np.dtype(np.uint64)
_U32 = np.dtype(np.uint32)


class DeviceRuntime:
    """The device runtime's memory for one launch and its children, from the backend:
    `place(name)` gives (address, size) of "heap" and "launch_buffers" (made when first
    asked for, so a kernel that never mallocs leaves the heap's size open);
    `grid_workspace` is a cooperative launch's grid barrier (0 in other launches); the
    cooperative kernel nodes of graphs that kernels launch use the place "grid_workspace"
    (`grid_barrier`)."""

    def __init__(self, memory, place: Callable[[str], tuple[int, int]],
                 grid_workspace: int = 0,
                 graph_kernels: Callable[[int], list | None] | None = None,
                 running: RunningGraphs | None = None):
        self.memory = memory
        self.place = place
        self.grid_workspace = grid_workspace
        # cudaGraphLaunch: a graph's nodes (GraphLaunch.nodes), or None for a handle that
        # names no graph a kernel may launch; and the session's device launches of graphs
        # that have not completed
        self.graph_kernels = graph_kernels
        self.running = running if running is not None else RunningGraphs()
        self._heap: DeviceHeap | None = None
        self._buffers: tuple[int, int] | None = None  # base address, slots
        self.next_slot = 0
        # parameter buffer -> (kernel name, grid, block, shared bytes) of a V2 launch to come
        self.pending: dict[int, tuple] = {}
        self.streams = _FIRST_DEVICE_STREAM

    def grid_barrier(self, launch, depth: int) -> int:
        """The grid barrier of a run of `launch` (a PreparedLaunch) `depth` generations
        below the host's: a host launch's is the backend's (0 unless cooperative); a
        cooperative kernel node of a graph launched from the device gets the session's,
        reset (the grids that used it before have finished); other children have none."""
        if not depth:
            return self.grid_workspace
        if not launch.cooperative:
            return 0
        address, size = self.place("grid_workspace")
        self.memory.write(address, bytes(size))
        return address

    @property
    def heap(self) -> DeviceHeap | None:
        if self._heap is None:
            address, size = self.place("heap")
            self._heap = DeviceHeap(self.memory, address, size) if size else None
        return self._heap

    def parameter_buffer(self) -> int | None:
        if self._buffers is None:
            address, size = self.place("launch_buffers")
            self._buffers = (address, size // PARAMETER_BUFFER_BYTES)
        base, slots = self._buffers
        if self.next_slot >= slots:
            return None
        self.next_slot += 1
        return base + (self.next_slot - 1) * PARAMETER_BUFFER_BYTES


class RunningGraphs:
    """The graphs a session's kernels launched that have not completed (from the launch
    until the graph's nodes and their children are done): CUDA refuses a device launch
    of a graph whose earlier device launch is still running. Held weakly, so a launch that
    never runs (its launcher failed) stops counting once dropped. Launches of one session
    run on several streams' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches: weakref.WeakSet[GraphLaunch] = weakref.WeakSet()

    def start(self, launch: GraphLaunch, self_launch: bool) -> bool:
        """Count `launch` unless a launch of its graph is running (a graph's tail launch of
        itself, `self_launch`, counts beside its own run); whether it was counted."""
        graph = launch.environment.graph
        with self._lock:
            running = sum(1 for other in self._launches if other.environment.graph == graph)
            if running > (1 if self_launch else 0):
                return False
            self._launches.add(launch)
            return True

    def completed(self, launch: GraphLaunch) -> None:
        with self._lock:
            self._launches.discard(launch)


@dataclass(slots=True)
class ChildLaunch:
    prepared: object        # executor.PreparedLaunch
    params: bytes
    tail: bool


class GraphEnvironment:
    """One run of a graph (CUDA's execution environment): `graph` is what its kernels read
    as %current_graph_exec (the executable graph's handle if it was instantiated for device
    launch, else 0); `tails` the graphs its kernels launched into the tail stream, in order."""

    __slots__ = ("graph", "tails", "fire_and_forget")

    def __init__(self, graph: int = 0):
        self.graph = graph
        self.tails: list[GraphLaunch] = []
        self.fire_and_forget = 0


@dataclass(slots=True, eq=False, weakref_slot=True)
class GraphLaunch:
    """A graph launched by a kernel: its nodes in order, kernels as (prepared launch,
    parameters), copies and memsets as calls, run in `environment` with the launching
    kernel's device runtime. `tail`: launched into the tail stream by a kernel that is no
    node of a graph (it runs last of that grid's children)."""
    environment: GraphEnvironment
    nodes: list
    runtime: object         # DeviceRuntime
    tail: bool = False


_HEAP_FUNCTIONS = {"malloc", "free", "__cudaCDP2Malloc", "__cudaCDP2Free"}
_LAUNCH_FUNCTIONS = {"__cudaCDP2GetParameterBuffer", "__cudaCDP2GetParameterBufferV2",
                     "__cudaCDP2LaunchDevice", "__cudaCDP2LaunchDeviceV2",
                     "__cudaCDP2LaunchDevice_ptsz", "__cudaCDP2LaunchDeviceV2_ptsz",
                     "cudaGetParameterBuffer", "cudaGetParameterBufferV2", "cudaLaunchDevice",
                     "cudaLaunchDeviceV2", "cudaGraphLaunch"}


def uses_heap(called: set[str]) -> bool:
    """Whether a kernel that calls these functions needs the device heap."""
    return bool(called & _HEAP_FUNCTIONS)


def uses_launches(called: set[str]) -> bool:
    """Whether a kernel that calls these functions launches kernels or graphs."""
    return bool(called & _LAUNCH_FUNCTIONS)


def uses_grid_launches(called: set[str]) -> bool:
    """Whether a kernel that calls these functions launches kernels (dynamic parallelism)."""
    return bool(called & _LAUNCH_FUNCTIONS - {"cudaGraphLaunch"})


# -- helpers ----------------------------------------------------------------------------------

def _takes(count: int):
    """A builtin's compile function, for calls that pass `count` arguments (else the PTX
    is wrong: a load error naming the call)."""
    def wrap(make):
        def compile_(ctx, arguments, results):
            if len(arguments) != count:
                raise ctx.error(f"the device runtime's function takes {count} argument(s), "
                                f"the call passes {len(arguments)}")
            return make(ctx, arguments, results)
        return compile_
    return wrap


def _frame(state: State, variables) -> list[int]:
    offsets = state.ctx.launch.kernel.local_offsets
    return [offsets[id(v)] for v in variables]


def _arg(state, at, dtype, lanes):
    return load(state, "fparam", at, dtype, 1, lanes)


def _dim3s(state, at, lanes) -> np.ndarray:
    """A dim3 argument of each lane, shape (lanes, 3) (a 12-byte .param, 4-byte aligned)."""
    return np.stack([_arg(state, at + 4 * k, _U32, lanes) for k in range(3)], axis=1)


def _result(state, results, values, dtype, lanes) -> None:
    for at in _frame(state, results)[:1]:
        store(state, "fparam", at, np.asarray(values, dtype), lanes)


def _set_error(state: State, lane: int, code: int) -> int:
    if code != _SUCCESS:
        state.ctx.last_errors[(state.block_linear(lane),
                               int(state.layout.thread_linear[lane]))] = code
    return code


def _heap(state: State):
    runtime = state.ctx.runtime
    return None if runtime is None else runtime.heap


def _allocate(state: State, sizes) -> np.ndarray:
    """malloc of each size (NULL for all when the launch has no heap)."""
    heap = _heap(state)
    return np.asarray(heap.malloc(sizes) if heap is not None else [0] * len(sizes), np.uint64)


# -- malloc and free ------------------------------------------------------------------------

@_takes(1)
def _malloc(ctx, arguments, results):
    def run(state, lanes):
        (size_at,) = _frame(state, arguments)
        sizes = _arg(state, size_at, _U64, lanes)
        _result(state, results, _allocate(state, sizes), _U64, lanes)
    return run


@_takes(1)
def _free(ctx, arguments, results):
    line = ctx.instr.line

    def run(state, lanes):
        (pointer_at,) = _frame(state, arguments)
        pointers = _arg(state, pointer_at, _U64, lanes)
        heap = _heap(state)
        if heap is not None:
            heap.free(pointers, state.lane_ids(lanes), line)
        _result(state, results, np.zeros(len(pointers), np.uint32), _U32, lanes)
    return run


@_takes(2)
def _device_malloc(ctx, arguments, results):
    """cudaMalloc in device code: from the device heap, like malloc."""
    def run(state, lanes):
        where_at, size_at = _frame(state, arguments)
        where = _arg(state, where_at, _U64, lanes)
        sizes = _arg(state, size_at, _U64, lanes)
        addresses = _allocate(state, sizes)
        store(state, "generic", where, addresses, lanes)
        codes = [_set_error(state, int(lane), _SUCCESS if a else _MEMORY_ALLOCATION)
                 for lane, a in zip(state.lane_ids(lanes), addresses, strict=True)]
        _result(state, results, codes, _U32, lanes)
    return run


# -- device-side launches -------------------------------------------------------------------

def _dims(values) -> tuple[int, int, int]:
    return int(values[0]), int(values[1]), int(values[2])


@_takes(4)
def _parameter_buffer_v2(ctx, arguments, results):
    """cudaGetParameterBufferV2(func, grid, block, shared bytes): a buffer for the
    parameters of the launch described, which cudaLaunchDeviceV2 then makes."""
    def run(state, lanes):
        func_at, grid_at, block_at, shared_at = _frame(state, arguments)
        funcs = _arg(state, func_at, _U64, lanes)
        grids = _dim3s(state, grid_at, lanes)
        blocks = _dim3s(state, block_at, lanes)
        shared = _arg(state, shared_at, _U32, lanes)
        out = np.zeros(len(funcs), np.uint64)
        for k, lane in enumerate(state.lane_ids(lanes)):
            name, code = _kernel_at(state, int(funcs[k]))
            buffer = _reserve(state) if code == _SUCCESS else None
            if buffer is None:
                _set_error(state, int(lane), code or _LAUNCH_PENDING_COUNT_EXCEEDED)
                continue
            state.ctx.runtime.pending[buffer] = (name, _dims(grids[k]), _dims(blocks[k]),
                                                 int(shared[k]))
            out[k] = buffer
        _result(state, results, out, _U64, lanes)
    return run


@_takes(2)
def _parameter_buffer(ctx, arguments, results):
    """cudaGetParameterBuffer(alignment, size): a buffer for cudaLaunchDevice."""
    def run(state, lanes):
        _, size_at = _frame(state, arguments)
        sizes = _arg(state, size_at, _U64, lanes)
        out = np.zeros(len(sizes), np.uint64)
        for k, lane in enumerate(state.lane_ids(lanes)):
            buffer = _reserve(state) if int(sizes[k]) <= PARAMETER_BUFFER_BYTES else None
            if buffer is None:
                _set_error(state, int(lane), _LAUNCH_PENDING_COUNT_EXCEEDED
                           if int(sizes[k]) <= PARAMETER_BUFFER_BYTES else _INVALID_VALUE)
                continue
            out[k] = buffer
        _result(state, results, out, _U64, lanes)
    return run


def _reserve(state: State) -> int | None:
    runtime = state.ctx.runtime
    return None if runtime is None else runtime.parameter_buffer()


def _kernel_at(state: State, address: int) -> tuple[str | None, int]:
    program = state.ctx.launch.program
    name = program.function_at.get(address)
    if name is None or not (program.module.functions[name].is_entry
                            and program.module.functions[name].defined):
        return None, _INVALID_DEVICE_FUNCTION
    return name, _SUCCESS


@_takes(2)
def _launch_device_v2(ctx, arguments, results):
    """cudaLaunchDeviceV2(parameter buffer, stream)."""
    def run(state, lanes):
        buffer_at, stream_at = _frame(state, arguments)
        buffers = _arg(state, buffer_at, _U64, lanes)
        streams = _arg(state, stream_at, _U64, lanes)
        codes = np.zeros(len(buffers), np.uint32)
        runtime = state.ctx.runtime
        for k, lane in enumerate(state.lane_ids(lanes)):
            described = runtime.pending.pop(int(buffers[k]), None) if runtime else None
            if described is None:
                codes[k] = _set_error(state, int(lane), _INVALID_VALUE)
                continue
            name, grid, block, shared = described
            codes[k] = _set_error(state, int(lane), _launch(
                state, name, grid, block, shared, int(buffers[k]), int(streams[k])))
        _result(state, results, codes, _U32, lanes)
    return run


@_takes(6)
def _launch_device(ctx, arguments, results):
    """cudaLaunchDevice(func, parameter buffer, grid, block, shared bytes, stream)."""
    def run(state, lanes):
        func_at, buffer_at, grid_at, block_at, shared_at, stream_at = _frame(state, arguments)
        funcs = _arg(state, func_at, _U64, lanes)
        buffers = _arg(state, buffer_at, _U64, lanes)
        grids = _dim3s(state, grid_at, lanes)
        blocks = _dim3s(state, block_at, lanes)
        shared = _arg(state, shared_at, _U32, lanes)
        streams = _arg(state, stream_at, _U64, lanes)
        codes = np.zeros(len(funcs), np.uint32)
        for k, lane in enumerate(state.lane_ids(lanes)):
            name, code = _kernel_at(state, int(funcs[k]))
            if code == _SUCCESS and int(buffers[k]) == 0:
                code = _INVALID_VALUE
            if code == _SUCCESS:
                code = _launch(state, name, _dims(grids[k]), _dims(blocks[k]),
                               int(shared[k]), int(buffers[k]), int(streams[k]))
            codes[k] = _set_error(state, int(lane), code)
        _result(state, results, codes, _U32, lanes)
    return run


def _launch(state: State, name: str, grid, block, shared: int, buffer: int,
            stream: int) -> int:
    """Record a child launch of kernel `name`, its parameters as they are now."""
    from .executor import prepare  # the executor runs this module's builtins

    ctx = state.ctx
    if ctx.depth + 1 >= MAX_NESTING_DEPTH:
        return _LAUNCH_MAX_DEPTH_EXCEEDED
    launch = ctx.launch
    try:
        prepared = prepare(launch.module, name, grid, block, shared, launch.symbols)
    except LaunchError:
        return _INVALID_CONFIGURATION
    size = prepared.kernel.param_size
    params = ctx.memory.read(buffer, size) if size else b""
    ctx.children.append(ChildLaunch(prepared, params, stream == TAIL_LAUNCH_STREAM))
    return _SUCCESS


# -- errors, streams, device ----------------------------------------------------------------

def _last_error(reset: bool):
    def compile_(ctx, arguments, results):
        def run(state, lanes):
            codes = np.zeros(lane_count(state, lanes), np.uint32)
            for k, lane in enumerate(state.lane_ids(lanes)):
                who = (state.block_linear(int(lane)),
                       int(state.layout.thread_linear[int(lane)]))
                codes[k] = (state.ctx.last_errors.pop(who, 0) if reset
                            else state.ctx.last_errors.get(who, 0))
            _result(state, results, codes, _U32, lanes)
        return run
    return compile_


@_takes(2)
def _stream_create(ctx, arguments, results):
    """cudaStreamCreateWithFlags on the device: a stream whose launches run in order (as
    every child launch does here)."""
    def run(state, lanes):
        where_at, _ = _frame(state, arguments)
        where = _arg(state, where_at, _U64, lanes)
        runtime = state.ctx.runtime
        handles = np.zeros(len(where), np.uint64)
        for k in range(len(where)):
            if runtime is not None:
                runtime.streams += 1
                handles[k] = runtime.streams
        store(state, "generic", where, handles, lanes)
        _result(state, results, np.zeros(len(where), np.uint32), _U32, lanes)
    return run


def _succeeds(count: int):
    """Device runtime calls that have nothing to do here (every child launch runs in order,
    and the parent waits for all of them): they return cudaSuccess."""
    @_takes(count)
    def compile_(ctx, arguments, results):
        def run(state, lanes):
            _result(state, results, np.zeros(lane_count(state, lanes), np.uint32), _U32, lanes)
        return run
    return compile_


@_takes(1)
def _get_device(ctx, arguments, results):
    def run(state, lanes):
        (where_at,) = _frame(state, arguments)
        where = _arg(state, where_at, _U64, lanes)
        store(state, "generic", where, np.zeros(len(where), np.int32), lanes)
        _result(state, results, np.zeros(len(where), np.uint32), _U32, lanes)
    return run


# -- graphs --------------------------------------------------------------------------------

@_takes(2)
def _graph_launch(ctx, arguments, results):
    """cudaGraphLaunch(graph, stream) in device code: into cudaStreamGraphTailLaunch the
    graph joins the tail launch list of the launching kernel's graph (or, for a kernel that
    is no node of a graph, runs last of its grid's children); fire-and-forget (and sibling)
    launches run as children of the launching grid, in the order they were made."""
    def run(state, lanes):
        graph_at, stream_at = _frame(state, arguments)
        graphs = _arg(state, graph_at, _U64, lanes)
        streams = _arg(state, stream_at, _U64, lanes)
        codes = np.zeros(len(graphs), np.uint32)
        for k, lane in enumerate(state.lane_ids(lanes)):
            codes[k] = _set_error(state, int(lane),
                                  _launch_graph(state, int(graphs[k]), int(streams[k])))
        _result(state, results, codes, _U32, lanes)
    return run


def _launch_graph(state: State, graph: int, stream: int) -> int:
    ctx, runtime = state.ctx, state.ctx.runtime
    if stream not in (GRAPH_TAIL_LAUNCH, GRAPH_FIRE_AND_FORGET, GRAPH_SIBLING):
        return _INVALID_VALUE
    if ctx.depth + 1 >= MAX_NESTING_DEPTH:
        return _LAUNCH_MAX_DEPTH_EXCEEDED
    try:
        nodes = runtime.graph_kernels(graph) if runtime and runtime.graph_kernels else None
    except LaunchError:
        return _INVALID_CONFIGURATION
    if nodes is None:  # no graph, not instantiated for device launch, or not uploaded
        return _INVALID_VALUE
    launch = GraphLaunch(GraphEnvironment(graph), nodes, runtime)
    environment = ctx.environment
    tail = stream == GRAPH_TAIL_LAUNCH
    if tail and environment is not None:
        if len(environment.tails) >= MAX_PENDING_TAIL_LAUNCHES:
            return _LAUNCH_PENDING_COUNT_EXCEEDED
    elif environment is not None and environment.fire_and_forget >= MAX_FIRE_AND_FORGET:
        return _LAUNCH_PENDING_COUNT_EXCEEDED
    # One launch of a graph from the device at a time; a graph may enqueue itself as its
    # tail once (its own run, launched from the host or the device, goes on meanwhile).
    self_launch = tail and environment is not None and environment.graph == graph
    if self_launch and any(t.environment.graph == graph for t in environment.tails):
        return _INVALID_VALUE
    if not runtime.running.start(launch, self_launch):
        return _INVALID_VALUE
    if tail and environment is not None:
        environment.tails.append(launch)
        return _SUCCESS
    if environment is not None:
        environment.fire_and_forget += 1
    launch.tail = tail
    ctx.children.append(launch)
    return _SUCCESS


@_takes(2)
def _set_conditional(ctx, arguments, results):
    """cudaGraphSetConditional(handle, value): vgpu's conditional handle is the address of
    the condition's 4 bytes of device memory (shim/driver/graph_conditional.py), which the
    server reads where the conditional node runs."""
    def run(state, lanes):
        handle_at, value_at = _frame(state, arguments)
        handles = _arg(state, handle_at, _U64, lanes)
        values = _arg(state, value_at, _U32, lanes)
        store(state, "generic", handles, values, lanes)
    return run


# -- cooperative groups' grid (libcudadevrt's cudaCG*, which numba-cuda calls) -----------

_GRID_SCOPE = 1  # cudaCGScopeGrid


@_takes(1)
def _cg_handle(ctx, arguments, results):
    """cudaCGGetIntrinsicHandle(scope): the grid's barrier in a cooperative launch, else 0."""
    def run(state, lanes):
        (scope_at,) = _frame(state, arguments)
        scopes = _arg(state, scope_at, _U32, lanes)
        handles = np.where(scopes == _GRID_SCOPE, np.uint64(state.ctx.grid_workspace),
                           np.uint64(0))
        _result(state, results, handles, _U64, lanes)
    return run


@_takes(2)
def _cg_sync(ctx, arguments, results):
    """cudaCGSynchronize(handle, flags): a barrier of the whole grid. A cooperative launch
    runs as one chunk, so the scheduler's barrier (every thread of the chunk arrives) is
    the grid's; in another launch there is no grid barrier to wait on."""
    line = ctx.instr.line

    def arrive(state, lanes):
        if not state.ctx.grid_workspace:
            raise Fault(CUDA_ERROR_LAUNCH_FAILED, "grid synchronization outside a cooperative "
                        "launch", "the kernel was not launched with cuLaunchCooperativeKernel",
                        0 if lanes is None else int(lanes[0]), line)

    def release(state, lanes):
        _result(state, results, np.zeros(lane_count(state, lanes), np.uint32), _U32, lanes)
    return ctx.control("bar", arrive=arrive, release=release)


def _cg_numbers(rank: bool):
    """cudaCGGetRank(&thread rank, &grid rank, handle), cudaCGGetSize(&threads, &grids,
    handle): the thread's rank in (or the size of) the grid; one grid."""
    @_takes(3)
    def compile_(ctx, arguments, results):
        def run(state, lanes):
            first_at, second_at, _ = _frame(state, arguments)
            first = _arg(state, first_at, _U64, lanes)
            second = _arg(state, second_at, _U64, lanes)
            launch = state.ctx.launch
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            ids = state.lane_ids(lanes)
            if rank:
                blocks = state.first_block + state.layout.slot[ids]
                values = (blocks * threads + state.layout.thread_linear[ids]).astype(np.uint32)
            else:
                grid = launch.grid
                values = np.full(len(ids), threads * grid[0] * grid[1] * grid[2], np.uint32)
            if (first != 0).any():
                store(state, "generic", first, values, lanes)
            if (second != 0).any():
                store(state, "generic", second, np.full(len(ids), 0 if rank else 1, np.uint32),
                      lanes)
            _result(state, results, np.zeros(len(ids), np.uint32), _U32, lanes)
        return run
    return compile_


RUNTIME_FUNCTIONS = {
    "cudaCGGetIntrinsicHandle": _cg_handle,
    "cudaCGSynchronize": _cg_sync,
    "cudaCGSynchronizeGrid": _cg_sync,
    "cudaCGGetRank": _cg_numbers(rank=True),
    "cudaCGGetSize": _cg_numbers(rank=False),
    "malloc": _malloc,
    "free": _free,
    "__cudaCDP2Malloc": _device_malloc,
    "__cudaCDP2Free": _free,
    "__cudaCDP2GetParameterBufferV2": _parameter_buffer_v2,
    "cudaGetParameterBufferV2": _parameter_buffer_v2,
    "__cudaCDP2GetParameterBuffer": _parameter_buffer,
    "cudaGetParameterBuffer": _parameter_buffer,
    "__cudaCDP2LaunchDeviceV2": _launch_device_v2,
    "__cudaCDP2LaunchDeviceV2_ptsz": _launch_device_v2,
    "cudaLaunchDeviceV2": _launch_device_v2,
    "__cudaCDP2LaunchDevice": _launch_device,
    "__cudaCDP2LaunchDevice_ptsz": _launch_device,
    "cudaLaunchDevice": _launch_device,
    "__cudaCDP2GetLastError": _last_error(reset=True),
    "__cudaCDP2PeekAtLastError": _last_error(reset=False),
    "__cudaCDP2StreamCreateWithFlags": _stream_create,
    "__cudaCDP2StreamDestroy": _succeeds(1),
    "__cudaCDP2GetDevice": _get_device,
    "cudaGraphSetConditional": _set_conditional,
    "cudaGraphLaunch": _graph_launch,
}
