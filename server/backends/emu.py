"""EmuBackend: device memory in host buffers and kernels run by the PTX emulator."""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Callable

import numpy as np

from vgpu.errors import CudaError

from ..arena import ALLOCATION_ALIGNMENT
from ..device_runtime import GRID_WORKSPACE_BYTES
from ..emu import (
    DeviceMemory,
    LaunchCancelled,
    LaunchError,
    MemoryChecker,
    PtxError,
    PtxModule,
    link,
    prepare,
)
from ..emu.device_runtime import (
    DeviceRuntime,
    GraphEnvironment,
    RunningGraphs,
    uses_grid_launches,
    uses_heap,
    uses_launches,
)
from ..emu.errors import IllegalAddress
from ..emu.executor import run_graphs
from ..emu.memory import NO_ACCESS
from .base import (
    Backend,
    Cancelled,
    DeviceDescription,
    KernelDescription,
    KernelFault,
    LoadedModule,
)
from .device_attributes import emu_attributes
from .images import ModuleImage, decode_image

__all__ = ["EmuBackend", "EMU_TOTAL_MEMORY"]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_ILLEGAL_ADDRESS = 700

# The emulated device reports 16 GiB; host pages are committed only when touched.
EMU_TOTAL_MEMORY = 16 << 30
# The threads whose numpy floating-point warnings are off (see EmuBackend.running).
_quiet_threads = threading.local()
_NOTHING_TO_SET_UP = contextlib.nullcontext()  # (reusable: one for every batch)
EMU_COMPUTE_CAPABILITY = (8, 0)
_BINARY_VERSION = EMU_COMPUTE_CAPABILITY[0] * 10 + EMU_COMPUTE_CAPABILITY[1]


