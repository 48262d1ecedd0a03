"""Runs a kernel launch: blocks become numpy lanes, a scheduler drives them through the code.

Blocks are executed in chunks of consecutive blocks whose threads together make about
`LANES_PER_CHUNK` lanes (fewer when the kernel's registers and local memory per thread
would exceed `CHUNK_STATE_BYTES`), so a uniform kernel runs many blocks per numpy
operation while memory stays bounded: one chunk's registers, shared and local memory at a
time. Registers are immutable arrays, so at most one extra copy of a register exists while
an instruction replaces it.

Scheduling: lanes at the same place form a group, keyed by their call stack and program
counter: `(call pc, ..., call pc, block start)`. Each step runs the whole basic block of the
smallest key for its group. Taking the smallest key first makes diverged lanes reconverge
where their paths join (the join point is after both sides in the code layout, and lanes
inside a call sort before lanes waiting after it), and handles any control flow: loops with
per-thread trip counts, early exits, returns from device functions. A group that reaches a
barrier waits there until no other group can run; then every waiting group is released
(threads that exited count as arrived, as on the GPU). A group that runs the same block
`FAIRNESS_STREAK` times in a row while others wait (a spin loop, such as a lock whose holder
is among the waiting lanes) yields one step to the next group, so such loops finish as
they do under Volta's independent thread scheduling.

Cancelling: a launch given a `cancelled` flag (a threading.Event) checks it at every
scheduling step of every chunk, and raises LaunchCancelled once it is set, so a kernel
that would spin for minutes stops within one basic block of its lanes. One attribute test
per step (about 40 ns): nothing next to the numpy operations a step runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from . import native
from .device_printf import DEFAULT_PRINTF_FIFO_BYTES, within_fifo
from .device_runtime import GraphLaunch
from .errors import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_SUPPORTED,
    LaunchError,
    PtxError,
)
from .memcheck import MemoryChecker
from .memory import DeviceMemory
from .spaces import STRAYS_ALLOWED, STRAYS_FAULT, STRAYS_REPORTED, StrayAccess
from .state import Chunk, Fault, LaunchContext, State

__all__ = ["CHUNK_STATE_BYTES", "LANES_PER_CHUNK", "LaunchCancelled", "LaunchResult",
           "PreparedLaunch", "launch", "prepare", "quiet_floating_point", "run_graphs"]

LANES_PER_CHUNK = 1 << 16
# Bytes of state (registers at 8 bytes each and local memory per lane, shared memory per
# block) one chunk may hold, unless one block alone needs more.
CHUNK_STATE_BYTES = 96 << 20
# Consecutive runs of one group, while others wait, before another group gets a turn.
FAIRNESS_STREAK = 64
MAX_THREADS_PER_BLOCK = 1024
# Nested device-function calls a thread may make (recursion included) before its stack
# overflows, which faults as on a GPU whose stack limit is exceeded.
MAX_CALL_DEPTH = 1024
SMALL_LAYOUT_LANES = 4096  # launches up to this many threads keep their coordinates
MAX_SHARED_PER_BLOCK = 227 * 1024   # what an sm_90 block may opt in to
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)


class LaunchCancelled(BaseException):
    """The launch stopped because its `cancelled` flag was set (whoever waited for it is
    gone). A BaseException, like KeyboardInterrupt: no handler of a call's errors may take it
    for a failed launch and carry on with the next call."""


@dataclass(slots=True)
class LaunchResult:
    printf: str = ""
    lane_instructions: int = 0   # instructions executed, summed over threads
    report: str = ""             # the memory checker's report (stray accesses), for stderr


def launch(module, kernel_name: str, grid, block, shared_bytes: int = 0, params: bytes = b"",
           memory: DeviceMemory | None = None, symbols: dict[str, int] | None = None
           ) -> LaunchResult:
    """Run `kernel_name` of `module` (a PtxModule) over `grid` x `block` threads."""
    prepared = prepare(module, kernel_name, grid, block, shared_bytes, symbols)
    return prepared.run(params, memory if memory is not None else DeviceMemory())


def prepare(module, kernel_name: str, grid, block, shared_bytes: int = 0,
            symbols: dict[str, int] | None = None, cooperative: bool = False
            ) -> PreparedLaunch:
    """Check a launch configuration once; the PreparedLaunch runs it with any parameters.
    A `cooperative` launch runs all its blocks as one chunk, so that they are resident
    together, as grid-wide synchronization needs."""
    program = module.program
    try:
        kernel = program.kernel(kernel_name)
    except PtxError as exc:  # a body parsed only now (a big module's) is malformed
        raise LaunchError(CUDA_ERROR_INVALID_PTX, f"kernel {kernel_name!r} cannot be "
                          f"loaded: {exc}") from None
    if kernel is None:
        raise LaunchError(CUDA_ERROR_NOT_FOUND, f"no kernel named {kernel_name!r} in module")
    if kernel.unsupported is not None:
        raise LaunchError(CUDA_ERROR_NOT_SUPPORTED, f"kernel {kernel_name!r} cannot run on the "
                          f"emulator: PTX {kernel.unsupported}")
    grid = _dims(grid, "grid", MAX_GRID)
    block = _dims(block, "block", MAX_BLOCK)
    info = module.kernels[kernel_name]
    threads = block[0] * block[1] * block[2]
    limit = info.attributes["max_threads_per_block"]
    if threads > limit:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE,
                          f"block of {threads} threads exceeds {limit} for {kernel_name!r}")
    required = kernel.function.directives.get("reqntid")
    if required and tuple(required) + (1,) * (3 - len(required)) != block:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE,
                          f"{kernel_name!r} requires a block of {tuple(required)}")
    if shared_bytes < 0 or kernel.dynamic_offset + shared_bytes > MAX_SHARED_PER_BLOCK:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE,
                          f"{shared_bytes} bytes of dynamic shared memory is too much")
    symbols = dict(symbols or {})
    missing = sorted(kernel.global_symbols - symbols.keys())
    if missing:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE,
                          f"module variable(s) {', '.join(missing)} have no device address")
    prepared = PreparedLaunch(module, kernel, kernel_name, grid, block, shared_bytes, symbols,
                              cooperative)
    if native.enabled():
        prepared.native = native.compiled_kernel(module, kernel_name)
    return prepared


class PreparedLaunch:
    """A kernel with a checked configuration. Loops launch the same kernel with the same
    shape again and again, so everything but the parameters is worked out once: the chunks,
    and for small launches their thread and block coordinates too (read-only, so shared by
    every run; big ones would hold megabytes and are cheap next to their kernel)."""

    def __init__(self, module, kernel, kernel_name: str, grid, block, shared_bytes: int,
                 symbols: dict[str, int], cooperative: bool = False):
        self.module = module   # a PtxModule: device-side launches find their kernels in it
        self.program = module.program
        self.kernel = kernel
        self.kernel_name = kernel_name
        self.grid = grid
        self.block = block
        self.shared_bytes = shared_bytes   # dynamic shared memory per block
        self.shared_size = (kernel.dynamic_offset + shared_bytes if shared_bytes
                            else kernel.static_shared)
        # Per-block shared and per-thread local regions are 16-byte multiples, so every
        # naturally aligned access is element-aligned in their flat buffers.
        self.shared_stride = _round16(max(self.shared_size, 1))
        self.local_size = kernel.local_size  # bytes of local memory per thread
        self.local_stride = _round16(max(kernel.local_size, 1))
        self.symbols = symbols
        self.cooperative = cooperative
        self.native = None   # the kernel compiled to native code, when it is (see native/)
        threads = block[0] * block[1] * block[2]
        self.nblocks = grid[0] * grid[1] * grid[2]
        # what a block's buffers hold: its threads, shared bytes, local bytes a thread (0: none)
        self.block_buffers = (threads, self.shared_stride if self.shared_size else 0,
                              self.local_stride if self.local_size else 0)
        # A chunk's state: each lane's registers and local memory, each block's shared
        # memory (up to 227 KiB: 65,536 one-thread blocks of it would be 14 GiB).
        block_bytes = threads * (8 * kernel.register_count + kernel.local_size) + \
            self.block_buffers[1]
        self._per_chunk = self.nblocks if cooperative else \
            max(1, min(LANES_PER_CHUNK // threads, CHUNK_STATE_BYTES // max(block_bytes, 1)))
        # Made at the first interpreted run (a compiled kernel never needs them).
        self._small = threads * self.nblocks <= SMALL_LAYOUT_LANES
        self._small_chunks: list[Chunk] | None = None

    def _chunks(self):
        for first in range(0, self.nblocks, self._per_chunk):
            yield Chunk(self.grid, self.block, first, min(self._per_chunk, self.nblocks - first))

    def run(self, params: bytes, memory: DeviceMemory, checker: MemoryChecker | None = None,
            printf_fifo_bytes: int = DEFAULT_PRINTF_FIFO_BYTES) -> LaunchResult:
        """Run the kernel once with this parameter buffer."""
        if self.native is not None:   # no numpy arithmetic to quiet
            return self.execute(params, memory, checker, printf_fifo_bytes)
        with quiet_floating_point():
            return self.execute(params, memory, checker, printf_fifo_bytes)

    def execute(self, params: bytes, memory: DeviceMemory, checker: MemoryChecker | None = None,
                printf_fifo_bytes: int = DEFAULT_PRINTF_FIFO_BYTES,
                cancelled=None, runtime=None, depth: int = 0,
                environment=None) -> LaunchResult:
        """`run`, for callers that run many launches inside one `quiet_floating_point()`.

        Without a `checker`, stray global accesses (past an allocation's end, inside its
        mapped granule) fault as strictly as any other; with one, the checker decides.
        Device printf output beyond `printf_fifo_bytes` of FIFO records is dropped.
        Raises LaunchCancelled soon after `cancelled` (a threading.Event) is set.
        `runtime` (a device_runtime.DeviceRuntime) serves the kernel's malloc, device-side
        launches and grid barrier; the grids it launches run before this returns.
        `environment` (a device_runtime.GraphEnvironment): the graph run the kernel is a
        node of, which its graph launches into the tail stream join."""
        program, kernel = self.program, self.kernel
        if len(params) != kernel.param_size:
            raise LaunchError(CUDA_ERROR_INVALID_VALUE,
                              f"{self.kernel_name!r} takes {kernel.param_size} bytes of "
                              f"parameters, got {len(params)}")
        if checker is None or checker.strict:
            strays = STRAYS_FAULT
        elif checker.should_report(self.kernel_name):
            strays = STRAYS_REPORTED
        else:
            strays = STRAYS_ALLOWED
        if self.native is not None:
            printf, report = self.native.run(self, params, memory, checker, strays,
                                             native.threads(), cancelled, printf_fifo_bytes,
                                             runtime, environment)
            return LaunchResult(printf, 0, report)
        # Parameter space is read-only to kernels (spaces.locate refuses stores), so the
        # caller's bytes are used as they are.
        ctx = LaunchContext(self, memory, np.frombuffer(params, np.uint8), strays,
                            printf_fifo_bytes, runtime, depth, environment)
        if self._small and self._small_chunks is None:
            self._small_chunks = list(self._chunks())
        for chunk in self._small_chunks or self._chunks():
            state = State(ctx, chunk, program.register_dtypes)
            try:
                _run(program, kernel, state, cancelled)
            except Fault as fault:
                raise _launch_error(fault, state, self.kernel_name, ctx, printf_fifo_bytes,
                                    _report(checker, self.kernel_name, ctx)) from None
        result = LaunchResult(_printf_text(ctx, printf_fifo_bytes), ctx.lane_instructions,
                              _report(checker, self.kernel_name, ctx))
        # The grid's children: the tail launches last (a stable sort keeps launch order).
        for child in sorted(ctx.children, key=lambda c: c.tail):
            try:
                if isinstance(child, GraphLaunch):
                    done = run_graphs([child], memory, checker, printf_fifo_bytes, cancelled,
                                      depth + 1)
                else:
                    done = child.prepared.execute(child.params, memory, checker,
                                                  printf_fifo_bytes, cancelled, runtime,
                                                  depth + 1)
            except LaunchError as exc:
                raise LaunchError(exc.code, exc.message, result.printf + exc.output,
                                  result.report + exc.diagnostics) from None
            result.printf += done.printf
            result.lane_instructions += done.lane_instructions
            result.report += done.report
        return result


def run_graphs(launches: list[GraphLaunch], memory: DeviceMemory,
               checker: MemoryChecker | None, printf_fifo_bytes: int, cancelled, depth: int
               ) -> LaunchResult:
    """Graphs launched by kernels, one after the other, each in its environment: its
    nodes in order (kernels with their own children; copies and memsets), then the graphs
    its kernels launched into the tail stream, one at a time in launch order, a tail
    graph's own tail launches before the rest of the list (CUDA's order). A graph that
    relaunches itself as its tail loops here, at the same depth, as long as it does."""
    result = LaunchResult("", 0, "")
    pending = list(reversed(launches))  # the next one last
    while pending:
        graph = pending.pop()
        try:
            _run_graph_nodes(graph, result, memory, checker, printf_fifo_bytes, cancelled,
                             depth)
        finally:  # complete (or failed): it may be launched from the device again
            graph.runtime.running.completed(graph)
        tails, graph.environment.tails = graph.environment.tails, []
        pending.extend(reversed(tails))
    return result


def _run_graph_nodes(graph: GraphLaunch, result: LaunchResult, memory: DeviceMemory,
                     checker: MemoryChecker | None, printf_fifo_bytes: int, cancelled,
                     depth: int) -> None:
    """One graph's nodes in order, what they print and report added to `result`."""
    for node in graph.nodes:
        if callable(node):  # a copy or memset
            try:
                node()
            except LaunchError as exc:
                raise LaunchError(exc.code, exc.message, result.printf,
                                  result.report) from None
            continue
        prepared, params = node
        try:
            done = prepared.execute(params, memory, checker, printf_fifo_bytes, cancelled,
                                    graph.runtime, depth, graph.environment)
        except LaunchError as exc:  # with what the graphs before printed
            raise LaunchError(exc.code, exc.message, result.printf + exc.output,
                              result.report + exc.diagnostics) from None
        result.printf += done.printf
        result.lane_instructions += done.lane_instructions
        result.report += done.report


