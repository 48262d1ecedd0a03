"""Process-wide state of the driver layer: the connection, the mirror of server objects, the
per-thread context stack, and the decorator every API function goes through.

The client mirrors what it created (handles, allocations, kernels' parameter layouts) so that
it can validate calls and answer queries locally, with CUDA's error codes and no round trip;
the server remains the authority and re-validates everything it is sent.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import os
import secrets
import sys
import threading
import types
from dataclasses import dataclass, field

from vgpu.api.cudadefs import CUresult
from vgpu.errors import CudaError, DeviceUnavailable

from .._libcuda import ffi

__all__ = ["ffi", "api", "state", "CudaError", "E", "handle_of", "ptr", "check_out", "Kind",
           "report_failure", "finish_recorded_call", "MemoryPool"]

E = CUresult  # short alias for error codes: E.CUDA_ERROR_INVALID_VALUE


class Kind:
    """Handle kinds; a handle carries its kind so a wrong-kind handle is caught (ZLUDA's cookie)."""

    (CONTEXT, MODULE, FUNCTION, STREAM, EVENT, LIBRARY, KERNEL, LINK, POOL, MEMORY, ARRAY,
     MIPMAP) = range(1, 13)


_HANDLE_MARK = 0x7667 << 48  # "vg": every vgpu handle has this in its top bits
_KIND_SHIFT = 40


def handle_kind(handle: int) -> int:
    return (handle >> _KIND_SHIFT) & 0xFF if handle >> 48 == 0x7667 else 0


@dataclass
class KernelLayout:
    name: str
    offsets: list[int]
    sizes: list[int]
    buffer_size: int
    attributes: dict[str, int]
    module: int
    max_dynamic_shared: int = 48 * 1024


@dataclass
class ModuleInfo:
    context: int
    kernels: dict[str, list]
    variables: dict[str, list]
    functions: dict[str, int] = field(default_factory=dict)  # kernel name -> function handle
    # A library's image (None for a module): a library outlives its context, so a reset
    # primary context loads it again (context._reset_primary).
    library_image: bytes | None = None
    # A library holding no code the device runs: why, its kernels' names. It exists
    # only here (the server never loaded it), and each kernel asked for is refused.
    no_binary: str = ""
    kernel_names: tuple[str, ...] = ()
    origin: str = ""  # the file its image came from, where known (libcurand.so.10, say)


@dataclass
class CudaArray:
    """A CUDA array: device memory holding its texels row after row (`pitch` bytes apart) and
    slice after slice (3D depth or layers, `slice_pitch` bytes apart)."""

    address: int
    format: int  # a CUarray_format
    channels: int
    width: int
    height: int  # 0 for 1D, as CUDA describes it
    depth: int  # 0 unless 3D or layered (then the layer count)
    flags: int  # CUDA_ARRAY3D_* flags
    texel_bytes: int

    @property
    def pitch(self) -> int:
        return self.width * self.texel_bytes

    @property
    def slice_pitch(self) -> int:
        return self.pitch * max(self.height, 1)

    @property
    def size(self) -> int:
        return self.slice_pitch * max(self.depth, 1)


@dataclass
class HostAllocation:
    size: int
    flags: int
    segment: int | None  # shared-memory segment id known to the server, if any
    mapping: object = None  # keeps the mmap alive
    device_pointer: int | None = None
    segment_offset: int = 0  # where the allocation starts in its segment (registered memory)
    shared_in_place: bool = False  # registered pages vgpu made shared (hostmem.share_in_place)


@dataclass
class MemoryPool:
    """A stream-ordered pool (the device's default one, or one of cuMemPoolCreate or
    cuMemPoolImportFromShareableHandle): its attributes and its usage counters."""

    handle: int
    attributes: dict[int, int] = field(default_factory=lambda: {1: 1, 2: 1, 3: 1, 4: 0})
    allocations: set[int] = field(default_factory=set)
    current: int = 0
    high: int = 0
    device: int = 0
    handle_types: int = 0  # CUmemAllocationHandleType bits it may be exported as
    # Names the pool in what it exports (its shareable handle, its pointers' export data), so
    # an importer can tell one pool's pointers from another's.
    pool_id: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    imported: bool = False  # a pool of another process, imported: it holds opened pointers
    access: dict[int, int] = field(default_factory=dict)  # other devices' CUmemAccess_flags


# Context limits (cuCtxGetLimit) a fresh process reports: stack size, printf FIFO, malloc
# heap, device-runtime sync depth and pending launches, max L2 fetch granularity, persisting L2.
DEFAULT_LIMITS = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 0, 6: 0}