class EmuBackend(Backend):
    name = "emu"
    memory_is_host_ram = True
    launches_run_inline = True
    shares_address_space = False  # each session's memory is its own DeviceMemory
    own_device_runtime = True  # server/emu/device_runtime.py

    def __init__(self) -> None:
        # Allocations are mapped in the arena's granules: what a GPU maps at the least.
        self.memory = DeviceMemory(granule=ALLOCATION_ALIGNMENT)
        self.checker = MemoryChecker(strict=False)
        self._cancelled = threading.Event()
        self._writes = WriteLog()
        # What use_device_runtime gave the next launch of each thread (lanes run launches
        # on threads of their own): .place, .device_graphs
        self._next_launch = threading.local()
        self._running_graphs = RunningGraphs()  # kernels' launches of graphs not yet done

    def describe(self) -> DeviceDescription:
        return DeviceDescription(
            name="vgpu emulated GPU (PTX on CPU)",
            uuid=hashlib.md5(b"vgpu-emu-device-0").digest(),
            total_memory=EMU_TOTAL_MEMORY,
            compute_capability=EMU_COMPUTE_CAPABILITY,
            attributes=emu_attributes(EMU_COMPUTE_CAPABILITY),
        )

    def map(self, address: int, size: int, backing: memoryview | None = None,
            device: int = 0) -> None:
        self.memory.map(address, size, backing)
        self._writes.wrote(address, size)

    def unmap(self, address: int) -> None:
        self.memory.unmap(address)

    def write(self, address: int, data: memoryview) -> None:
        self._checked(self.memory.view, address, len(data))[:] = data
        self._writes.wrote(address, len(data))

    def read_into(self, address: int, out: memoryview) -> None:
        out[:] = self._checked(self.memory.view, address, len(out), False)

    def host_view(self, address: int, size: int, writing: bool = True) -> memoryview:
        view = self._checked(self.memory.view, address, size, writing)
        if writing:
            self._writes.wrote(address, size)
        return view

    def copy(self, dst: int, src: int, size: int) -> None:
        self._checked(self.memory.copy, dst, src, size)
        self._writes.wrote(dst, size)

    def fill(self, address: int, pattern: bytes, count: int) -> None:
        self._checked(self.memory.fill, address, pattern, count)
        self._writes.wrote(address, len(pattern) * count)

    def mark(self) -> int:
        return self._writes.mark()

    def changed_since(self, mark: int) -> list[tuple[int, int]] | None:
        return self._writes.since(mark)

    def create_physical(self, size: int, contents: bytearray | None = None,
                        device: int = 0) -> bytearray:
        if contents is not None:
            return contents
        return bytearray(size)  # zeroed pages the host commits only when touched

    def read_physical(self, physical: bytearray, offset: int, out: memoryview) -> None:
        out[:] = memoryview(physical)[offset:offset + len(out)]

    def write_physical(self, physical: bytearray, offset: int, data: memoryview) -> None:
        memoryview(physical)[offset:offset + len(data)] = data

    def map_physical(self, address: int, size: int, physical: bytearray) -> None:
        self.memory.map(address, size, memoryview(physical)[:size], NO_ACCESS)

    def set_access(self, address: int, access: int) -> None:
        self.memory.set_access(address, access)

    def release_physical(self, physical: bytearray) -> None:
        """Nothing to do: the buffer goes with the last mapping that views it."""

    @staticmethod
    def _checked(fn, *args):
        try:
            return fn(*args)
        except IllegalAddress as exc:
            # Memory there, but mapped without the access a copy needs: the copy engine
            # faults on a GPU, and the context is lost as with a kernel's fault.
            code = CUDA_ERROR_ILLEGAL_ADDRESS if exc.denied else CUDA_ERROR_INVALID_VALUE
            raise CudaError(code, str(exc)) from None

    def set_memcheck(self, strict: bool) -> None:
        self.checker = MemoryChecker(strict)

    def load_module(self, image: bytes, allocate: Callable[..., int],
                    device: int = 0) -> LoadedModule:
        decoded: ModuleImage = decode_image(image, _BINARY_VERSION)
        if not decoded.ptx:
            raise CudaError(CUDA_ERROR_NO_BINARY_FOR_GPU, decoded.why_no_ptx or
                            "the module image holds no PTX, which the emu backend needs")
        try:
            module = link(decoded.ptx) if len(decoded.ptx) > 1 else PtxModule.parse(decoded.ptx[0])
        except PtxError as exc:
            raise CudaError(CUDA_ERROR_INVALID_PTX, _why_not_loadable(decoded.ptx, exc)) from None
        variables = {}
        try:
            for name, var in module.variables.items():
                address = allocate(var.size, managed=var.managed)
                self.memory.map(address, var.size)
                variables[name] = (address, var.size)
            # Initializers are written once every variable has its address: one may hold
            # another's (`__device__ const char *s = "..."`).
            symbols = {name: address for name, (address, _) in variables.items()}
            for name, var in module.variables.items():
                if var.init or var.relocations:  # a fresh mapping is zeros: nothing to write
                    self.memory.write(symbols[name], var.initial_bytes(symbols))
        except BaseException:  # out of memory for a variable, say: none of them stays
            for address, _ in variables.values():
                self.memory.unmap(address)
            raise
        kernels = {
            name: KernelDescription(
                name=name,
                param_offsets=[p.offset for p in info.params],
                param_sizes=[p.size for p in info.params],
                param_buffer_size=info.param_size,
                # PTX is compiled for the device it runs on: CUDA reports that binary's
                # architecture, the device's compute capability.
                attributes=dict(info.attributes, binary_version=_BINARY_VERSION),
                uses_printf=_uses_printf(module, name),
                uses_heap=uses_heap(module.runtime_calls[name]),
                launches_kernels=uses_launches(module.runtime_calls[name]),
                launches_grids=uses_grid_launches(module.runtime_calls[name]),
            )
            for name, info in module.kernels.items()
        }
        return LoadedModule(kernels=kernels, variables=variables, handle=module,
                            managed={n for n, v in module.variables.items() if v.managed})

    def unload_module(self, module: LoadedModule) -> None:
        for address, _ in module.variables.values():
            self.memory.unmap(address)

    def running(self):
        """Launches run their kernels with numpy's floating-point warnings off, as under
        `quiet_floating_point()`: set once on each thread that runs sessions' batches, and
        left so, since entering numpy's errstate costs every batch (most hold no launch)
        about 2 us."""
        if not getattr(_quiet_threads, "quiet", False):
            np.seterr(all="ignore")
            _quiet_threads.quiet = True
        return _NOTHING_TO_SET_UP

    def use_device_runtime(self, place: Callable[[str], tuple[int, int]],
                           device_graphs: Callable[[int], list | None] | None = None) -> None:
        self._next_launch.place = place
        self._next_launch.device_graphs = device_graphs

    def _device_runtime(self, cooperative: bool) -> DeviceRuntime | None:
        """What one launch (and its children) gets of the device runtime."""
        given = self._next_launch
        place, device_graphs = getattr(given, "place", None), getattr(given, "device_graphs",
                                                                      None)
        given.place = given.device_graphs = None
        if place is None:
            return None
        workspace = 0
        if cooperative:
            workspace = place("grid_workspace")[0]
            self.memory.write(workspace, bytes(GRID_WORKSPACE_BYTES))  # a fresh barrier
        return DeviceRuntime(self.memory, place, workspace, self._graph_nodes(device_graphs),
                             self._running_graphs)

    def prepare_launch(self, module: LoadedModule, kernel: str, grid, block,
                       shared_bytes: int, cooperative: bool = False
                       ) -> Callable[[bytes, int], tuple[str, str]]:
        symbols = {name: addr for name, (addr, _) in module.variables.items()}
        try:
            prepared = prepare(module.handle, kernel, tuple(grid), tuple(block), shared_bytes,
                               symbols, cooperative)
        except LaunchError as exc:
            raise CudaError(exc.code, str(exc)) from None

        def run(params: bytes, printf_fifo_bytes: int, stream: int = 0,
                environment: GraphEnvironment | None = None) -> tuple[str, str]:
            """Runs to completion (streams run concurrently on threads of their own: see
            server/streams.py)."""
            self._writes.wrote_anywhere()  # a kernel may store through any pointer
            try:
                result = prepared.execute(params, self.memory, self.checker, printf_fifo_bytes,
                                          self._cancelled, self._device_runtime(cooperative),
                                          environment=environment)
            except LaunchError as exc:
                raise KernelFault(exc.code, exc.message, exc.output, exc.diagnostics) from None
            except LaunchCancelled:
                raise Cancelled from None
            return result.printf, result.report

        return run

    def _graph_nodes(self, device_graphs: Callable[[int], list | None] | None):
        """What the device runtime's cudaGraphLaunch runs of a graph: its kernels prepared
        (cooperative ones as one chunk), with their parameters, and its copies and memsets
        as calls (None: no graph a kernel may launch by that handle)."""
        def nodes(handle: int) -> list | None:
            found = device_graphs(handle) if device_graphs is not None else None
            if found is None:
                return None
            return [self._graph_node(step) for step in found]
        return nodes

    def _graph_node(self, step: tuple):
        kind, *args = step
        if kind in ("copy", "fill"):
            operation = self.copy if kind == "copy" else self.fill

            def run() -> None:  # fails the launching grid as its kernels' faults do
                try:
                    operation(*args)
                except CudaError as exc:
                    raise LaunchError(exc.code, f"a {kind} node of a graph launched from "
                                                f"the device: {exc.message}") from None
            return run
        module, name, grid, block, shared, params, cooperative = args
        return (prepare(module.handle, name, grid, block, shared,
                        {n: address for n, (address, _) in module.variables.items()},
                        cooperative), params)

    def graph_environment(self, graph: int) -> GraphEnvironment:
        return GraphEnvironment(graph)

    def run_graph_tails(self, environment: GraphEnvironment,
                        printf_fifo_bytes: int) -> tuple[str, str]:
        tails, environment.tails = environment.tails, []
        if not tails:
            return "", ""
        self._writes.wrote_anywhere()
        try:
            result = run_graphs(tails, self.memory, self.checker, printf_fifo_bytes,
                                self._cancelled, 1)
        except LaunchError as exc:
            raise KernelFault(exc.code, exc.message, exc.output, exc.diagnostics) from None
        except LaunchCancelled:
            raise Cancelled from None
        return result.printf, result.report

    def synchronize(self) -> None:
        """Kernels run to completion inside their launcher; nothing is ever outstanding."""

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        self.memory = DeviceMemory(granule=ALLOCATION_ALIGNMENT)
        self._next_launch = threading.local()