def quiet_floating_point():
    """What kernels run under: IEEE results (inf, NaN, wrap-around) as a GPU gives them,
    without numpy's floating-point warnings."""
    return np.errstate(all="ignore")


def _round16(value: int) -> int:
    return (value + 15) & ~15


def _dims(value, what: str, limits) -> tuple[int, int, int]:
    if isinstance(value, tuple) and len(value) == 3:  # the usual form, checked cheaply
        dims = (int(value[0]), int(value[1]), int(value[2]))
    else:
        dims = tuple(int(v) for v in (value if hasattr(value, "__len__") else (value,)))
        dims = dims + (1,) * (3 - len(dims))
    if len(dims) != 3 or min(dims) <= 0:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE, f"invalid {what} dimensions {dims}")
    if dims[0] > limits[0] or dims[1] > limits[1] or dims[2] > limits[2]:
        raise LaunchError(CUDA_ERROR_INVALID_VALUE, f"{what} dimensions {dims} exceed {limits}")
    return dims


def _printf_text(ctx: LaunchContext, fifo_bytes: int) -> str:
    if not ctx.printf:
        return ""
    return "".join(text for *_, text in sorted(within_fifo(ctx.printf, fifo_bytes)))


def _fault_message(fault: Fault, state: State, kernel_name: str) -> str:
    tid, ctaid = state.thread_of(fault.lane)
    return fault_message(fault.head, fault.reason, tid, ctaid, kernel_name, fault.line)


