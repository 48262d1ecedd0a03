"""The interface every backend implements, and the values it hands back to sessions."""

from __future__ import annotations

import abc
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu.errors import CudaError

__all__ = ["Backend", "Cancelled", "DeviceDescription", "FileDescriptor", "HostEvent",
           "KernelDescription", "KernelFault", "LoadedModule", "SharedMemory"]

CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_SUPPORTED = 801
PCI_BUS_ID = 33  # CU_DEVICE_ATTRIBUTE_PCI_BUS_ID


class KernelFault(CudaError):
    """A launch that failed while running: besides code and message, the device printf text
    it produced first (for the application's stdout) and what goes to its stderr after that
    (CUDA's line for each failed assert, a memory checker's report)."""

    def __init__(self, code: int, message: str, output: str = "", diagnostics: str = ""):
        super().__init__(code, message)
        self.output = output
        self.diagnostics = diagnostics


class Cancelled(BaseException):
    """Raised by a launcher after `Backend.cancel()`: the session's work is abandoned. A
    BaseException, so that no handler of a call's errors takes it for one and runs on."""


@dataclass(frozen=True)
class DeviceDescription:
    """What `cuDeviceGet*` answers: the backend describes the device it provides."""

    name: str
    uuid: bytes
    total_memory: int
    compute_capability: tuple[int, int]
    attributes: dict[int, int]  # CUdevice_attribute value -> int


@dataclass(frozen=True)
class KernelDescription:
    """A kernel's parameter layout and attributes, as the client needs them to launch."""

    name: str
    param_offsets: list[int]
    param_sizes: list[int]
    param_buffer_size: int
    attributes: dict[str, int]  # num_regs, shared_size_bytes, max_threads_per_block, ...
    uses_printf: bool = False   # once launched, the printf FIFO's size is fixed
    # The device runtime memory its launches need from the session (server/device_runtime.py),
    # on a backend that runs the device runtime itself
    uses_heap: bool = False         # malloc/free (and new/delete)
    launches_kernels: bool = False  # device-side launches
    # Launches kernels, not only graphs (dynamic parallelism, which device graphs may not use)
    launches_grids: bool = False


@dataclass
class LoadedModule:
    """A module a backend has loaded: its kernels and its module-scope variables."""

    kernels: dict[str, KernelDescription]
    variables: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (addr, size)
    managed: set[str] = field(default_factory=set)  # the __managed__ ones among them
    handle: object = None  # backend-private


@dataclass
class SharedMemory:
    """Memory of one session that another session of the server maps (IPC): `size` bytes,
    `lead` bytes into a range of `span` bytes that is mapped whole, at an address aligned
    to `alignment` (a device maps memory in granules); `memory` is the backend's own."""

    memory: object
    size: int
    lead: int = 0
    span: int = 0  # 0: `size`
    alignment: int | None = None


class FileDescriptor:
    """An open file descriptor that is this object's to close (at `close`, or when it is
    collected), unless `take` hands it on. One that goes to another process with a call
    (backends/process_channel.py) arrives there as a descriptor of that process's own."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def take(self) -> int:
        """The descriptor, now the caller's to close."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.take())

    def __del__(self) -> None:
        self.close()


@dataclass
class HostEvent:
    """An event of a backend whose launches run inline: when its last record was made."""

    at: float | None = None


