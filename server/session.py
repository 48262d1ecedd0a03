"""Session: one client process's device state on the server, and the handlers of its calls.

Each op is a driver-API call (the only kind that crosses the wire: the runtime API is
implemented in the client) named as the client's shim exports it.
Handlers raise CudaError for CUDA failures; `Session.execute` turns that into the reply code
of a synchronizing call or into the deferred error of a queued one, with its message. Kernel
faults are sticky, as on a GPU: once one happens, every call but a context reset reports it.
What a launch prints goes to the application with the next reply: device printf text for
its stdout (`output`), then for its stderr (`diagnostics`) CUDA's lines for failed asserts,
the memory checker's reports and a description of any other kernel fault.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu.api.cudadefs import CUresult
from vgpu.errors import CudaError
from vgpu.fatbin import MAX_ENTRY_BYTES
from vgpu.protocol import MEMCHECK_MODES, STICKY_ERRORS
from vgpu.replay.journal import Journal

from .arena import VaArena
from .backends import Backend, LoadedModule
from .backends.base import Cancelled, KernelFault
from .client_files import PlacedFile, SegmentRefused, map_client_file, mapped_bytes
from .device_runtime import DeviceRuntimeMemory
from .graphs import GRAPH_OPS, GraphExecs
from .handles import HandleTable
from .ipc import IPC_OPS, IpcRegistry
from .peer_memory import PeerMemoryError, read_peer, write_peer
from .peers import Peer
from .quotas import MemoryAccount, MemoryQuotas
from .shared_allocations import SHARED_BYTES, SharedAllocations
from .streams import Point, StreamLanes
from .vmm import VMM_OPS, VirtualMemory
from .vmm_sharing import VMM_SHARING_OPS

__all__ = ["Session", "Capture", "OPS"]

log = logging.getLogger("vgpu.server")

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_ASSERT = 710
CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
CUDA_ERROR_UNKNOWN = 999
CU_LIMIT_PRINTF_FIFO_SIZE = 1
# A fresh context's printf FIFO: 1 MiB, as CUDA's (cuCtxGetLimit answers the same).
DEFAULT_PRINTF_FIFO_BYTES = 1 << 20
CU_EVENT_DISABLE_TIMING = 0x2
# Streams every context has without creating them: 0 (NULL), CU_STREAM_LEGACY, PER_THREAD.
BUILTIN_STREAMS = frozenset({0, 1, 2})
# Device attributes the server checks a cooperative grid against
_SM_COUNT, _THREADS_PER_SM, _BLOCKS_PER_SM = 16, 39, 106
# How long taking a session's state waits for the client to finish a device-window copy.
WINDOW_RELEASE_S = 5.0
# The most bytes a client's hello may ask the server to read back from its memory (vgpu's
# client sends 16).
PROBE_BYTES = 64
# Allocations one session may hold (each costs the server bookkeeping beyond its bytes).
MAX_ALLOCATIONS = 1 << 20
# The largest module image the server loads: the largest PTX of real programs (whole
# libraries) is tens of MiB, and parsing holds several times its size.
MAX_MODULE_BYTES = MAX_ENTRY_BYTES
# Pinned host buffers one session may have mapped: each is a mapping in the server, which
# holds some 65,000 of them for all its sessions together (vm.max_map_count).
MAX_SEGMENTS = 4096
HOST_ADDRESS_LIMIT = 1 << 57  # above any process's addresses (five-level page tables)
# Where managed memory starts: on a page boundary (of the largest page size of Linux's
# x86-64 and arm64 base pages), since the client maps its host view at the same address.
MANAGED_ALIGNMENT = 1 << 16
# Launch configurations a function keeps checked and prepared; the oldest goes first.
LAUNCHERS_PER_FUNCTION = 16
CU_STREAM_NON_BLOCKING = 0x1
# What calls that run on the session's thread wait for while streams' lanes have work
# (see streams.py): copies and memsets, the work of the stream they were issued on ("scope",
# the legacy stream's waits unless vgpuStreamScope names another); calls that free what
# kernels may use, or reset the context, all of it (CUDA synchronizes the device for them).
LANE_WAITS = {
    **dict.fromkeys(("cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD", "vgpuMemset",
                     "vgpuDeviceWindow"), "scope"),
    # (vgpuDigest: memory as every call before it left it, for `vgpu replay --check`)
    **dict.fromkeys(("cuMemFree", "cuModuleUnload", "cuCtxDestroy", "cuDevicePrimaryCtxReset",
                     "cuMemUnmap", "cuMemRelease", "cuMemAddressFree",
                     "vgpuUnmapHostSegment", "cuIpcCloseMemHandle", "vgpuDigest"), "all"),
}
# How long taking a session's state waits for its streams' queued work.
LANES_DRAIN_S = 5.0
# How often a wait for another session's event (IPC) looks whether it completed.
SHARED_EVENT_POLL_S = 0.002

OPS: dict[str, Callable] = {}
# Who a session built without a connection (in tests) belongs to: nobody the server verified,
# so it shares no memory with anybody.
NO_PEER = Peer("inproc", name="local")


def op(name: str):
    """Register a Session method as the handler of wire op `name`."""

    def register(fn):
        OPS[name] = fn
        return fn

    return register


@dataclass
class Capture:
    """A session's state at one point of its calls: `Session.describe`'s plain values, and
    every allocation's (address, contents), copied aside."""

    state: dict
    regions: list[tuple[int, bytearray | mmap.mmap]]


@dataclass
class Context:
    device: int
    flags: int
    allocations: set[int] = field(default_factory=set)
    modules: set[int] = field(default_factory=set)
    streams: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)


@dataclass
class Module:
    context: int
    loaded: LoadedModule
    code_bytes: int  # its image, charged to the session's memory
    places: list[int]  # arena addresses its variables took (some may be nameless places)
    functions: set[int] = field(default_factory=set)


@dataclass
class Function:
    module: int
    name: str
    param_size: int
    uses_printf: bool
    uses_device_runtime: bool = False  # its heap or device-side launches (emu)
    # Launch configuration (grid, block, shared bytes) -> the backend's checked launcher.
    launchers: dict[tuple, Callable[[bytes], str]] = field(default_factory=dict)


@dataclass
class EventRecord:
    """An event's last record: the backend's event it goes to (the backend of the session
    that made the event) and, on a backend whose streams are the session's lanes, the point
    of `lanes` where it is made (None: it was, or it is not a lane's). Sessions that opened
    the event through IPC share it with the exporter."""
    backend_event: object
    lanes: StreamLanes | None = None
    point: Point | None = None
    recorded: bool = False
    shared: bool = False  # exported (server/ipc.py): the session cannot move
    # Whether its session destroyed it (the backend's event is gone: a wait for it is
    # over), guarded for the sessions that opened it, whose threads use it too.
    gone: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reached(self) -> bool:
        """Has the session's thread or lane made the record (with lanes, at its turn)?"""
        return self.point is None or self.lanes.reached((self.point,))


@dataclass
class Event:
    context: int
    flags: int
    record: EventRecord
    imported: bool = False  # opened through IPC: the record is its exporter's