def fault_message(head: str, reason: str, tid, ctaid, kernel_name: str, line: int) -> str:
    """What a memory checker says of a faulting access: what, where, who, why."""
    return (f"{head} by thread ({tid[0]},{tid[1]},{tid[2]}) in block "
            f"({ctaid[0]},{ctaid[1]},{ctaid[2]}) of kernel '{kernel_name}' "
            f"(PTX line {line}): {reason}")


def _report(checker: MemoryChecker | None, kernel_name: str, ctx: LaunchContext) -> str:
    """The checker's report of the launch's first stray access, if it made one."""
    return checker.report(kernel_name, ctx.reports[0]) if ctx.reports else ""


def _launch_error(fault: Fault, state: State, kernel_name: str, ctx: LaunchContext,
                  fifo_bytes: int, report: str) -> LaunchError:
    """The failed launch: its message, the printf output before the fault, and what goes to
    stderr after it (the checker's report of an earlier stray access, CUDA's line for every
    failed assert)."""
    message = fault.head if fault.verbatim else _fault_message(fault, state, kernel_name)
    assertions = "".join(f"{text}\n" for *_, text in sorted(ctx.assertions))
    return LaunchError(fault.code, message, output=_printf_text(ctx, fifo_bytes),
                       diagnostics=report + assertions)


