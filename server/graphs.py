"""Executable CUDA graphs on the server: the calls of an instantiated graph, kept per session
so that a launch of it is one message.

The client orders the graph and splits it into segments of wire calls (shim/driver/
graph_exec.py); the server keeps each segment and runs it, at a launch, call by call through
the session's own handlers, so every call is checked as it would be on its own (addresses
against the session's allocations, handles against its tables) at every launch. What may be
in a graph is a short list of calls, and only in shapes that name nothing outside the
session: copies to or from host memory only through the session's pinned segments. A graph
is journaled ("graph", handle, context, segments), so checkpoints, restores and migrations
keep it; its calls are not run by a restore, only kept.

A conditional node is one call, `vgpuGraphConditional` [condition address, type, body
segments]: it reads the condition's 4 bytes of device memory (which kernels set with
cudaGraphSetConditional) once the work before it on the launch's stream has run, and runs
the body segment it selects (IF: the first when nonzero, else the second if any; SWITCH:
the one the value numbers, if any), or for WHILE the body as long as the value is nonzero.
Body segments are not launched by the client; each comes after the segment that names it,
so no body runs itself.

A graph instantiated for device launch (one segment of kernel launches, cooperative ones
too, copies between device addresses or of pinned host segments the device maps, and
memsets) may also be launched by kernels once it has been uploaded (`vgpuGraphUpload`, or a
launch from the host): the emulator's device runtime asks `device_launches` for its nodes
and runs them as the launch mode says (server/emu/device_runtime.py). The kernels of one
launch from the host share the backend's graph environment, from the first segment to the
last: the graphs they launch into the tail stream run on the launch's stream after the last
segment, and a device graph's kernels read its handle (cudaGetCurrentGraphExec).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vgpu.errors import CudaError

from .backends.base import Cancelled
from .handles import HandleTable

__all__ = ["GraphExecs", "GRAPH_OPS"]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_SUPPORTED = 801
# Calls a graph may hold -> the index of their stream argument (the launch's stream goes
# there at each launch), or None.
CONDITIONAL = "vgpuGraphConditional"
GRAPH_CALLS = {"cuLaunchKernel": 8, "cuLaunchCooperativeKernel": 8, "cuEventRecord": 1,
               "cuStreamWaitEvent": 0, "cuMemcpyHtoD": None, "cuMemcpyDtoH": None,
               "cuMemcpyDtoD": None, "vgpuMemset": None, CONDITIONAL: None}
# What a graph launched from the device may hold: kernels (cooperative ones too), copies
# between device addresses or of pinned host segments the device maps, memsets
DEVICE_GRAPH_CALLS = ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuMemcpyDtoD",
                      "cuMemcpyHtoD", "cuMemcpyDtoH", "vgpuMemset")
LAUNCHES = ("cuLaunchKernel", "cuLaunchCooperativeKernel")
# Conditional node types
IF, WHILE, SWITCH = 0, 1, 2
MAX_CONDITIONAL_DEPTH = 32  # conditional nodes nested in each other's bodies
# Where a copy's host side is named: (op, index of its location argument).
HOST_SIDES = {"cuMemcpyHtoD": 1, "cuMemcpyDtoH": 2}
# Bounds on what a session's graphs may make the server keep.
MAX_CALLS_PER_GRAPH = 1 << 16
MAX_GRAPH_BYTES = 64 << 20
CALL_OVERHEAD_BYTES = 64  # what the server keeps per call besides its byte strings

GRAPH_OPS: dict[str, Callable] = {}


def op(name: str):
    def register(fn):
        GRAPH_OPS[name] = fn
        return fn

    return register


@dataclass
class GraphExec:
    context: int
    segments: list[list]  # [[op, args], ...] per segment
    size: int  # bytes charged to the session's graph allowance
    device_launch: bool = False  # kernels may launch it (once uploaded)
    uploaded: bool = False
    # The first and last segments a launch runs (the rest are conditional bodies)
    first_segment: int = 0
    last_segment: int = -1
    # The environment of the launch under way (Backend.graph_environment), from its first
    # segment to its last
    environment: object = None


def _checked_call(call) -> tuple[list, int]:
    """A call a graph may hold, as [op, args], and the bytes it costs to keep."""
    op_name, args = call
    if op_name not in GRAPH_CALLS or not isinstance(args, list | tuple):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{str(op_name)[:40]!r} cannot be part of a "
                                                  f"graph")
    if op_name == CONDITIONAL:
        address, kind, bodies = args
        if not (isinstance(address, int) and kind in (IF, WHILE, SWITCH)
                and isinstance(bodies, list | tuple) and bodies
                and all(isinstance(b, int) for b in bodies)):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "malformed conditional node")
    side = HOST_SIDES.get(op_name)
    if side is not None:
        spec = args[side]
        if not (isinstance(spec, list | tuple) and len(spec) == 3 and spec[0] == "seg"):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            "a graph copies host memory only through pinned host segments")
    size = CALL_OVERHEAD_BYTES + sum(len(a) for a in args if isinstance(a, bytes | list | tuple))
    return [op_name, list(args)], size


class GraphExecs:
    def __init__(self, session) -> None:
        self.session = session
        self.execs: HandleTable[GraphExec] = HandleTable("graph")
        self.bytes = 0

    @op("vgpuGraphCreate")
    def create(self, handle: int, context: int, segments: list, device_launch: bool = False):
        """The calls of an instantiated graph, per segment; `device_launch`: kernels may
        launch it, and it holds one segment of kernel launches."""
        self.session.contexts.get(context)
        self.execs.check_new(handle)
        if device_launch and not self.session.backend.own_device_runtime:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"the {self.session.backend.name} "
                                                      f"backend launches no graphs from kernels")
        if device_launch and not (len(segments) <= 1 and all(
                isinstance(call, list | tuple) and call and call[0] in DEVICE_GRAPH_CALLS
                for segment in segments for call in segment)):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "a graph launched from the device holds "
                                                      "kernel launches, copies and memsets "
                                                      "only")
        if device_launch:
            for segment in segments:
                for call in segment:
                    self._check_device_kernel(call)
        kept, size = [], 0
        if sum(len(segment) for segment in segments) > MAX_CALLS_PER_GRAPH:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"a graph may hold {MAX_CALLS_PER_GRAPH} calls at most")
        for index, segment in enumerate(segments):
            calls = []
            for call in segment:
                checked, cost = _checked_call(call)
                self._check_conditional(checked, index, len(segments))
                calls.append(checked)
                size += cost
            kept.append(calls)
        if self.bytes + size > MAX_GRAPH_BYTES:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"the session's graphs would hold more than {MAX_GRAPH_BYTES} bytes")
        self.bytes += size
        bodies = {body for segment in kept for op_name, args in segment
                  if op_name == CONDITIONAL for body in args[2]}
        launched = [index for index in range(len(kept)) if index not in bodies]
        self.execs.add(handle, GraphExec(context, kept, size, bool(device_launch),
                                         first_segment=min(launched, default=0),
                                         last_segment=max(launched, default=-1)))
        self.session.journal.created("graph", handle, context, kept, bool(device_launch))

    def _check_device_kernel(self, call: list) -> None:
        """A device graph's kernels may launch graphs but not kernels (CUDA forbids them
        dynamic parallelism)."""
        if call[0] not in LAUNCHES or not call[1]:
            return
        function = self.session.functions.get(call[1][0])
        kernel = self.session.modules.get(function.module).loaded.kernels[function.name]
        if kernel.launches_grids:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"kernel {function.name!r} launches kernels (dynamic parallelism), "
                            f"which a graph launched from the device may not")

    def _check_conditional(self, call: list, segment: int, segments: int) -> None:
        """A conditional node's bodies are segments after the one holding it, and only a
        backend whose kernels set conditions in device memory (the emulator's device
        runtime) runs them."""
        if call[0] != CONDITIONAL:
            return
        if not self.session.backend.own_device_runtime:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"the {self.session.backend.name} "
                                                      f"backend has no conditional nodes")
        if not all(segment < body < segments for body in call[1][2]):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            "a conditional node's bodies must be later segments of its graph")

    def restore(self, handle: int, context: int, segments: list,
                device_launch: bool = False) -> None:
        """A journaled graph made again. A device graph was uploaded where it ran before (its
        journal entry is the same whether it was or not): kernels may launch it at once."""
        self.create(handle, context, segments, device_launch)
        self.execs.get(handle).uploaded = bool(device_launch)

    @op("vgpuGraphLaunch")
    def launch(self, handle: int, segment: int, stream: int):
        """Run one segment of a graph on `stream`, call after call; the first that fails
        ends the launch with its error."""
        graph = self.execs.get(handle)
        if not 0 <= segment < len(graph.segments):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"the graph has no segment {segment}")
        session = self.session
        session._check_stream(stream)
        graph.uploaded = True
        # The kernels of one launch share an environment: their tail launches run after
        # the graph's last node, and a device graph's kernels know their graph.
        if segment == graph.first_segment or graph.environment is None:  # a launch begins
            graph.environment = session.backend.graph_environment(
                handle if graph.device_launch else 0)
        environment = session.graph_environment = graph.environment
        last = segment == graph.last_segment
        # The graph's copies and memsets wait for what is queued before them on the launch's
        # stream (its kernels run on that stream's lane), as copies issued on it would.
        issued_on, session.scope_stream = session.scope_stream, stream
        try:
            self._run(graph, segment, stream, 0)
        except BaseException:  # the launch ends here: its tail launches never run
            last, environment = True, None
            raise
        finally:
            session.scope_stream = issued_on
            session.graph_environment = None
            if last:
                graph.environment = None
        if last and environment is not None:
            session.run_graph_tails(environment, stream)

    def _run(self, graph: GraphExec, segment: int, stream: int, depth: int) -> None:
        session = self.session
        for op_name, args in graph.segments[segment]:
            if session.cancelled:  # its client is gone: stop between calls too
                raise Cancelled
            if op_name == CONDITIONAL:
                self._conditional(graph, args, stream, depth)
                continue
            place = GRAPH_CALLS[op_name]
            if place is not None:
                args = list(args)
                args[place] = stream
            code, _ = session._run_one((op_name, args))
            if code:
                raise CudaError(code, session.last_error_message)

    def _conditional(self, graph: GraphExec, args: list, stream: int, depth: int) -> None:
        address, kind, bodies = args
        if depth >= MAX_CONDITIONAL_DEPTH:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional nodes nest "
                                                      f"{MAX_CONDITIONAL_DEPTH} deep at most")
        value = self._condition(address)
        if kind == WHILE:
            while value:
                self._run(graph, bodies[0], stream, depth + 1)
                value = self._condition(address)
            return
        if kind == IF:
            chosen = 0 if value else 1
        else:
            chosen = value
        if chosen < len(bodies):
            self._run(graph, bodies[chosen], stream, depth + 1)

    def _condition(self, address: int) -> int:
        """A condition's value, once what was queued before on the launch's stream (the
        kernels that set it) has run."""
        session = self.session
        if session.cancelled:  # a WHILE loop stops for a client that is gone
            raise Cancelled
        if session.lanes.concurrent:
            session._wait_lanes(session._scope_points())
        session._check_range(address, 4)
        value = bytearray(4)
        session.backend.read_into(address, memoryview(value))
        return int.from_bytes(value, "little")

    @op("vgpuGraphSetCall")
    def set_call(self, handle: int, segment: int, index: int, call):
        """One call of a graph replaced by one of the same kind (a node's new parameters)."""
        graph = self.execs.get(handle)
        if not (0 <= segment < len(graph.segments) and 0 <= index < len(graph.segments[segment])):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "the graph has no such call")
        checked, cost = _checked_call(call)
        self._check_conditional(checked, segment, len(graph.segments))
        if graph.device_launch:
            self._check_device_kernel(checked)
        old = graph.segments[segment][index]
        if checked[0] != old[0]:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "a node's call keeps its kind")
        old_cost = _checked_call(old)[1]
        if self.bytes - old_cost + cost > MAX_GRAPH_BYTES:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, "the session's graphs are too large")
        self.bytes += cost - old_cost
        graph.size += cost - old_cost
        graph.segments[segment][index] = checked
        self.session.journal.created("graph", handle, graph.context, graph.segments,
                                     graph.device_launch)

    @op("vgpuGraphUpload")
    def upload(self, handle: int, stream: int):
        """cuGraphUpload: the graph is on the device (it always is here), so kernels may
        launch it."""
        graph = self.execs.get(handle)
        self.session._check_stream(stream)
        graph.uploaded = True

    def device_launches(self, handle: int) -> list[tuple] | None:
        """What a kernel's cudaGraphLaunch of `handle` runs, in order: ("kernel", loaded
        module, kernel name, grid, block, shared bytes, parameters, cooperative), ("copy",
        dst, src, size) and ("fill", dst, pattern, count); None when no graph by that handle may be
        launched from the device (not one, not instantiated for it, not uploaded) or one of
        its calls names what the session does not hold. Called from the launching kernel's
        thread."""
        graph = self.execs.find(handle)
        if graph is None or not graph.device_launch or not graph.uploaded:
            return None
        try:
            return [self._device_step(op_name, args)
                    for op_name, args in (graph.segments[0] if graph.segments else ())]
        except (CudaError, TypeError, ValueError):
            return None

    def _device_step(self, op_name: str, args: list) -> tuple:
        """A call's arguments are checked when the host launches its graph; here, before
        the emulator is given them, as a client may have sent anything."""
        session = self.session
        if op_name in LAUNCHES:
            if len(args) != 10 or not all(isinstance(a, int) for a in args[:8]) \
                    or not isinstance(args[9], bytes):
                raise ValueError("malformed launch")
            function = session.functions.get(args[0])
            module = session.modules.get(function.module)
            cooperative = op_name == "cuLaunchCooperativeKernel"
            if cooperative:
                session.check_cooperative_grid(tuple(args[1:4]), tuple(args[4:7]))
            return ("kernel", module.loaded, function.name, tuple(args[1:4]),
                    tuple(args[4:7]), args[7], args[9], cooperative)
        if op_name in ("cuMemcpyDtoD", "cuMemcpyHtoD", "cuMemcpyDtoH"):
            dst, src, size = self._copy_sides(op_name, args)
            session._check_range(dst, size)
            session._check_range(src, size)
            return ("copy", dst, src, size)
        dst, pattern, count = int(args[0]), args[1], int(args[2])
        if not isinstance(pattern, bytes) or len(pattern) not in (1, 2, 4):
            raise ValueError("memset element must be 1, 2 or 4 bytes")
        session._check_range(dst, len(pattern) * count)
        return ("fill", dst, pattern, count)

    def _copy_sides(self, op_name: str, args: list) -> tuple[int, int, int]:
        """(dst, src, size) of a copy, a pinned host segment's side named by where the
        device maps it: a kernel's graph copies what the device reaches, which a segment
        the device does not map is not."""
        if op_name == "cuMemcpyDtoD":
            dst, src, size = (int(a) for a in args)
            return dst, src, size
        spec = args[HOST_SIDES[op_name]]
        seg, device_address = self.session._segment(spec[1])
        offset = int(spec[2])
        if device_address is None or not 0 <= offset <= len(seg):
            raise ValueError("host memory the device does not map")
        host = device_address + offset
        if op_name == "cuMemcpyHtoD":
            return int(args[0]), host, int(args[2])
        return host, int(args[0]), int(args[1])

    def tails_pending(self) -> bool:
        """Whether a launch from the host is between its segments (a host node runs in the
        client) with tail launches waiting for its end, which are not journaled."""
        return any(getattr(graph.environment, "tails", None)
                   for _, graph in self.execs.items())

    @op("vgpuGraphDestroy")
    def destroy(self, handle: int):
        graph = self.execs.pop(handle)
        self.bytes -= graph.size
        self.session.journal.destroyed("graph", handle)

    def context_destroyed(self, context: int) -> None:
        for handle, graph in list(self.execs.items()):
            if graph.context == context:
                self.destroy(handle)