class ThreadState(threading.local):
    """Per-thread state: the context stack, and while a call is being recorded into a CUDA
    graph (graph_recording.py) the recorder standing in for the connection, with what to do
    with its record once the call succeeded (`pending`)."""

    stack: list[int] | None = None
    recording = None
    pending = None


class DriverState:
    def __init__(self) -> None:
        self.connection = None
        self.initialized = False
        self.device = None  # the server's description of device 0
        self.devices: list[dict] = []  # of every device it offers, by ordinal
        self.peer_access: set[tuple[int, int]] = set()  # (context, peer) pairs enabled
        self._counter = itertools.count(1)
        self.contexts: dict[int, dict] = {}  # handle -> {"device", "flags", "primary"}
        self.primary: dict[int, list[int]] = {}  # device -> [handle, refcount]
        self.allocations: dict[int, int] = {}  # device address -> size
        self.allocation_context: dict[int, int] = {}  # device address -> context handle
        self.module_variables: set[int] = set()  # addresses above that belong to a module
        self.mappings: dict[int, int] = {}  # cuMemMap'd addresses above -> access flags
        self.memory_devices: dict[int, int] = {}  # cuMemCreate handle -> its location's device
        self.mapping_devices: dict[int, int] = {}  # mapping address -> its memory's device
        self.ipc_opened: dict[int, int] = {}  # addresses above of IPC handles -> times opened
        self._allocation_starts: list[int] = []
        self.host_allocations: dict[int, HostAllocation] = {}
        self.modules: dict[int, ModuleInfo] = {}
        self.functions: dict[int, KernelLayout] = {}
        self.streams: dict[int, dict] = {}
        self.events: dict[int, dict] = {}  # handle -> {"context", "flags"}
        self.thread = ThreadState()
        # Threads whose calls are being recorded into a graph: while none is, the hot paths
        # (every API call, every conn()) skip looking at the thread's state.
        self.recording_threads = 0
        self.lock = threading.RLock()  # for the few check-then-create steps threads could race
        self.lost_reported = False
        self.limits = dict(DEFAULT_LIMITS)
        self.pool: MemoryPool | None = None  # created by the first pool query or allocation
        self.pools: dict[int, MemoryPool] = {}  # live pools by handle, the default one too
        self.device_pools: dict[int, int] = {}  # cuDeviceSetMemPool's choice, by device
        self.pool_of: dict[int, MemoryPool] = {}  # a pool allocation's base -> its pool
        self.link_states: dict[int, list[bytes]] = {}  # cuLinkCreate handle -> PTX added
        self.link_outputs: dict[int, object] = {}  # images cuLinkComplete handed out
        self.arrays: dict[int, CudaArray] = {}  # CUarray handle -> its memory and shape
        self.mipmaps: dict[int, list[int]] = {}  # CUmipmappedArray -> its levels' CUarrays
        # texture and surface objects (their descriptors' addresses) -> the descriptions
        # the program created them from, for the Get*Desc calls
        self.texture_objects: dict[int, tuple] = {}
        self.surface_objects: dict[int, tuple] = {}
        self._segment_ids = itertools.count(1)  # ids of pinned host segments

    # ----------------------------------------------------------------- graph recording

    def recorder(self):
        """The calling thread's graph recorder, or None."""
        return self.thread.recording if self.recording_threads else None

    def start_recording(self, recorder, pending=None) -> None:
        """The calling thread's calls go to `recorder` (pending: what to do with the record
        when the API call succeeds) until stop_recording."""
        with self.lock:
            if self.thread.recording is None:
                self.recording_threads += 1
            self.thread.recording, self.thread.pending = recorder, pending

    def stop_recording(self, restore=None) -> None:
        """The calling thread's calls go to the connection again (or to `restore`)."""
        with self.lock:
            if self.thread.recording is None:
                return
            if restore is None:
                self.recording_threads -= 1
            self.thread.recording, self.thread.pending = restore, None

    def new_handle(self, kind: int) -> int:
        return _HANDLE_MARK | (kind << _KIND_SHIFT) | next(self._counter)

    def new_segment_id(self) -> int:
        return next(self._segment_ids)

    def default_pool(self) -> MemoryPool:
        if self.pool is None:
            self.pool = MemoryPool(self.new_handle(Kind.POOL))
            self.pools[self.pool.handle] = self.pool
        return self.pool

    # ----------------------------------------------------------------- context stack

    def stack(self) -> list[int]:
        stack = getattr(self.thread, "stack", None)
        if stack is None:
            stack = self.thread.stack = []
        return stack

    def current_context(self) -> int:
        """The calling thread's current context; CUDA_ERROR_INVALID_CONTEXT when none."""
        self.require_init()
        stack = self.stack()
        if not stack or stack[-1] not in self.contexts:
            raise CudaError(E.CUDA_ERROR_INVALID_CONTEXT, "no current context on this thread")
        return stack[-1]

    def require_init(self) -> None:
        if not self.initialized:
            raise CudaError(E.CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called")

    def device_description(self, ordinal: int) -> dict:
        """The server's description of device `ordinal`; CUDA_ERROR_INVALID_DEVICE if it
        offers no such device."""
        self.require_init()
        if not 0 <= ordinal < len(self.devices):
            raise CudaError(E.CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {ordinal}")
        return self.devices[ordinal]

    # ----------------------------------------------------------------- allocations

    def add_allocation(self, address: int, size: int, context: int,
                       module_variable: bool = False) -> None:
        """Record device memory: an allocation, or a module's variable (not freeable)."""
        self.allocations[address] = size
        self.allocation_context[address] = context
        if module_variable:
            self.module_variables.add(address)
        bisect.insort(self._allocation_starts, address)

    def remove_allocation(self, address: int) -> None:
        del self.allocations[address]
        del self.allocation_context[address]
        self.module_variables.discard(address)
        self._allocation_starts.pop(bisect.bisect_left(self._allocation_starts, address))

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self._allocation_starts, address) - 1
        if i >= 0:
            start = self._allocation_starts[i]
            if address < start + self.allocations[start]:
                return start, self.allocations[start]
        return None

    def find_host(self, address: int) -> tuple[int, HostAllocation] | None:
        for start, alloc in self.host_allocations.items():
            if start <= address < start + alloc.size:
                return start, alloc
        return None

    def check_device_range(self, address: int, size: int) -> None:
        """A device range used by a copy or memset must lie inside one live allocation."""
        found = self.find_allocation(address)
        if found is None:
            host = self.find_host(address)
            if host and host[1].device_pointer is not None and \
                    address + size <= host[0] + host[1].size:
                return
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x} is not a live device allocation")
        start, length = found
        if address + size > start + length:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x}+{size} runs past the allocation 0x{start:x}+{length}")

    def device_pieces(self, address: int, size: int) -> list[tuple[int, int]]:
        """(offset, size) pieces of a device range a copy or memset uses, each inside one
        allocation; CudaError for a range that is not. Only a range over mappings of the
        virtual memory API that lie side by side has several pieces: a GPU sees one run of
        addresses there, and CUDA copies across them."""
        found = self.find_allocation(address)
        if found is None or address + size <= found[0] + found[1] \
                or found[0] not in self.mappings:
            self.check_device_range(address, size)
            return [(0, size)]
        pieces = []
        cursor, end = address, address + size
        while cursor < end:
            found = self.find_allocation(cursor)
            if found is None or found[0] not in self.mappings:
                raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                                f"0x{address:x}+{size} runs past mapped memory at 0x{cursor:x}")
            stop = min(found[0] + found[1], end)
            pieces.append((cursor - address, stop - cursor))
            cursor = stop
        return pieces

    # ----------------------------------------------------------------- server

    def conn(self):
        self.require_init()
        if self.recording_threads:
            recorder = self.thread.recording
            if recorder is not None:  # the call is being recorded into a graph
                return recorder
        if self.connection is None:
            raise DeviceUnavailable("no vgpu server connection")
        return self.connection

    def after_fork_in_child(self) -> None:
        """A forked child must open its own session: the parent's socket is not ours to use."""
        self.__init__()