def _after_stray(stray: StrayAccess, state: State, lanes, block, index: int) -> None:
    """A launch's first stray access: note it for the report, then carry it out and the rest
    of its basic block (further strays of the launch go through quietly). Every op makes
    its accesses before any other effect, so the op that raised can run again."""
    ctx = state.ctx
    ctx.reports.append(_fault_message(stray, state, ctx.launch.kernel_name))
    ctx.strays = STRAYS_ALLOWED
    for k in range(index, len(block.ops)):
        try:
            block.ops[k](state, lanes)
        except Fault as fault:
            if not fault.line:
                fault.line = block.lines[k]
            raise


_EMPTY = np.empty(0, np.intp)
_NEVER_CANCELLED = threading.Event()


def _merge(old, new, n: int):
    if old is None or new is None:
        return None
    merged = np.concatenate((old, new))
    merged.sort()
    return None if len(merged) == n else merged


def _split(lanes, mask: np.ndarray):
    """(lanes where mask, lanes where not mask); None = all lanes, empty = none."""
    if mask.all():
        return lanes, _EMPTY
    if not mask.any():
        return _EMPTY, lanes
    if lanes is None:
        return np.flatnonzero(mask), np.flatnonzero(~mask)
    return lanes[mask], lanes[~mask]


def _run(program, kernel, state: State, cancelled) -> None:
    blocks = program.blocks
    n = state.n
    ctx = state.ctx
    groups: dict[tuple, object] = {(kernel.entry_pc,): None}
    waiting: dict[tuple, tuple] = {}
    last_key: tuple = ()
    streak = 0
    is_cancelled = (cancelled or _NEVER_CANCELLED).is_set

    def push(key, lanes) -> None:
        if lanes is not None and len(lanes) == 0:
            return
        if key in groups:
            groups[key] = _merge(groups[key], lanes, n)
        else:
            groups[key] = lanes

    while True:
        if is_cancelled():
            raise LaunchCancelled
        if not groups:
            if not waiting:
                return
            _release(state, waiting, push)
            continue
        if len(groups) == 1:
            key, lanes = groups.popitem()
        else:
            key = min(groups)
            if key == last_key:
                streak += 1
                if streak >= FAIRNESS_STREAK:
                    # The same lanes keep looping while others wait: maybe a spin-wait on
                    # something the waiting lanes will do (a lock). Let the next group
                    # run one block, as independent thread scheduling would.
                    key = min(k for k in groups if k != last_key)
                    streak = 0
            else:
                streak = 0
            lanes = groups.pop(key)
        last_key = key
        block = blocks[key[-1]]
        ops = block.ops
        ctx.lane_instructions += (len(ops) + 1) * (n if lanes is None else len(lanes))
        index = 0
        try:
            for index, op in enumerate(ops):  # noqa: B007  (index names the failing op)
                op(state, lanes)
        except Fault as fault:
            if not fault.line:
                fault.line = block.lines[index]
            if not isinstance(fault, StrayAccess):
                raise
            _after_stray(fault, state, lanes, block, index)
        term = block.term
        stack = key[:-1]
        if term is None:
            push(stack + (block.next_pc,), lanes)
            continue
        taken = lanes
        if term.guard is not None:
            taken, rest = _split(lanes, term.guard(state, lanes))
            push(stack + (block.next_pc,), rest)
            if taken is not None and len(taken) == 0:
                continue
        kind = term.kind
        if kind == "bra":
            push(stack + (term.target_pc,), taken)
        elif kind == "ret":
            if stack:
                _return(program, state, stack, key[-1], taken)
                push(stack[:-1] + (stack[-1] + 1,), taken)
        elif kind == "exit":
            pass
        elif kind == "call":
            _enter(program, state, stack, term, term.callee, taken, block.term_pc, push)
        elif kind == "icall":
            _enter_indirect(program, state, stack, term, taken, block.term_pc, push)
        elif kind == "bar":
            if term.arrive is not None:
                term.arrive(state, taken)
            wait_key = stack + (block.term_pc,)
            previous = waiting.get(wait_key)
            waiting[wait_key] = (taken if previous is None else _merge(previous[0], taken, n),
                                 term)
        elif kind == "brx":
            _indexed_branch(state, stack, term, taken, push)
        else:
            raise AssertionError(kind)