class Session:
    def __init__(self, session_id: int, hello: dict, backend: Backend, arena: VaArena,
                 memcheck: str = "report", peer: Peer = NO_PEER,
                 memory: MemoryAccount | None = None, device_count: int = 1):
        self.id = session_id
        # The devices the session's contexts may be on. On emu they are views of one
        # emulator sharing the session's memory (one address space, as unified addressing
        # gives a process), so peer access and peer copies need nothing more; on cuda each
        # is a GPU. Either way each device's allocations take a part of the arena of their
        # own, so that no device granule holds another device's memory.
        self.device_count = device_count
        arena.split(device_count)
        self.peer = peer
        # What the session's device memory is charged to (see quotas.py); alone, it may
        # take the whole device.
        self.memory = memory or MemoryQuotas(backend.describe().total_memory).account(peer)
        self.token = _token(hello.get("token"))
        self.argv = [str(a) for a in hello.get("argv", [])]
        self.backend = backend
        # What the session's calls created and have not destroyed: what a restore remakes.
        self.journal = Journal()
        # CALLS messages received from the client (the server counts them): a checkpoint
        # covers the first `position` of them, and a client resumes from there.
        self.position = 0
        # What the server is doing with the session: its state for `vgpu ps` ("running",
        # "suspending", "suspended", "migrating"), the operation under way, the last
        # checkpoint ({"path", "at", "bytes", "written", "position"}) and, while suspended,
        # where its image is.
        self.status = "running"
        self.operation: str | None = None
        self.last_checkpoint: dict | None = None
        self.suspended_image: str | None = None
        # Device windows granted to the client and not yet released (see device_window).
        self._windows_open = 0
        self._windows_granted = 0  # ever: a grant since a mark makes changes unknown
        self._windows_changed = threading.Condition()
        self.arena = arena
        backend.attach_arena(arena.base, arena.size, arena.region_starts())
        self.device = backend.describe()
        self.started_at = time.time()
        self.calls_served = 0
        self.cancelled = False  # the session ended: its batch stops before its next call
        self.deferred_error = CUDA_SUCCESS
        self.deferred_message = ""
        self.sticky_error = CUDA_SUCCESS
        self.last_error_message = ""
        self.output: list[str] = []       # device printf text, for the application's stdout
        self._output_bytes = 0            # its size (bounded: see _print)
        self._output_dropped = False      # whether some was dropped (said once)
        self.diagnostics: list[str] = []  # fault reports and assert lines, for its stderr
        # The application's VGPU_MEMCHECK (sent at hello) wins over the server's --memcheck.
        wanted = hello.get("memcheck")
        self.memcheck = wanted if wanted in MEMCHECK_MODES else memcheck
        backend.set_memcheck(self.memcheck == "strict")
        self.printf_fifo_bytes = DEFAULT_PRINTF_FIFO_BYTES
        self.printf_launched = False  # a kernel that calls printf ran since the last reset
        self.device_runtime = DeviceRuntimeMemory()  # heap and launch buffers, when used
        self.payloads: list = []       # the payload frames of the batch being executed
        self.header: bytes | None = None  # its message's encoded header, if all of it
        self.reply_frames: list = []   # the frames its reply will carry
        self.contexts: HandleTable[Context] = HandleTable("context", CUDA_ERROR_INVALID_CONTEXT)
        self.modules: HandleTable[Module] = HandleTable("module")
        self.functions: HandleTable[Function] = HandleTable("function")
        self.streams: HandleTable[int] = HandleTable("stream")
        self.events: HandleTable[Event] = HandleTable("event")
        self.allocation_owner: dict[int, int] = {}  # address -> context handle
        self.vmm = VirtualMemory(self)
        self.graphs = GraphExecs(self)
        self.staging: mmap.mmap | None = None
        # id -> (its map, device address): see map_host_segment
        self.segments: dict[int, tuple[mmap.mmap | PlacedFile, int | None]] = {}
        self.shared: SharedAllocations | None = None
        self.peer_memory = False
        # What runs the calls of `execute`: a recorder (server/recorder.py) puts its own
        # loop here, so that sessions not recorded pay nothing for recording.
        self.run_calls: Callable[[list], tuple[int, object]] = self._run_calls
        self.recorder = None
        # Sends the client a notice (server/server.py sets it; any thread): host functions
        # whose turn came. Without one, nobody can run them and their gates open at once.
        self.notify: Callable[[dict], None] | None = None
        self._errors = threading.Lock()  # lanes' threads defer errors too
        self.lanes = StreamLanes(backend.launches_run_inline, self._run_on_lane,
                                 self._host_function_reached)
        self.scope_stream = 0  # the stream copies and memsets were issued on (vgpuStreamScope)
        # The environment of the graph launch running now (Backend.graph_environment): the
        # kernels it launches get it
        self.graph_environment = None
        self.ipc: IpcRegistry | None = None  # the server's exports (server/ipc.py), if any
        # address -> [handle, times opened, where its mapping starts] (server/ipc.py)
        self.ipc_opened: dict[int, list] = {}
        self.attach_client(hello, peer)

    # ----------------------------------------------------------------- plumbing

    def attach_client(self, hello: dict, peer: Peer) -> None:
        """Take the client's staging segment and learn whether we can reach its memory: at
        the session's hello, and again when it reconnects to a session restored here. Only
        a client on this host whose pid the kernel vouches for gets either (the hello's pid
        and paths are its word; `peer` is what the server verified)."""
        self.peer = peer
        self.pid = hello.get("pid", 0)
        if type(self.pid) is not int or not 0 <= self.pid < 1 << 32:  # it goes into replies
            raise ValueError(f"{self.pid!r:.40} is not a process id")
        self.host = str(hello.get("host", ""))
        if self.staging is not None:
            self.staging.close()
            self.staging = None
        self._attach_staging(hello.get("shm"))
        self.peer_memory = self._probe_peer_memory(hello.get("probe"))
        # Large allocations the client copies to and from itself (see shared_allocations);
        # those a restore made before the client came back stay private.
        if self.shared is None and self.peer_memory and self.backend.memory_is_host_ram:
            self.shared = SharedAllocations()

    def _attach_staging(self, shm: dict | None) -> None:
        if not shm:
            return
        try:
            self.staging = map_client_file(shm.get("fd"), shm.get("size"), self.peer, self.pid)
        except (OSError, AttributeError) as exc:  # refused (SegmentRefused), or no memory
            # The client falls back to payload frames, as when it cannot make a memory file.
            log.warning("session %d: no shared staging memory for %s: %s", self.id,
                        self.peer.name, exc)

    def _probe_peer_memory(self, probe) -> bool:
        """Can we read the client's memory directly? It sent an address and what is there;
        the process read is the one the kernel says is connected, never one a client names."""
        if not probe or self.staging is None or self.peer.pid != self.pid:
            return False
        try:
            address, expected = int(probe[0]), probe[1]
            # The bytes the client sent, never a size it names: bytes(n) would allocate n.
            if not isinstance(expected, bytes) or not 0 < len(expected) <= PROBE_BYTES:
                return False
            seen = memoryview(bytearray(len(expected)))
            read_peer(self.pid, address, seen)
            return bytes(seen) == expected
        except (PeerMemoryError, TypeError, ValueError, IndexError):
            return False

    def execute(self, calls: list, frames: list, header: bytes | None = None
                ) -> tuple[int, object, list]:
        """Run calls in order; returns (code of the last call, its result, reply frames).

        `frames` are the message's payload frames, which calls name by index; calls that
        send data back append their frames to `reply_frames`. `header`: the message's
        encoded header, when `calls` are all of its calls (a recorder keeps it)."""
        self.header = header
        self.payloads = frames
        self.reply_frames = []
        self.calls_served += len(calls)
        with self.backend.running():
            code, result = self.run_calls(calls)
        frames_out, self.payloads, self.reply_frames = self.reply_frames, [], []
        return code, result, frames_out if code == CUDA_SUCCESS else []

    def _run_calls(self, calls: list) -> tuple[int, object]:
        """Run calls in order: the code and result of the last; a failure of an earlier one
        is deferred to the next reply, as a failure of queued work."""
        code, result = CUDA_SUCCESS, None
        last = len(calls) - 1
        for i, call in enumerate(calls):
            if self.cancelled:
                raise Cancelled
            code, result = self._run_one(call)
            if code and i != last:
                self.defer(code, self.last_error_message)
        return code, result

    def _run_one(self, call) -> tuple[int, object]:
        try:
            name, args = call
            handler = OPS[name]
        except (TypeError, ValueError, KeyError):
            self.last_error_message = f"malformed or unknown call {str(call)[:80]}"
            return CUDA_ERROR_INVALID_VALUE, None
        if self.sticky_error and name not in STICKY_EXEMPT:
            return self.sticky_error, None
        waits = LANE_WAITS.get(name)
        if waits is not None and self.lanes.concurrent:
            self._wait_lanes(self._scope_points() if waits == "scope"
                             else self.lanes.all_points())
        try:
            return CUDA_SUCCESS, handler(self, *args)
        except CudaError as exc:
            self.last_error_message = exc.message
            if exc.code in STICKY_ERRORS:
                self.sticky_error = exc.code
            return exc.code, None
        except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
            # A malformed argument list from a buggy or hostile client: refuse the call.
            self.last_error_message = f"{name}: bad arguments ({exc})"
            return CUDA_ERROR_INVALID_VALUE, None
        except Exception as exc:
            # A failure that is not CUDA's (the host out of memory, a server bug) still fails
            # the call: queued work's failure must surface at the next synchronizing call.
            log.error("session %d: %s failed:\n%s", self.id, name, traceback.format_exc())
            self.last_error_message = f"{name}: {type(exc).__name__}: {exc}"
            if isinstance(exc, MemoryError):
                return CUDA_ERROR_OUT_OF_MEMORY, None
            return CUDA_ERROR_UNKNOWN, None

    def cancel(self) -> None:
        """The session ended (from another thread than the one running its calls): stop
        its running kernel, and the batch being run before its next call (Cancelled), however
        many calls a client packed into it."""
        self.cancelled = True
        self.lanes.cancel()
        self.backend.cancel()

    def defer(self, code: int, message: str = "") -> None:
        """Keep a failure of queued work, and what it said, for the next reply (the first
        one counts)."""
        with self._errors:
            if code != CUDA_SUCCESS and self.deferred_error == CUDA_SUCCESS:
                self.deferred_error = code
                self.deferred_message = message

    def take_reports(self) -> tuple[list | int, str, str]:
        """What a reply carries besides its call's result, taken: `deferred`, 0 or [code,
        message] of the first failure of queued work (the sticky error once there is one);
        device printf output for the application's stdout; diagnostics for its stderr."""
        self._output_bytes = 0
        if not (self.deferred_error or self.sticky_error or self.output or self.diagnostics):
            return 0, "", ""  # (most replies: one look instead of taking three things)
        with self._errors:
            code, self.deferred_error = self.deferred_error, CUDA_SUCCESS
            message, self.deferred_message = self.deferred_message, ""
        if self.sticky_error and code != self.sticky_error:
            code, message = self.sticky_error, "the context has a sticky error"
        return ([code, message] if code else 0), _take_text(self.output), \
            _take_text(self.diagnostics)

    def _print(self, text: str) -> None:
        """Keep a launch's printf output for the client. Launches queued without a
        synchronization between them share one printf FIFO's worth (the client takes what
        is kept at its next synchronizing call, where CUDA flushes its FIFO); a launch's
        output beyond it is dropped, as output that does not fit CUDA's FIFO is."""
        if self._output_bytes + len(text) > self.printf_fifo_bytes:
            if text and not self._output_dropped:
                self.diagnostics.append(
                    "vgpu: device printf output was dropped: queued launches printed more "
                    f"than the printf FIFO holds ({self.printf_fifo_bytes} bytes; "
                    "cudaLimitPrintfFifoSize) before a synchronization\n")
                self._output_dropped = True
            return
        self._output_bytes += len(text)
        self.output.append(text)

    def memory_in_use(self) -> int:
        return self.arena.bytes_in_use

    def close(self) -> None:
        """Release everything the session holds (client exit, crash or disconnect)."""
        self.lanes.cancel()
        self.lanes.join(1.0)
        if self.ipc is not None:
            self.ipc.withdraw(self)
        if self.recorder is not None:
            self.recorder.finish()
        for handle, _ in self.contexts.items():
            self._destroy_context_resources(handle)
        self.vmm.close()  # before the backend: the last holder of shared memory frees it
        self.memory.release_all()
        self.backend.close()
        if self.shared is not None:
            self.shared.close()
        for seg, _ in self.segments.values():
            seg.close()
        self.segments.clear()
        if self.staging is not None:
            self.staging.close()
            self.staging = None

    # ----------------------------------------------------------------- state that moves

    def settle_streams(self) -> None:
        """Wait a while for the streams' queued work (a state is taken between calls, where
        work may still run on the streams' lanes); refuse if it does not finish."""
        if not self.lanes.wait(self.lanes.all_points(), LANES_DRAIN_S):
            raise CudaError(CUDA_ERROR_NOT_READY,
                            f"the session's streams still run queued work after "
                            f"{LANES_DRAIN_S:g} s (a kernel or host function waiting for "
                            "what the program has not done yet); try again")
        self.backend.synchronize()  # a GPU's queued work: events are then complete

    def check_movable(self) -> None:
        """Refuse what a checkpoint cannot carry yet: host memory the client shares, device
        memory shared with other sessions (IPC)."""
        if self.ipc_opened or (self.ipc is not None and self.ipc.exports_of(self)) or \
                self.vmm.shares() or any(e.record.shared for _, e in self.events.items()):
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                            "the session shares device memory or events with other "
                            "processes (IPC: cuIpcGetMemHandle, cuIpcOpenMemHandle, "
                            "cuIpcGetEventHandle, cuIpcOpenEventHandle, "
                            "cuMemExportToShareableHandle, cuMemImportFromShareableHandle), "
                            "which cannot be checkpointed or moved")
        if self.segments:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                            "the session has pinned host memory mapped (cuMemHostAlloc or "
                            "cuMemHostRegister), which cannot be checkpointed or moved yet")
        if self.graphs.tails_pending():
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                            "a graph launch is between its segments (a host node runs) with "
                            "graphs its kernels tail-launched still to run, which cannot be "
                            "checkpointed or moved; try again once it has ended")

    def capture(self, position: int, buffers: dict | None = None) -> Capture:
        """The session's state after its first `position` messages, with every region's
        contents copied aside (see `regions`; into `buffers[address]` where one of the right
        size is given): call it between batches, on the thread that runs them; the session may run
        on as soon as it returns."""
        self.check_movable()
        self.settle_streams()
        buffers = buffers or {}
        copies = []
        for address, size in self.regions():
            copy = buffers.get(address)
            if copy is None or len(copy) != size:
                copy = bytearray(size)
            self.read_region(address, 0, memoryview(copy))
            copies.append((address, copy))
        return Capture(self.describe(position), copies)

    def regions(self) -> list[tuple[int, int]]:
        """What holds the session's memory contents, as (address, size): its allocations,
        then its physical allocations of the virtual memory API (named by their handles)."""
        return self.arena.allocations() + self.vmm.regions()

    def region_size(self, address: int) -> int | None:
        """The size of region `address`, None if there is none (any longer)."""
        physical = self.vmm.physical.get(address)
        if physical is not None:
            return physical.size
        found = self.arena.find(address)
        return found[1] if found is not None and found[0] == address else None

    def read_region(self, address: int, offset: int, out: memoryview) -> None:
        """Contents of region `address` from `offset`, into `out`."""
        if address in self.vmm.physical:
            self.vmm.read_region(address, offset, out)
        else:
            self.backend.read_into(address + offset, out)

    def describe(self, position: int) -> dict:
        """Everything but memory contents, as plain values: the journal and the session's
        own state (errors waiting to be reported, limits, recorded events)."""
        return {
            "token": self.token,
            "position": position,
            "client": {"pid": self.pid, "host": self.host, "argv": self.argv},
            "backend": self.backend.name,
            "arena": [self.arena.base, self.arena.size],
            "journal": self.journal.entries(),
            "sticky_error": self.sticky_error,
            "deferred": [self.deferred_error, self.deferred_message],
            "last_error_message": self.last_error_message,
            "output": list(self.output),
            "diagnostics": list(self.diagnostics),
            "memcheck": self.memcheck,
            "printf_fifo_bytes": self.printf_fifo_bytes,
            "printf_launched": self.printf_launched,
            "device_runtime": self.device_runtime.describe(),
            # Seconds since each recorded event completed (the session is drained): elapsed
            # times stay right on another host or backend.
            "events_recorded": [[h, self.backend.event_age(e.record.backend_event)]
                                for h, e in self.events.items() if e.record.recorded],
        }

    def restore(self, state: dict, regions: list[tuple[int, int]],
                fill: Callable[[int, memoryview], None],
                backings: dict[int, bytearray] | None = None) -> None:
        """Remake what `state` describes on this (fresh) session: every object its journal
        lists, at the same handles and addresses, then every region's contents
        (`fill(i, view)` writes region i into `view`), except regions whose contents are in
        `backings` (by address, or handle: see `regions`), which become their memory where
        the backend allows.
        Raises CudaError if the state does not fit: this session is then unusable, and the
        caller closes it."""
        backings = backings if backings is not None and self.backend.memory_is_host_ram else {}
        backed = set()

        def backing_of(address: int, size: int) -> bytearray | None:
            backing = backings.get(address)
            if backing is not None and len(backing) == size:
                backed.add(address)
                return backing
            return None

        def allocate(address: int, size: int, context: int) -> None:
            self._allocate(context, size, address, backing_of(address, size))

        def physical(handle: int, size: int, prop: list, references: int) -> None:
            self.vmm.restore_memory(handle, size, prop, references, backing_of(handle, size))

        makers = {
            "context": self._remake_context,
            "alloc": allocate,
            "module": lambda handle, context, image, places:
                self._load_module(handle, context, bytes(image), list(places)),
            "function": self.module_get_function,
            "stream": self.stream_create,
            "event": self.event_create,
            "reserve": self.vmm.restore_reservation,
            "memory": physical,
            "mapping": self.vmm.restore_mapping,
            "graph": self.graphs.restore,
        }
        for kind, *fields in state["journal"]:
            makers[kind](*fields)
        for i, (address, size) in enumerate(regions):
            if address in backed:
                continue
            if address in self.vmm.physical:
                staged = memoryview(bytearray(size))
                fill(i, staged)
                self.vmm.write_region(address, 0, staged)
                continue
            self._check_range(address, size)
            view = self.backend.host_view(address, size)
            if view is None:
                staged = memoryview(bytearray(size))
                fill(i, staged)
                self.backend.write(address, staged)
            else:
                fill(i, view)
        for handle, age in state["events_recorded"]:
            record = self.events.get(handle).record
            self.backend.backdate_event(record.backend_event, float(age))
            record.recorded = True
        self.sticky_error = int(state["sticky_error"])
        self.deferred_error, self.deferred_message = state["deferred"]
        self.last_error_message = state["last_error_message"]
        self.output.extend(state["output"])
        self.diagnostics.extend(state["diagnostics"])
        self.memcheck = state["memcheck"]
        self.backend.set_memcheck(self.memcheck == "strict")
        self.printf_fifo_bytes = int(state["printf_fifo_bytes"])
        self.printf_launched = bool(state["printf_launched"])
        if "device_runtime" in state:  # images from before the device runtime lack it
            self.device_runtime.restore(state["device_runtime"])

    def _remake_context(self, handle: int, device: int, flags: int, primary: bool) -> None:
        if primary:
            self.primary_ctx_retain(handle, device)
        else:
            self.ctx_create(handle, flags, device)

    def renew_backend(self) -> None:
        """A fresh backend of the same kind (a suspended session coming back)."""
        self.backend.close()
        self.backend = self.backend.reopen()
        self.lanes.concurrent = self.backend.launches_run_inline
        self.backend.attach_arena(self.arena.base, self.arena.size, self.arena.region_starts())
        self.backend.set_memcheck(self.memcheck == "strict")

    def mark(self) -> tuple[int, int]:
        """A point in the session's history, for `changed_since`."""
        return self.backend.mark(), self._windows_granted

    def changed_since(self, mark: tuple[int, int]) -> list[tuple[int, int]] | None:
        """Ranges of device memory that may have changed since `mark`, or None when that
        is unknown: the backend cannot tell, or the client was given a device window (its
        copies through one change memory outside any call), or there is physical memory of
        the virtual memory API (written through addresses, its regions are named by
        handles)."""
        backend_mark, granted = mark
        if self._windows_granted != granted or self.vmm.physical:
            return None
        return self.backend.changed_since(backend_mark)

    def window_released(self) -> None:
        """The client finished a copy through a device window (server I/O thread)."""
        with self._windows_changed:
            self._windows_open = max(0, self._windows_open - 1)
            self._windows_changed.notify_all()

    def wait_windows_released(self, timeout: float = WINDOW_RELEASE_S) -> None:
        """Wait until the client copies through no device window: its copies change
        memory outside any call, so state cannot be taken while one is under way."""
        with self._windows_changed:
            if not self._windows_changed.wait_for(lambda: self._windows_open == 0, timeout):
                raise CudaError(CUDA_ERROR_NOT_READY,
                                f"the client has been copying through a device window for "
                                f"{timeout:g} s; try again")

    def release_device(self) -> None:
        """Free every object and all device memory (a suspended session), keeping the
        client's attachment; `restore` on a new backend brings them back."""
        for handle, _ in self.contexts.items():
            self._destroy_context_resources(handle)
            self.contexts.pop(handle)
        self.vmm.forget()
        self.journal = Journal()
        self.backend.close()

    # ----------------------------------------------------------------- data specs

    def _source(self, spec, size: int) -> memoryview:
        kind = spec[0]
        if kind == "shm":
            return self._window(self.staging, int(spec[1]), size)
        if kind == "seg":
            return self._window(self._segment(spec[1])[0], int(spec[2]), size)
        if kind == "frame":
            data = memoryview(self.payloads[int(spec[1])])
            if len(data) != size:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "payload size does not match the copy")
            return data
        if kind == "inline":
            data = memoryview(spec[1])
            if len(data) != size:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "payload size does not match the copy")
            return data
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown data location {kind!r}")

    @staticmethod
    def _window(buffer, offset: int, size: int) -> memoryview:
        if buffer is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "no shared-memory segment is attached")
        if offset < 0 or size < 0 or offset + size > len(buffer):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "copy exceeds the shared-memory segment")
        return mapped_bytes(buffer)[offset:offset + size]

    def _segment(self, seg_id: int):
        try:
            return self.segments[int(seg_id)]
        except KeyError:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown host segment {seg_id}") from None

    def _check_range(self, address: int, size: int) -> None:
        """A copy or memset must stay inside one live allocation (or mapping, or mapped host
        segment)."""
        found = self.arena.find(address) or self.vmm.find(address)
        if found is None:
            for _, dev_addr in self.segments.values():
                if dev_addr is not None:
                    mapped = self._segment_range(dev_addr)
                    if mapped and mapped[0] <= address and address + size <= sum(mapped):
                        return
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x} is not inside a live device allocation")
        start, length = found
        if size < 0 or address + size > start + length:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"range 0x{address:x}+{size} runs past its allocation "
                            f"0x{start:x}+{length}")

    def _segment_range(self, dev_addr: int) -> tuple[int, int] | None:
        for seg, addr in self.segments.values():
            if addr == dev_addr:
                return addr, len(seg)
        return None

    # ----------------------------------------------------------------- contexts

    @op("cuCtxCreate")
    def ctx_create(self, handle: int, flags: int, device: int):
        self._check_device(device)
        self.contexts.add(handle, Context(device, flags))
        self.journal.created("context", handle, device, flags, False)

    @op("cuDevicePrimaryCtxRetain")
    def primary_ctx_retain(self, handle: int, device: int):
        self._check_device(device)
        if handle not in self.contexts:
            self.contexts.add(handle, Context(device, 0))
            self.journal.created("context", handle, device, 0, True)

    @op("cuCtxDestroy")
    def ctx_destroy(self, handle: int):
        self.contexts.get(handle)
        self._destroy_context_resources(handle)
        self.contexts.pop(handle)
        self.journal.destroyed("context", handle)

    @op("cuDevicePrimaryCtxReset")
    def primary_ctx_reset(self, handle: int):
        if handle in self.contexts:
            self._destroy_context_resources(handle)
        if self.sticky_error:
            self.backend.recover()
        # The failures of work queued before are the old context's: the reset ends them.
        self.sticky_error = self.deferred_error = CUDA_SUCCESS
        self.deferred_message = ""
        self.printf_fifo_bytes = DEFAULT_PRINTF_FIFO_BYTES
        self.printf_launched = False
        self.device_runtime = DeviceRuntimeMemory()  # the limits are the defaults again

    @op("cuCtxSetLimit")
    def ctx_set_limit(self, limit: int, value: int):
        """The limits a launch obeys here; the client answers cuCtxGetLimit itself."""
        if self.device_runtime.set_limit(limit, value):
            self.backend.set_device_runtime_limit(limit, value)
            return
        if limit == CU_LIMIT_PRINTF_FIFO_SIZE:
            if value < 0:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "negative printf FIFO size")
            if value > self.memory.info()[1]:  # the FIFO is device memory
                raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                                f"a printf FIFO of {value} bytes is more than the session's "
                                f"device memory ({self.memory.info()[1]} bytes)")
            if self.printf_launched:  # CUDA's rule: the FIFO is allocated by then
                raise CudaError(CUDA_ERROR_INVALID_VALUE,
                                "the printf FIFO size cannot change after a kernel that "
                                "calls printf has been launched")
            self.printf_fifo_bytes = int(value)

    def _destroy_context_resources(self, handle: int) -> None:
        ctx = self.contexts.get(handle)
        self.graphs.context_destroyed(handle)
        for m in list(ctx.modules):
            self.module_unload(m)
        self.device_runtime.forget_context(handle)  # its allocations go with the others
        for address in list(ctx.allocations):
            self._free(address)
        for s in list(ctx.streams):
            self.streams.pop(s)
            self.backend.stream_destroyed(s)
            self.lanes.destroyed(s)
            self.journal.destroyed("stream", s)
        for e in list(ctx.events):
            self._retire_event(self.events.pop(e))
            self.journal.destroyed("event", e)
        ctx.streams.clear()
        ctx.events.clear()

    def _check_device(self, device: int) -> None:
        if type(device) is not int or not 0 <= device < self.device_count:
            raise CudaError(101, f"invalid device ordinal {device!r:.20}")

    @op("vgpuSynchronize")
    def synchronize(self, kind: str = "context", handle: int = 0):
        """cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize: what they wait for
        (`kind` "context", "stream" or "event", and its handle)."""
        if kind == "event":
            self._synchronize_event(self.events.get(handle))
            return
        self._wait_lanes(self._points_of(kind, handle))
        self.backend.synchronize()

    def _synchronize_event(self, event: Event) -> None:
        """Wait until the event's record is made and the device completed it. Another
        session's (IPC) is polled, so that the wait ends with either session."""
        record = event.record
        self._wait_record(record.lanes, record.point)
        if not event.imported:
            self.backend.synchronize_event(record.backend_event)
            return
        while not self._event_done(record):
            if self.cancelled:
                raise Cancelled
            time.sleep(SHARED_EVENT_POLL_S)

    def _event_done(self, record: EventRecord) -> bool:
        with record.lock:
            return record.gone or record.reached() and self.backend.event_done(record.backend_event)

    @op("vgpuDiscardReported")
    def discard_reported(self):
        """The client replayed, after a failover, messages whose answers it had already
        had: the errors and device output they produced again were reported once."""
        self.deferred_error, self.deferred_message = CUDA_SUCCESS, ""
        self.output.clear()
        self.diagnostics.clear()

    @op("vgpuQuery")
    def query(self, kind: str = "context", handle: int = 0):
        """cuStreamQuery and cuEventQuery. While a worker still runs this session's work the
        server answers CUDA_ERROR_NOT_READY without coming here; here, all is done once the
        streams' lanes have finished the work asked about and the device what the backend
        queued (a GPU's launches return at once)."""
        if kind == "event":
            if not self._event_done(self.events.get(handle).record):
                raise CudaError(CUDA_ERROR_NOT_READY, "work is still running")
            return
        if not (self.lanes.reached(self._points_of(kind, handle)) and
                self.backend.work_done()):
            raise CudaError(CUDA_ERROR_NOT_READY, "work is still running")
        self.backend.synchronize()  # done: its errors, if any, are reported now

    def _points_of(self, kind: str, handle: int) -> tuple[Point, ...]:
        """What synchronizing with a context or a stream waits for."""
        if kind == "stream":
            self._check_stream(handle)
            return (self.lanes.tail(handle),) if self.lanes.is_lane(handle) \
                else self.lanes.blocking_points()
        if kind != "context":
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"cannot synchronize with a {kind!r}")
        return self.lanes.all_points()

    def _scope_points(self) -> tuple[Point, ...]:
        """What a copy or memset waits for: the work queued before it on its stream."""
        stream = self.scope_stream
        return (self.lanes.tail(stream),) if self.lanes.is_lane(stream) \
            else self.lanes.blocking_points()

    def _wait_lanes(self, points) -> None:
        if points and not self.lanes.wait(points):
            raise Cancelled  # the session ended while the work was waited for

    def _wait_record(self, lanes: StreamLanes | None, point: Point | None) -> None:
        """Wait for an event's record (`point` of `lanes`: this session's, or another's
        for an event opened through IPC, whose wait ends with either session)."""
        if point is None:
            return
        if lanes is self.lanes:
            self._wait_lanes((point,))
            return
        while not lanes.wait((point,), 0.1):
            if self.cancelled:
                raise Cancelled
            if lanes.cancelled:
                return

    def _run_on_lane(self, work: Callable[[], None]) -> None:
        """Run stream work on its lane's thread: its failure is queued work's, reported at
        the next synchronizing call; after a sticky error, work is dropped (as a GPU's
        context that faulted runs nothing more)."""
        if self.sticky_error or self.cancelled:
            return
        try:
            with self.backend.running():
                work()
        except Cancelled:
            return
        except CudaError as exc:
            if exc.code in STICKY_ERRORS:
                self.sticky_error = exc.code
            self.defer(exc.code, exc.message)
        except Exception as exc:  # as _run_one: a failure that is not CUDA's still fails
            log.error("session %d: stream work failed:\n%s", self.id, traceback.format_exc())
            self.defer(CUDA_ERROR_OUT_OF_MEMORY if isinstance(exc, MemoryError)
                       else CUDA_ERROR_UNKNOWN, f"{type(exc).__name__}: {exc}")

    def _host_function_reached(self, gate: int) -> None:
        """A host function's turn came: the client runs it, then opens its gate (a message
        handled on arrival: vgpu.protocol HOSTFN). Without a client to run it, the gate
        opens at once."""
        if self.notify is None:
            self.lanes.open_gate(gate)
        else:
            self.notify({"host_functions": [gate]})

    @op("vgpuHostFunc")
    def host_func(self, stream: int, gate: int):
        """cuLaunchHostFunc and cuStreamAddCallback: gate number `gate` (the client's)
        holds `stream` while the client runs the function, once the work before it is
        done."""
        self._check_stream(stream)
        if type(gate) is not int or not 0 < gate < 1 << 63:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"bad host function gate {gate!r}")
        if not self.lanes.is_lane(stream):  # a GPU's queued work must be done first
            self.backend.synchronize()
        self.lanes.host_function(stream, gate)

    def host_function_done(self, gate) -> None:
        """The client ran the host function of `gate` (server I/O thread)."""
        if type(gate) is int:
            self.lanes.open_gate(gate)

    @op("vgpuStreamScope")
    def stream_scope(self, stream: int):
        """The copies and memsets that follow were issued on `stream` (until the next)."""
        self._check_stream(stream)
        self.scope_stream = stream

    # ----------------------------------------------------------------- memory

    @op("cuMemAlloc")
    def mem_alloc(self, context: int, size: int):
        return self._allocate(context, size)

    @op("cuMemAllocManaged")
    def mem_alloc_managed(self, context: int, size: int):
        """Device memory the client also maps at its address, as the host's view of managed
        memory (shim/driver/managed.py): it starts a page of its own. To the server it is an
        allocation like any other, journaled so."""
        return self._allocate(context, size, alignment=MANAGED_ALIGNMENT)

    def _allocate(self, context: int, size: int, at: int | None = None,
                  backing: bytearray | None = None, alignment: int | None = None) -> int:
        """A new allocation (at address `at`: a restore puts it back where it was, in the
        `backing` buffer that holds its contents where there is one)."""
        ctx = self.contexts.get(context)
        if size <= 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "allocation size must be positive")
        address = self._reserve(size, at, alignment, ctx.device)
        shared = (self.shared.create(address, size)
                  if self.shared is not None and size >= SHARED_BYTES and backing is None
                  else None)
        try:
            self.backend.map(address, size, shared if backing is None else memoryview(backing),
                             ctx.device)
        except BaseException:
            # What could not be placed holds no device memory.
            if shared is not None:
                self.shared.release(address)
            self._unreserve(address)
            raise
        self.allocation_owner[address] = context
        ctx.allocations.add(address)
        self.journal.created("alloc", address, size, context)
        return address

    @op("cuMemFree")
    def mem_free(self, address: int):
        if address not in self.allocation_owner or self.device_runtime.owns(address):
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x} is not the start of a live allocation")
        self._free(address)

    def _free(self, address: int) -> None:
        self.backend.unmap(address)
        if self.ipc is not None:
            self.ipc.withdraw(self, "memory", address)
        if self.shared is not None:
            self.shared.release(address)
        self._unreserve(address)
        ctx = self.allocation_owner.pop(address)
        self.journal.destroyed("alloc", address)
        if ctx in self.contexts:
            self.contexts.get(ctx).allocations.discard(address)

    def _reserve(self, size: int, at: int | None = None, alignment: int | None = None,
                 device: int = 0) -> int:
        """Charge `size` bytes to the session's quota and place them in its arena (at `at`:
        a restore puts memory back where it was; else aligned to `alignment`, in the part
        of the arena that is device `device`'s)."""
        if self.arena.count >= MAX_ALLOCATIONS:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"the session holds {self.arena.count} allocations, the most a "
                            f"session may")
        self.memory.charge(size)
        address = self.arena.alloc(size, at, alignment, region=device)
        if address is None:
            self.memory.release(size)
            if at is not None:
                raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                                f"0x{at:x}+{size} is not free in the session's address range")
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of device memory ({size} bytes)")
        return address

    def _unreserve(self, address: int) -> None:
        self.memory.release(self.arena.free(address))

    @op("cuMemGetInfo")
    def mem_get_info(self):
        """The session's own view: a device the size of its limit (see quotas.py)."""
        return list(self.memory.info())

    @op("vgpuMapHostSegment")
    def map_host_segment(self, seg_id: int, fd_number: int, size: int, device_address):
        """Attach a pinned host buffer the client allocated in a memory file it holds open as
        descriptor `fd_number` (its own, sealed against shrinking: see client_files), shown
        to the device at `device_address` (None: for copies only). Replies None when kernels
        reach it there, else why they do not (copies still do)."""
        if len(self.segments) >= MAX_SEGMENTS:  # each is a mapping of the server's own
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"the session has {len(self.segments)} host buffers mapped, the "
                            f"most a session may")
        if device_address is not None:
            if type(device_address) is not int or type(size) is not int or \
                    not 0 < device_address < device_address + size <= HOST_ADDRESS_LIMIT:
                raise CudaError(CUDA_ERROR_INVALID_VALUE,
                                "a host segment's address and size are not a range of a "
                                "process's addresses")
            if self.arena.base < device_address + size and \
                    device_address < self.arena.base + self.arena.size:
                raise CudaError(CUDA_ERROR_INVALID_VALUE,
                                f"host memory at 0x{device_address:x}+{size} lies in the "
                                "session's device address range")
            for other, start in self.segments.values():
                if start is not None and start < device_address + size and \
                        device_address < start + len(other):
                    raise CudaError(CUDA_ERROR_INVALID_VALUE,
                                    f"host memory at 0x{device_address:x}+{size} overlaps a "
                                    "host buffer the session has mapped already")
        at = device_address if self.backend.host_buffers_at_client_addresses else None
        try:
            seg = map_client_file(fd_number, size, self.peer, self.pid, at=at)
        except SegmentRefused as exc:
            raise CudaError(CUDA_ERROR_NOT_PERMITTED,
                            f"the server does not map that host memory: {exc}") from None
        except OSError as exc:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"cannot map host segment: {exc}") from None
        unreached = None
        if device_address is not None:
            try:
                unreached = self.backend.map_host(
                    device_address, size, mapped_bytes(seg),
                    seg.fd if isinstance(seg, PlacedFile) else None)
            except BaseException:
                seg.close()
                raise
        self.segments[int(seg_id)] = (seg, device_address)
        return unreached

    @op("vgpuUnmapHostSegment")
    def unmap_host_segment(self, seg_id: int):
        seg, device_address = self.segments.pop(int(seg_id), (None, None))
        if seg is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown host segment {seg_id}")
        if device_address is not None:
            self.backend.unmap(device_address)
        seg.close()

    @op("cuMemcpyHtoD")
    def memcpy_htod(self, dst: int, src_spec, size: int):
        self._check_range(dst, size)
        if src_spec[0] == "peer":  # straight from the client's pageable memory
            source = int(src_spec[1])
            view = self.backend.host_view(dst, size)
            if view is not None:
                self._peer(read_peer, source, view)
            else:
                self.backend.write_from(dst, size, lambda piece, offset: self._peer(
                    read_peer, source + offset, piece))
            return
        self.backend.write(dst, self._source(src_spec, size))

    def _peer(self, transfer, address: int, buffer: memoryview) -> None:
        if not self.peer_memory:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "direct client memory access is off")
        try:
            transfer(self.pid, address, buffer)
        except PeerMemoryError as exc:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"host memory: {exc}") from None

    @op("cuMemcpyDtoH")
    def memcpy_dtoh(self, src: int, size: int, dst_spec):
        self._check_range(src, size)
        if dst_spec[0] == "peer":
            target = int(dst_spec[1])
            view = self.backend.host_view(src, size, writing=False)
            if view is not None:
                self._peer(write_peer, target, view)
            else:
                self.backend.read_to(src, size, lambda piece, offset: self._peer(
                    write_peer, target + offset, piece))
            return None
        if dst_spec[0] == "frame":
            out = bytearray(size)
            self.backend.read_into(src, memoryview(out))
            self.reply_frames.append(out)
            return None
        self.backend.read_into(src, self._source(dst_spec, size))

    @op("vgpuDigest")
    def digest(self, address: int, size: int):
        """sha256 of device memory [address, +size), inside one of the session's allocations
        as a copy must be: `vgpu replay --check` compares memory this way, at points where
        the program copied nothing back, to find the launch that wrote a difference."""
        self._check_range(address, size)
        out = bytearray(size)
        self.backend.read_into(address, memoryview(out))
        return hashlib.sha256(out).digest()

    @op("vgpuDeviceWindow")
    def device_window(self, address: int, size: int):
        """Where the client may copy [address, +size) itself, once the work queued before
        has run: [server pid, fd, serial, inode, base, length] of the allocation's file, or
        None (not shared: the client copies through the server)."""
        self._check_range(address, size)
        found = self.arena.find(address)
        window = self.shared.window(found[0]) if self.shared and found else None
        if window is None:
            return None
        with self._windows_changed:
            self._windows_open += 1  # until the client says it is done (window_released)
            self._windows_granted += 1
        return [*window, *found]

    @op("cuMemcpyDtoD")
    def memcpy_dtod(self, dst: int, src: int, size: int):
        self._check_range(dst, size)
        self._check_range(src, size)
        self.backend.copy(dst, src, size)

    @op("vgpuMemset")
    def memset(self, dst: int, pattern: bytes, count: int):
        """cuMemsetD8/D16/D32 (and async): `pattern` is 1, 2 or 4 bytes, repeated `count` times."""
        if len(pattern) not in (1, 2, 4):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "memset element must be 1, 2 or 4 bytes")
        self._check_range(dst, len(pattern) * count)
        self.backend.fill(dst, bytes(pattern), count)

    # ----------------------------------------------------------------- modules and launches

    @op("cuModuleLoadData")
    def module_load(self, handle: int, context: int, image_spec, image_size: int):
        image = bytes(self._source(image_spec, image_size))
        loaded = self._load_module(handle, context, image)
        return {
            "kernels": {name: [k.param_offsets, k.param_sizes, k.param_buffer_size, k.attributes]
                        for name, k in loaded.kernels.items()},
            "variables": {name: list(v) for name, v in loaded.variables.items()},
            "managed": sorted(loaded.managed),
        }

    def _load_module(self, handle: int, context: int, image: bytes,
                     places: list[int] | None = None) -> LoadedModule:
        """Load `image`; its variables go to the arena's next free places, or to `places`
        (a restore puts them back where they were)."""
        ctx = self.contexts.get(context)
        self.modules.check_new(handle)
        if len(image) > MAX_MODULE_BYTES:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                            f"a module image of {len(image)} bytes is more than the server "
                            f"loads ({MAX_MODULE_BYTES})")
        allocated: list[int] = []
        wanted = iter(places) if places is not None else None

        def allocate(size: int, managed: bool = False) -> int:
            # Module variables are device memory like any allocation: the quota pays.
            address = self._reserve(size, next(wanted, None) if wanted else None,
                                    MANAGED_ALIGNMENT if managed else None, ctx.device)
            allocated.append(address)
            return address

        # The module's code is device memory on a GPU, and here the server keeps its image
        # (and what parsing it made) as long as it is loaded: the quota pays for it too.
        self.memory.charge(len(image))
        try:
            loaded = self.backend.load_module(image, allocate, ctx.device)
        except BaseException:
            for address in allocated:
                self._unreserve(address)
            self.memory.release(len(image))
            raise
        self.modules.add(handle, Module(context, loaded, len(image), allocated))
        ctx.modules.add(handle)
        self.journal.created("module", handle, context, image, allocated)
        return loaded

    @op("cuModuleUnload")
    def module_unload(self, handle: int):
        module = self.modules.pop(handle)
        self.journal.destroyed("module", handle)
        for f in module.functions:
            self.functions.pop(f)
            self.journal.destroyed("function", f)
        self.backend.unload_module(module.loaded)
        for address in module.places:
            self._unreserve(address)
        self.memory.release(module.code_bytes)
        if module.context in self.contexts:
            self.contexts.get(module.context).modules.discard(handle)

    @op("cuModuleGetFunction")
    def module_get_function(self, handle: int, module_handle: int, name: str):
        module = self.modules.get(module_handle)
        kernel = module.loaded.kernels.get(name)
        if kernel is None:
            raise CudaError(CUDA_ERROR_NOT_FOUND, f"no kernel named {name!r} in the module")
        self.functions.add(handle, Function(module_handle, name, kernel.param_buffer_size,
                                            kernel.uses_printf,
                                            kernel.uses_heap or kernel.launches_kernels))
        module.functions.add(handle)
        self.journal.created("function", handle, module_handle, name)

    @op("cuLaunchCooperativeKernel")
    def launch_cooperative_kernel(self, function: int, gx: int, gy: int, gz: int, bx: int,
                                  by: int, bz: int, shared_bytes: int, stream: int,
                                  params: bytes):
        """A launch whose blocks are all resident at once (grid-wide synchronization). The
        client checks the grid against the kernel's occupancy; here, against the device's
        capacity, which the emulator keeps resident as one chunk."""
        self.check_cooperative_grid((gx, gy, gz), (bx, by, bz))
        self._launch(function, (gx, gy, gz, bx, by, bz, shared_bytes, True), stream, params)

    def check_cooperative_grid(self, grid: tuple, block: tuple) -> None:
        """A cooperative grid must fit the device's capacity (all its blocks resident)."""
        attributes = self.device.attributes
        blocks, threads = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
        most = attributes[_SM_COUNT] * attributes[_BLOCKS_PER_SM]
        if blocks > most or blocks * threads > attributes[_SM_COUNT] * attributes[_THREADS_PER_SM]:
            raise CudaError(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                            f"a cooperative grid of {blocks} blocks of {threads} threads is "
                            "more than the device keeps resident")

    @op("cuLaunchKernel")
    def launch_kernel(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int,
                      bz: int, shared_bytes: int, stream: int, params: bytes):
        self._launch(function, (gx, gy, gz, bx, by, bz, shared_bytes, False), stream, params)

    def _launch(self, function: int, config: tuple, stream: int, params: bytes) -> None:
        """config: grid, block, dynamic shared bytes, whether cooperative."""
        fn = self.functions.get(function)
        if stream not in BUILTIN_STREAMS:
            self.streams.get(stream)
        if len(params) != fn.param_size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"kernel {fn.name!r} takes {fn.param_size} bytes of parameters, "
                            f"got {len(params)}")
        launcher = fn.launchers.get(config)
        if launcher is None:
            launcher = self._prepare_launch(fn, config)
        # The device runtime's memory is placed for the launch now, in call order; the
        # backend is told where just before the kernel runs, on the thread running it.
        place = (self._device_runtime_place(fn, config[7])
                 if fn.uses_device_runtime or config[7] else None)
        self.printf_launched |= fn.uses_printf
        fifo_bytes = self.printf_fifo_bytes
        environment = self.graph_environment

        def run() -> None:
            if place is not None:
                self.backend.use_device_runtime(place, self.graphs.device_launches)
            if environment is None:
                self._run_kernels(launcher, params, fifo_bytes, stream)
            else:
                self._run_kernels(launcher, params, fifo_bytes, stream, environment)

        self._on_stream(stream, run)

    def run_graph_tails(self, environment, stream: int) -> None:
        """The graphs a graph's kernels launched into the tail stream, run on `stream` after
        the graph (server/graphs.py calls this after its last node)."""
        fifo_bytes = self.printf_fifo_bytes
        self._on_stream(stream, lambda: self._run_kernels(self.backend.run_graph_tails,
                                                          environment, fifo_bytes))

    def _run_kernels(self, run: Callable[..., tuple[str, str]], *args) -> None:
        """Run kernels (`run(*args)`, a launcher) and pass on what they said: their printf
        output for the client, the memory checker's report for its stderr, or their fault."""
        try:
            printed, report = run(*args)
        except KernelFault as fault:
            self._report_fault(fault)
            raise
        if printed:
            self._print(printed)
        if report:
            self.diagnostics.append(report)

    def _on_stream(self, stream: int, work: Callable[[], None]) -> Point | None:
        """Run `work` in `stream`'s order: queued on its lane (returning where it ends), or
        here once the blocking lanes have finished what they hold (the legacy stream)."""
        if self.lanes.is_lane(stream):
            return self.lanes.submit(stream, work)
        if self.lanes.concurrent:
            self._wait_lanes(self.lanes.blocking_points())
        work()
        return None

    def _report_fault(self, fault: KernelFault) -> None:
        """A kernel failed: its printf output first, then CUDA's lines for failed asserts or
        our report of the fault, all for the application; and a line in the server log."""
        self._print(fault.output)
        self.diagnostics.append(fault.diagnostics)
        if fault.code != CUDA_ERROR_ASSERT:  # CUDA itself says nothing more than its lines
            try:
                name = CUresult(fault.code).name
            except ValueError:
                name = f"CUDA error {fault.code}"
            self.diagnostics.append(f"vgpu: {name}: {fault.message}\n")
        log.info("session %d: kernel failed with %d: %s", self.id, fault.code, fault.message)

    def _device_runtime_place(self, fn: Function, cooperative: bool):
        """Where the launch finds the device runtime's memory (made when first needed)."""
        module = self.modules.get(fn.module)
        kernel = module.loaded.kernels[fn.name]
        return self.device_runtime.launching(module.context, self._allocate, kernel.uses_heap,
                                             kernel.launches_kernels, cooperative)

    def _prepare_launch(self, fn: Function, config: tuple
                        ) -> Callable[[bytes, int], tuple[str, str]]:
        grid, block, shared_bytes, cooperative = config[:3], config[3:6], config[6], config[7]
        module = self.modules.get(fn.module)
        _check_launch_config(module.loaded.kernels[fn.name].attributes, grid, block,
                             shared_bytes)
        launcher = self.backend.prepare_launch(module.loaded, fn.name, grid, block,
                                               shared_bytes, cooperative)
        if len(fn.launchers) >= LAUNCHERS_PER_FUNCTION:  # a program that varies its shapes
            fn.launchers.pop(next(iter(fn.launchers)))
        fn.launchers[config] = launcher
        return launcher

    # ----------------------------------------------------------------- streams and events

    def _check_stream(self, stream: int) -> None:
        if stream not in BUILTIN_STREAMS:
            self.streams.get(stream)

    @op("cuStreamCreate")
    def stream_create(self, handle: int, context: int, flags: int, priority: int):
        ctx = self.contexts.get(context)
        ctx.streams.add(handle)
        self.streams.add(handle, context)
        self.backend.stream_created(handle, ctx.device)
        self.lanes.created(handle, bool(flags & CU_STREAM_NON_BLOCKING))
        self.journal.created("stream", handle, context, flags, priority)

    @op("cuStreamDestroy")
    def stream_destroy(self, handle: int):
        context = self.streams.pop(handle)
        self.backend.stream_destroyed(handle)
        self.lanes.destroyed(handle)
        self.journal.destroyed("stream", handle)
        if context in self.contexts:
            self.contexts.get(context).streams.discard(handle)

    @op("cuStreamWaitEvent")
    def stream_wait_event(self, stream: int, event: int):
        """Later work on `stream` waits for the event's last record to complete (one never
        recorded, or recorded on the legacy stream, is complete)."""
        self._check_stream(stream)
        record = self.events.get(event).record
        lanes, point = record.lanes, record.point
        if point is not None:
            if not self.lanes.is_lane(stream):
                self._wait_record(lanes, point)
            elif lanes is self.lanes:
                self.lanes.submit(stream, None, after=(point,))
            else:
                self.lanes.submit(stream, lambda: self._wait_record(lanes, point))
        with record.lock:  # on the device, for a backend whose streams are its own
            if not record.gone:
                self.backend.wait_event(stream, record.backend_event)

    @op("cuEventCreate")
    def event_create(self, handle: int, context: int, flags: int,
                     record: EventRecord | None = None):
        ctx = self.contexts.get(context)
        imported = record is not None
        if record is None:
            record = EventRecord(self.backend.create_event(
                ctx.device, not flags & CU_EVENT_DISABLE_TIMING))
        self.events.add(handle, Event(context, flags, record, imported))
        ctx.events.add(handle)
        self.journal.created("event", handle, context, flags)

    @op("cuEventRecord")
    def event_record(self, handle: int, stream: int):
        self._check_stream(stream)
        record = self.events.get(handle).record

        def recorded() -> None:
            with record.lock:  # (the exporter's, if opened through IPC, may be gone)
                if not record.gone:
                    self.backend.record_event(record.backend_event, stream)

        record.lanes = self.lanes
        record.recorded = True
        record.point = self._on_stream(stream, recorded)

    @op("cuEventDestroy")
    def event_destroy(self, handle: int):
        event = self.events.pop(handle)
        self.journal.destroyed("event", handle)
        if event.record.shared and self.ipc is not None:
            self.ipc.withdraw(self, "event", handle)
        if event.context in self.contexts:
            self.contexts.get(event.context).events.discard(handle)
        self._retire_event(event)

    def _retire_event(self, event: Event) -> None:
        """An event of the session's is gone: the backend's goes too if it is the session's
        own (one opened through IPC stays its exporter's)."""
        record = event.record
        if event.imported:
            return
        with record.lock:
            record.gone = True
            self.backend.destroy_event(record.backend_event)

    @op("cuEventElapsedTime")
    def event_elapsed_time(self, start: int, end: int):
        a, b = self.events.get(start), self.events.get(end)
        if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "event created with DISABLE_TIMING")
        if not (a.record.recorded and b.record.recorded):
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "event has not been recorded")
        if not (self._event_done(a.record) and self._event_done(b.record)):
            raise CudaError(CUDA_ERROR_NOT_READY, "an event has not completed yet")
        return self.backend.elapsed_ms(a.record.backend_event, b.record.backend_event)