class Backend(abc.ABC):
    """One session's view of a device. Addresses come from the session's VaArena."""

    name: str
    # Whether device memory is host RAM (emu), which a local client may then map itself.
    memory_is_host_ram = False
    # Whether a launcher returns only once its kernel has run (the emulator): streams then
    # need threads of their own to run beside each other (server/streams.py).
    launches_run_inline = False
    # Whether the sessions of one server share one device address space (a GPU's, with
    # unified addressing), so that their arenas must not overlap.
    shares_address_space = True
    # Whether the device runtime kernels call is vgpu's own (the emulator's): only then do
    # they know vgpu's graph objects (cudaGraphSetConditional storing at a conditional
    # handle's address, which conditional nodes read; cudaGraphLaunch of a graph).
    own_device_runtime = False

    @abc.abstractmethod
    def describe(self) -> DeviceDescription: ...

    def reopen(self) -> Backend:
        """A fresh backend of the same kind (a suspended session coming back)."""
        return type(self)()

    def devices_driven(self) -> int | None:
        """How many devices the backend drives (a server offers them all, or the first
        `--devices N`); None where its devices are views of one, as many as asked for."""
        return None

    def describe_device(self, ordinal: int) -> DeviceDescription:
        """Device `ordinal` of those the server offers. Here every device is a view of the
        one `describe` gives (emu's `--devices N`), told apart by its UUID and PCI bus; a
        backend that drives several devices describes each."""
        device = self.describe()
        uuid = bytes(device.uuid[:-1]) + bytes([device.uuid[-1] ^ ordinal])
        attributes = dict(device.attributes)
        attributes[PCI_BUS_ID] = attributes.get(PCI_BUS_ID, 0) + ordinal
        return DeviceDescription(device.name, uuid, device.total_memory,
                                 device.compute_capability, attributes)

    def can_access_peer(self, device: int, peer: int) -> bool:
        """Whether kernels on `device` can reach `peer`'s memory (cuDeviceCanAccessPeer):
        views of one device share all memory."""
        return device != peer

    def attach_arena(self, base: int, size: int, regions: list[int] | None = None) -> None:
        """The session's address range [base, +size): every address `map` and `map_physical`
        are given lies in it; `regions`: where each device's allocations begin (VaArena). A
        backend whose device hands out addresses reserves it here (CudaError where it
        cannot); the others have nothing to do."""
        return None

    @abc.abstractmethod
    def map(self, address: int, size: int, backing: memoryview | None = None,
            device: int = 0) -> None:
        """Back [address, address+size) with memory of device `device` (the ordinal of the
        allocating context's; or with a host buffer)."""

    @abc.abstractmethod
    def unmap(self, address: int) -> None: ...

    # IPC: memory of one session shown in another's address range, both sessions' backends
    # being of one server. A backend whose memory is host RAM shares its buffers.
    def export_memory(self, address: int, size: int) -> SharedMemory:
        """What another session's backend needs to map [address, address+size) of this
        one's memory (an allocation)."""
        view = self.host_view(address, size, writing=False)
        if view is None:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                            f"the {self.name} backend does not share memory between sessions")
        return SharedMemory(view, size)

    def import_memory(self, address: int, shared: SharedMemory) -> None:
        """Map another session's memory (its export_memory) at [address, address+span): its
        bytes show at address+lead. `unmap(address)` takes it away; the memory stays the
        exporter's."""
        self.map(address, shared.size, shared.memory)

    # Whether kernels reach host memory through the host's own addresses (a GPU's unified
    # addressing): a client's pinned buffer is then best mapped in the server at the
    # client's address (map_host).
    host_buffers_at_client_addresses = False

    def map_host(self, address: int, size: int, buffer: memoryview,
                 file: int | None = None) -> str | None:
        """Show a client's page-locked host buffer (mapped in this process as `buffer`) to
        the device at [address, address+size): copies and memsets reach it; returns None
        when kernels do too, else why they do not. `unmap(address)` takes it away. `file`:
        a descriptor of the memory file `buffer` maps from its start, where the server has
        one (a backend in another process maps the file there)."""
        self.map(address, size, buffer)
        return None

    # Physical memory apart from addresses (CUDA's virtual memory API): made, mapped at
    # addresses (one piece at several, each place showing the same bytes), given access.
    # A backend without it refuses the API. One session's physical memory may be another's
    # too (server/vmm_sharing.py): any session's backend of the server may map it, and the
    # last session to hold it releases it with its own backend's release_physical, the
    # maker's backend perhaps closed by then.
    def create_physical(self, size: int, contents: bytearray | None = None,
                        device: int = 0) -> object:
        """Physical memory of `size` bytes on device `device`, mapped nowhere: zero-filled,
        or holding `contents` (a restore's; a backend in host RAM may keep the buffer as the
        memory)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend has no virtual memory management")

    def export_physical(self, physical: object) -> tuple[object, int, int]:
        """`physical` as a backend in another process can import it (import_physical):
        (what identifies it there, such as a FileDescriptor; its size; its device)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend's memory cannot go to another process")

    def import_physical(self, shared: object, size: int, device: int) -> object:
        """Another process's physical memory (its export_physical), as this backend's own:
        mapped and released as if made here (releasing lets go of this process's hold)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend cannot import another process's memory")

    def read_physical(self, physical: object, offset: int, out: memoryview) -> None:
        """Copy physical memory from `offset` into `out` (a checkpoint's copy)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend has no virtual memory management")

    def write_physical(self, physical: object, offset: int, data: memoryview) -> None:
        """Copy `data` into physical memory at `offset` (a restore's)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend has no virtual memory management")

    def map_physical(self, address: int, size: int, physical: object) -> None:
        """Map the first `size` bytes of `physical` at `address`, inaccessible until
        `set_access`; `unmap(address)` takes the mapping away. From the start only, as
        CUDA's cuMemMap maps (its offset must be zero)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend has no virtual memory management")

    def set_access(self, address: int, access: int) -> None:
        """What the mapping at `address` allows: CUmemAccess_flags (0, 1 read, 3 both)."""
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"the {self.name} backend has no virtual memory management")

    @abc.abstractmethod
    def release_physical(self, physical: object) -> None:
        """Free physical memory that nothing maps any longer."""

    @abc.abstractmethod
    def write(self, address: int, data: memoryview) -> None: ...

    @abc.abstractmethod
    def read_into(self, address: int, out: memoryview) -> None: ...

    def write_from(self, address: int, size: int,
                   fill: Callable[[memoryview, int], None]) -> None:
        """Write `size` bytes at `address` that `fill(view, offset)` puts into `view`, the
        bytes from `offset` on, in pieces of the backend's choosing: where the backend
        copies from (a client's pageable memory read straight into its staging). Here, one
        buffer the size of the copy."""
        buffer = memoryview(bytearray(size))
        fill(buffer, 0)
        self.write(address, buffer)

    def read_to(self, address: int, size: int, drain: Callable[[memoryview, int], None]
                ) -> None:
        """Read `size` bytes at `address`, handing them to `drain(view, offset)` in pieces
        of the backend's choosing (write_from's other way)."""
        buffer = memoryview(bytearray(size))
        self.read_into(address, buffer)
        drain(buffer, 0)

    def host_view(self, address: int, size: int, writing: bool = True) -> memoryview | None:
        """A writable host view of device memory, for backends that keep it in host RAM
        (emu); None where device memory is elsewhere, and callers stage through a buffer.
        `writing=False`: the caller only reads it (it does not count as a change)."""
        return None

    @abc.abstractmethod
    def copy(self, dst: int, src: int, size: int) -> None: ...

    def host_side_copy(self, dst: int, src: int, size: int) -> bool:
        """A copy one of whose sides is host memory (`host_view`: a client's page-locked
        buffer, on backends whose device memory is elsewhere), done as a write or a read;
        False where both sides are device memory."""
        source, to = self.host_view(src, size, writing=False), self.host_view(dst, size)
        if source is not None:
            self.write(dst, source)
        elif to is not None:
            self.read_into(src, to)
        return source is not None or to is not None

    def host_side_fill(self, address: int, pattern: bytes, count: int) -> bool:
        """A fill of host memory (`host_view`), done here; False where it is device memory."""
        host = self.host_view(address, len(pattern) * count)
        if host is not None:
            host[:] = pattern * count
        return host is not None

    def mark(self) -> int:
        """A point in the device's history, for `changed_since`."""
        return 0

    def changed_since(self, mark: int) -> list[tuple[int, int]] | None:
        """(address, size) ranges that may have changed since `mark`, where the backend can
        tell (more is allowed, never less); None when it cannot (a kernel ran, say). A
        migration then compares only these ranges with what it sent."""
        return None

    @abc.abstractmethod
    def fill(self, address: int, pattern: bytes, count: int) -> None: ...

    @abc.abstractmethod
    def load_module(self, image: bytes, allocate: Callable[..., int],
                    device: int = 0) -> LoadedModule:
        """Load a module image on device `device`; `allocate(size, managed=False)` gives
        arena addresses for its variables (a __managed__ one's on a page of its own: the
        client maps its host view there)."""

    @abc.abstractmethod
    def unload_module(self, module: LoadedModule) -> None: ...

    def running(self) -> contextlib.AbstractContextManager:
        """Entered around each batch of a session's calls, on the thread that runs them
        (the server's I/O thread or the session's worker): what the device needs set up on
        that thread, such as a current context."""
        return contextlib.nullcontext()

    def stream_created(self, handle: int, device: int = 0) -> None:
        """The session made stream `handle` on device `device`: launches may name it (see
        prepare_launch)."""
        return None

    def stream_destroyed(self, handle: int) -> None:
        return None

    @abc.abstractmethod
    def prepare_launch(self, module: LoadedModule, kernel: str, grid: tuple[int, int, int],
                       block: tuple[int, int, int], shared_bytes: int,
                       cooperative: bool = False) -> Callable[..., tuple[str, str]]:
        """Check a launch configuration (raising CudaError) and return a launcher: called
        with a parameter buffer, the printf FIFO's size, (optionally) the session's
        stream to run on and the graph environment the kernel runs in (graph_environment;
        given only by a backend that has them), it runs the kernel to completion (or
        queues it) and returns
        (device printf output, text for stderr such as a memory checker's report); a kernel
        that fails raises KernelFault. Every other call but the event methods (copies,
        memsets, synchronizations) comes after the work launched before it, on whatever
        stream: only launches on different streams, and their events, may overlap.
        Sessions keep launchers for the shapes a program repeats. A `cooperative` launch
        keeps all its blocks resident together (cuLaunchCooperativeKernel), for grid-wide
        synchronization."""

    def use_device_runtime(self, place: Callable[[str], tuple[int, int]],
                           device_graphs: Callable[[int], list | None] | None = None) -> None:
        """Where the next launch finds the device runtime's memory (see
        server/device_runtime.py): `place(name)` -> (address, size) of "heap",
        "launch_buffers" or "grid_workspace", made when first asked for; and the graphs
        its kernels may launch (`device_graphs(handle)`: server/graphs.py's
        device_launches). Only a backend whose kernel descriptions ask for them is given
        it."""
        return None

    # Events. A session's event is the backend's, recorded on the session stream's device
    # stream, so a wait for it or its timing is the device's (a GPU's events). Here, for a
    # backend whose launches run inline: the work before a record is done when it is made
    # (the session runs each stream's work in order on its lane, server/streams.py), so an
    # event is the host clock's time of its record and waits have nothing left to wait for.
    # An event given to these methods may be another session's of this server (IPC).
    def create_event(self, device: int, timing: bool) -> object:
        """An event in device `device`'s context; `timing`: it may be timed."""
        return HostEvent()

    def record_event(self, event: object, stream: int) -> None:
        """Record `event` on session stream `stream` (the legacy stream: the event's
        device's): it completes once the stream's work queued before it has."""
        event.at = time.perf_counter()

    def wait_event(self, stream: int, event: object) -> None:
        """Work queued on `stream` from now on starts after `event`'s last record completed
        (the legacy stream: on every device of the session)."""
        return None

    def event_done(self, event: object) -> bool:
        """Has `event`'s last record completed (one never recorded has)?"""
        return True

    def synchronize_event(self, event: object) -> None:
        """Wait until `event`'s last record completed."""
        return None

    def elapsed_ms(self, start: object, end: object) -> float:
        """Milliseconds from `start`'s record to `end`'s, both completed; CudaError
        CUDA_ERROR_INVALID_HANDLE if one was never recorded."""
        if start.at is None or end.at is None:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "event has not been recorded")
        return (end.at - start.at) * 1000.0

    def event_age(self, event: object) -> float:
        """Seconds since `event`'s record completed (a checkpoint's; the session is
        drained). 0 for an event that is not timed or never recorded."""
        return 0.0 if event.at is None else time.perf_counter() - event.at

    def backdate_event(self, event: object, age: float) -> None:
        """A restore's: `event` was recorded and completed `age` seconds ago."""
        event.at = time.perf_counter() - age

    def destroy_event(self, event: object) -> None:
        return None

    def work_done(self) -> bool:
        """Has all the work the backend queued completed (a query's answer, which must not
        wait)? A backend whose launches run inline has none outstanding."""
        return True

    def graph_environment(self, graph: int):
        """What the kernels of one launch of a graph from the host share, given to their
        launchers: the graphs they launch into the tail stream, and the graph that
        cudaGetCurrentGraphExec names (`graph`, 0 for one not made for device launch). Only
        a backend that runs the device runtime itself has one; None elsewhere."""
        return None

    def run_graph_tails(self, environment, printf_fifo_bytes: int) -> tuple[str, str]:
        """Run the graphs a graph's kernels launched into the tail stream, after the
        graph's last node (`environment` from graph_environment); what a launcher returns."""
        return "", ""

    def set_device_runtime_limit(self, limit: int, value: int) -> None:
        """cuCtxSetLimit of the malloc heap or the pending launch count: for a backend whose
        device runs the device runtime itself (emu's session keeps them, and gives the
        memory with use_device_runtime)."""
        return None

    def recover(self) -> None:
        """The program reset its device after a fault (a sticky error): make the device
        usable again, where a fault left it unusable (a GPU's context)."""
        return None

    @abc.abstractmethod
    def set_memcheck(self, strict: bool) -> None:
        """Strict memory checking: an access outside its allocation faults even where the
        device has memory mapped (an emulator can tell; a GPU backend has nothing to do)."""

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop the running kernel soon (its launcher raises Cancelled) and every later one:
        the session is ending. Called from another thread than the one running kernels."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything this backend holds."""