def _enter(program, state, stack, term, name: str, lanes, call_pc: int, push) -> None:
    """Lanes at `stack` call function `name` from the call at `call_pc`."""
    callee = program.module.functions[name]
    if len(stack) >= MAX_CALL_DEPTH:
        raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, f"call stack overflow calling {name}",
                    f"more than {MAX_CALL_DEPTH} nested calls",
                    0 if lanes is None else int(lanes[0]), term.line)
    for stage in term.before:  # arguments that come from registers or constants
        stage(state, lanes)
    inner = stack + (call_pc,)
    if stack and name in _active(program, inner):
        _save_frame(state, inner, name, lanes)  # recursion: the caller's frame goes aside
    _copy_frame(state, lanes, callee.params, term.arguments)
    push(inner + (program.entries[name],), lanes)


def _active(program, calls) -> set[str]:
    """The functions that lanes are inside of, given the calls that took them there (the
    last one being made now): each call's callee, named by a direct call, else the function
    whose code holds the next call."""
    return {program.code[pc].callee or program.function_of_pc(calls[i + 1])
            for i, pc in enumerate(calls[:-1])}


def _enter_indirect(program, state, stack, term, lanes, call_pc: int, push) -> None:
    """A call through a register: each distinct address the lanes hold is a function."""
    targets = np.asarray(term.index(state, lanes), np.uint64)
    ids = state.lane_ids(lanes)
    targets = np.broadcast_to(targets, ids.shape)
    for address in np.unique(targets):
        chosen = ids[targets == address]
        name = program.function_at.get(int(address))
        fn = program.module.functions.get(name) if name is not None else None
        if fn is None or fn.body is None or fn.is_entry:
            raise Fault(CUDA_ERROR_INVALID_PC, f"call through 0x{int(address):x}",
                        "the address is not a device function of the module",
                        int(chosen[0]), term.line)
        _enter(program, state, stack, term, name,
               None if len(chosen) == state.n else chosen, call_pc, push)