state = DriverState()


def _after_fork_in_child() -> None:
    # A function, not the bound method: the fork hook list lives as long as the interpreter,
    # and must not keep the state (and its connection) alive past the modules' teardown,
    # where the connection says goodbye.
    state.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Goodbye:
    """Closes a connection when the interpreter tears its modules down, which is after every
    atexit hook: hooks registered before CUDA started (numba's finalizers, libraries'
    cleanup) run after any hook vgpu could register, and must still find CUDA working.

    The interpreter's first teardown step replaces every sys.modules entry by None; the
    module holding this object goes then, and takes it along, while Python still runs.
    (The driver's own modules live on: cffi keeps their functions.) A forked child's copy
    belongs to its parent and is left alone."""

    def __init__(self, connection) -> None:
        self.connection = connection

    def __del__(self) -> None:
        if self.connection.owner_pid == os.getpid():
            self.connection.close()


def close_at_teardown(connection) -> None:
    module = types.ModuleType("vgpu.shim.driver._goodbye", _Goodbye.__doc__)
    module.goodbye = _Goodbye(connection)
    sys.modules[module.__name__] = module


def close_connection() -> None:
    """A C program's goodbye to the server, from the driver shim's library destructor
    (shim/c/driver_goodbye.c): after every exit hook of the program, CUDA calls included.
    A child that a C program forked (Python's fork hooks did not run) leaves its parent's
    connection alone: closing it there would end the parent's session, or hang."""
    connection = state.connection
    if connection is not None and connection.owner_pid == os.getpid():
        connection.close()