# Calls that still work after a sticky error: the ones that tear state down.
STICKY_EXEMPT = frozenset({"cuCtxDestroy", "cuDevicePrimaryCtxReset", "cuMemFree",
                           "cuModuleUnload", "cuStreamDestroy", "cuEventDestroy",
                           "vgpuUnmapHostSegment", "vgpuDiscardReported", "cuMemUnmap",
                           "cuMemRelease", "cuMemAddressFree", "vgpuGraphDestroy",
                           "cuIpcCloseMemHandle"})


def _on_vmm(method: Callable) -> Callable:
    """A handler of the virtual memory API's op: the method of the session's `vmm`."""
    return lambda session, *args: method(session.vmm, *args)


OPS.update({name: _on_vmm(method) for name, method in VMM_OPS.items()})
OPS.update(IPC_OPS)
OPS.update(VMM_SHARING_OPS)


def _on_graphs(method: Callable) -> Callable:
    """A handler of an executable graph's op: the method of the session's `graphs`."""
    return lambda session, *args: method(session.graphs, *args)


OPS.update({name: _on_graphs(method) for name, method in GRAPH_OPS.items()})


def _take_text(pieces: list[str]) -> str:
    """What `pieces` holds, as one text; it is emptied."""
    text = "".join(pieces)
    pieces.clear()
    return text


def _check_launch_config(kernel_attrs: dict, grid, block, shared_bytes: int) -> None:
    gx, gy, gz = (int(v) for v in grid)
    bx, by, bz = (int(v) for v in block)
    if min(gx, gy, gz, bx, by, bz) <= 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "grid and block dimensions must be positive")
    threads = bx * by * bz
    limit = min(kernel_attrs.get("max_threads_per_block", 1024), 1024)
    if threads > limit or bx > 1024 or by > 1024 or bz > 64:
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        f"block of {threads} threads exceeds the kernel's limit of {limit}")
    if gy > 65535 or gz > 65535 or gx > 2**31 - 1:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "grid dimension too large")
    static_shared = kernel_attrs.get("shared_size_bytes", 0)
    if shared_bytes < 0 or shared_bytes + static_shared > 163 * 1024:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "too much shared memory requested")


def _token(value) -> str:
    """The client's session token: 32 hex digits (it names the session's checkpoint file, so
    nothing else is accepted); a client that sends none gets one."""
    if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef"
                                                           for c in value):
        return value
    return secrets.token_hex(16)