def _return(program, state, stack, ret_pc: int, lanes) -> None:
    """Lanes return from the function they are in to the call at stack[-1]."""
    call = program.code[stack[-1]]
    name = call.callee or program.function_of_pc(ret_pc)
    returns = program.module.functions[name].returns
    saved = state.frames.get(stack)
    if saved is None:
        _copy_frame(state, lanes, call.results, returns)
    else:  # a recursive call: its results, then the caller's own frame back
        values = _read_frame(state, lanes, returns)
        _restore_frame(state, stack, saved, lanes)
        _write_frame(state, lanes, call.results, returns, values)
    for stage in call.after:  # results that go to registers
        stage(state, lanes)


def _save_frame(state, inner, name: str, lanes) -> None:
    """Keep the lanes' frame (local bytes and registers) of function `name` until they
    return from the call that `inner` (the callee's stack) names."""
    frame_bytes, registers = state.ctx.launch.kernel.frames[name]
    saved = state.frames.get(inner)
    if saved is None:
        saved = state.frames[inner] = _SavedFrame(
            name, np.zeros(state.n, bool),
            np.zeros((state.n, len(frame_bytes)), np.uint8), {})
    ids = state.lane_ids(lanes)
    saved.pending[ids] = True
    if len(frame_bytes):
        saved.local[ids] = state.local[(ids * state.local_stride)[:, None] + frame_bytes]
    for reg in registers:
        kept = saved.registers.get(reg)
        if kept is None:
            kept = saved.registers[reg] = np.zeros(state.n, state.reg_dtypes[reg])
        kept[ids] = state.reg(reg)[ids]