class WriteLog:
    """The ranges written since each mark, until there are too many to be worth keeping
    (or a kernel ran), when everything counts as written."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._generation = 0
        self._ranges: list[tuple[int, int, int]] = []  # (generation, address, size)
        self._anywhere = -1  # the last generation in which anything may have been written

    def mark(self) -> int:
        self._generation += 1
        return self._generation

    def wrote(self, address: int, size: int) -> None:
        if self._anywhere == self._generation:
            return
        if len(self._ranges) >= self.LIMIT:
            self.wrote_anywhere()
        else:
            self._ranges.append((self._generation, address, size))

    def wrote_anywhere(self) -> None:
        self._anywhere = self._generation
        self._ranges.clear()

    def since(self, mark: int) -> list[tuple[int, int]] | None:
        if self._anywhere >= mark:
            return None
        return [(address, size) for generation, address, size in self._ranges
                if generation >= mark]


def _uses_printf(module: PtxModule, kernel: str) -> bool:
    """Does the kernel, or a function it calls, call vprintf (device printf)?"""
    return module.uses(kernel, "vprintf")


# Texture, surface and sampler references (CUDA 11's `texture<>`, removed in CUDA 12): the
# emulator implements texture and surface objects only.
_REFERENCES = re.compile(r"\.(?:texref|surfref|samplerref)\b")


def _why_not_loadable(ptx: list[str], exc: PtxError) -> str:
    """The loader's error, or what it stumbled on: references are the usual reason."""
    for text in ptx:
        found = _REFERENCES.search(text)
        if found:
            line = text.count("\n", 0, found.start()) + 1
            return (f"texture and surface references are not supported by the emu backend "
                    f"(texture and surface objects are), and the module declares one (PTX "
                    f"line {line}: {text.splitlines()[line - 1].strip()})")
    return f"the module's PTX cannot be loaded: {exc}"