def api(fn):
    """Wrap a driver API implementation: CudaError -> its code; a lost server -> code 46."""

    @functools.wraps(fn)
    def wrapper(*args):
        try:
            fn(*args)
            if state.recording_threads:
                finish_recorded_call()
            return 0
        except CudaError as exc:
            return report_failure(exc, fn.__name__)
        finally:
            if state.recording_threads:
                state.stop_recording()

    return wrapper


def finish_recorded_call() -> None:
    """A call on a capturing stream succeeded: what it recorded joins the capture (which may
    raise CudaError)."""
    pending = state.thread.pending
    if pending is not None:
        state.stop_recording()
        pending()


def report_failure(exc: CudaError, where: str) -> int:
    """Tell the user what they need to know about a failed call; returns its code.

    A lost server is said once, on stderr; other failures only under VGPU_TRACE. Shared with
    the runtime layer, whose calls fail through the same connection.
    """
    if isinstance(exc, DeviceUnavailable):
        if not state.lost_reported:
            state.lost_reported = True
            print(f"vgpu: {exc.message}: CUDA calls fail with "
                  "CUDA_ERROR_DEVICE_UNAVAILABLE", file=sys.stderr, flush=True)
    elif os.environ.get("VGPU_TRACE") and exc.message:
        print(f"vgpu trace: {where}: {exc.message}", file=sys.stderr, flush=True)
    return exc.code


def ptr(value) -> int:
    """A cdata pointer or handle as an int address."""
    return int(ffi.cast("uintptr_t", value))


def handle_of(value, kind: int, table: dict, error=E.CUDA_ERROR_INVALID_HANDLE) -> int:
    """Decode a handle argument, checking it is live and of the expected kind."""
    handle = ptr(value)
    if handle_kind(handle) != kind or handle not in table:
        raise CudaError(error, f"invalid or destroyed handle 0x{handle:x}")
    return handle


def check_out(pointer) -> None:
    """An output pointer must not be NULL."""
    if pointer == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "output pointer is NULL")