def _restore_frame(state, inner, saved, lanes) -> None:
    frame_bytes, registers = state.ctx.launch.kernel.frames[saved.name]
    ids = state.lane_ids(lanes)
    if len(frame_bytes):
        state.local[(ids * state.local_stride)[:, None] + frame_bytes] = saved.local[ids]
    for reg, kept in saved.registers.items():
        value = state.reg(reg).copy()  # registers are immutable arrays
        value[ids] = kept[ids]
        state.regs[reg] = value
    saved.pending[ids] = False
    if not saved.pending.any():
        del state.frames[inner]


@dataclass(slots=True)
class _SavedFrame:
    name: str
    pending: np.ndarray      # lanes whose frame is kept here
    local: np.ndarray        # (lanes, frame bytes)
    registers: dict          # register id -> values per lane


def _read_frame(state, lanes, sources) -> list[np.ndarray]:
    offsets = state.ctx.launch.kernel.local_offsets
    ids = state.lane_ids(lanes) * state.local_stride
    return [state.local[ids[:, None] + (offsets[id(src)] + np.arange(src.size))]
            for src in sources]


def _write_frame(state, lanes, destinations, sources, values) -> None:
    offsets = state.ctx.launch.kernel.local_offsets
    ids = state.lane_ids(lanes) * state.local_stride
    for dst, src, value in zip(destinations, sources, values, strict=False):
        size = min(dst.size, src.size)
        state.local[ids[:, None] + (offsets[id(dst)] + np.arange(size))] = value[:, :size]


def _copy_frame(state, lanes, destinations, sources) -> None:
    """Copy .param variables (call arguments in, return values out) in local memory."""
    offsets = state.ctx.launch.kernel.local_offsets
    stride = state.local_stride
    ids = state.lane_ids(lanes) * stride
    for dst, src in zip(destinations, sources, strict=False):
        size = min(dst.size, src.size)
        d, s = offsets[id(dst)], offsets[id(src)]
        columns = np.arange(size)
        state.local[ids[:, None] + (d + columns)] = state.local[ids[:, None] + (s + columns)]


def _indexed_branch(state, stack, term, lanes, push) -> None:
    index = np.asarray(term.index(state, lanes))
    index = np.broadcast_to(index, (state.n if lanes is None else len(lanes),))
    ids = state.lane_ids(lanes)
    for k, target in enumerate(term.target_pcs):
        chosen = ids[index == k]
        if len(chosen):
            push(stack + (target,), None if len(chosen) == state.n else chosen)
    out_of_range = index >= len(term.target_pcs)
    if out_of_range.any():
        raise Fault(CUDA_ERROR_NOT_SUPPORTED, "brx.idx index out of range",
                    "branch index beyond the target list", int(ids[out_of_range][0]),
                    term.line)


def _release(state: State, waiting: dict, push) -> None:
    """Every remaining thread waits at a barrier: open them all."""
    released = list(waiting.items())
    waiting.clear()
    for _, (lanes, term) in released:
        if term.release is not None:
            term.release(state, lanes)
    state.barrier_values = state.barrier_arrived = None
    for key, (lanes, _) in released:
        push(key[:-1] + (key[-1] + 1,), lanes)
