"""CudaBackend: a session's device work on GPUs, through CUDA's driver API (cuda-python).

The backend drives every GPU the driver offers (the server offers them all, or the first N).
Each session gets a context of its own on each device it uses, made at its first use (device
0's at once: the session's copies and reservations go through it). Its addresses are those
its arena hands out, on every backend alike, so that a restored or migrated session finds its
memory where it was: the backend reserves the arena's range with cuMemAddressReserve at its
base and backs allocations with cuMemCreate + cuMemMap + cuMemSetAccess at the arena's
addresses, on the device of the allocating context, accessible to it and to every device the
driver says can reach it (cuDeviceCanAccessPeer): with the virtual memory API, access is
granted per allocation, so a kernel on a peer reaches the memory as CUDA's peer access lets
it, and a peer copy is a device-to-device copy in the one address space.

The arena places allocations 512-byte aligned; the device maps memory in granules (2 MiB).
Allocations are backed granule by granule: a granule lives while an allocation lies in it,
so several small allocations share one, and a live granule is never mapped again. The
granules one allocation brings to life are one physical allocation, mapped at once, and
freed when none of its granules is used any longer (until then a freed granule stays mapped,
ready for the next allocation placed in it).

Module variables live where the driver puts them, which the kernels' code uses; each also
takes an arena address, its place, in the order and size emu's loader gives (so a session
moving between backends finds each at its place), and what the program and the session see
is the place: copies to it reach the variable, and a checkpoint holds its contents. A kernel
given a place as a pointer (cudaGetSymbolAddress passed to a kernel) does not reach the
variable on this backend.

A client's page-locked host memory is a file the session maps at the client's own address
in this process where it can, and registers with the driver for every context (map_host),
so that kernels reach it through the client's pointer, as unified addressing promises.
Memory another session exports through IPC is mapped again from its physical allocation
(import_memory).

Copies go through a pinned staging buffer of the session's (cuMemHostAlloc, portable to
all its contexts). Launches pass the client's parameter buffer as it is
(CU_LAUNCH_PARAM_BUFFER_POINTER), on a device stream of the session stream's own, so that
launches on different streams run concurrently; copies and memsets run on the default stream
of the context of the device that holds the memory, which waits for the work before them
there (the streams are non-blocking, ordered with it through events: see stream_created).
The session's events are CUDA events recorded on those streams: a record waits for nothing.
Work on the other devices is waited for first where it may touch the same memory: a
copy waits for every other device's launches and copies not yet waited for (a kernel may
write a peer's memory), a launch for other devices' copies (one the program made on this
device may have run in the memory's device's context).
Device printf is written by the driver to the process's stdout when the context
synchronizes: a kernel that may print (or assert) is waited for with stdout captured, so the
text goes back to its client as on emu.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vgpu.errors import CudaError
from vgpu.module_image import LINKED_PTX_MAGIC

from .base import (
    Backend,
    Cancelled,
    DeviceDescription,
    FileDescriptor,
    KernelDescription,
    KernelFault,
    LoadedModule,
    SharedMemory,
)
from .cuda_images import cubin_variables, declared_variables, is_binary, printing_kernels
from .device_attributes import MANAGED_CONTRACT
from .images import decode_image

__all__ = ["CudaBackend", "cuda_usable"]

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_ASSERT = 710
_NOT_READY = 600
_STREAM_NON_BLOCKING = 0x1
_EVENT_BLOCKING_SYNC = 0x1
_EVENT_DISABLE_TIMING = 0x2
_HOST_REGISTER_PORTABLE = 0x01
_HOST_REGISTER_DEVICEMAP = 0x02

DEFAULT_SHARED_BYTES = 48 * 1024  # beyond it, a kernel must opt in to dynamic shared memory
# CUfunction_attribute -> the names KernelDescription.attributes uses (those emu gives).
_FUNCTION_ATTRIBUTES = {
    "max_threads_per_block": 0, "shared_size_bytes": 1, "const_size_bytes": 2,
    "local_size_bytes": 3, "num_regs": 4, "ptx_version": 5, "binary_version": 6,
}
# Faults after which a CUDA context is lost: what a launch that caused them raises.
_KERNEL_FAULTS = frozenset({700, 701, 702, 710, 714, 715, 716, 717, 718, 719, 720})


# ----------------------------------------------------------------- the driver

_driver_lock = threading.Lock()
_driver = None  # cuda.bindings.driver, once cuInit has succeeded
_device_count = 0  # the GPUs it offers
_descriptions: dict[int, DeviceDescription] = {}  # ordinal -> as its attributes say


def _load_driver():
    """cuda.bindings.driver with cuInit done and a device present, or RuntimeError in one
    line saying why not (no driver library, no device, cuInit's error)."""
    global _driver, _device_count
    with _driver_lock:
        if _driver is not None:
            return _driver
        try:
            ctypes.CDLL("libcuda.so.1")  # fast, and clear, where no driver is installed
        except OSError as exc:
            raise RuntimeError(f"the cuda backend needs NVIDIA's driver (libcuda.so.1), "
                               f"which cannot be loaded here: {exc}") from None
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise RuntimeError(f"the cuda backend needs cuda-python (cuda-bindings): {exc}"
                               ) from None
        try:
            _call(driver, driver.cuInit(0))
            count = _call(driver, driver.cuDeviceGetCount())
        except CudaError as exc:
            raise RuntimeError(f"the CUDA driver does not start (cuInit): {exc.message}"
                               ) from None
        except Exception as exc:  # the library cuda-python finds is not usable
            raise RuntimeError(f"the CUDA driver cannot be used: {exc}") from None
        if count < 1:
            raise RuntimeError("the CUDA driver sees no GPU")
        _driver, _device_count = driver, int(count)
        return driver


def _description(d, ordinal: int) -> DeviceDescription:
    """Device `ordinal` described (once per process: its attributes do not change)."""
    with _driver_lock:
        if ordinal not in _descriptions:
            _descriptions[ordinal] = _describe(d, _call(d, d.cuDeviceGet(ordinal)))
        return _descriptions[ordinal]


def _POSIX_FD(d):
    return d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def cuda_usable() -> bool:
    """Whether a CUDA driver and a GPU are here (what `auto` asks)."""
    try:
        _load_driver()
    except RuntimeError:
        return False
    return True


def _call(driver, result):
    """A cuda-python call's result: its values (one, a tuple, or None) once its CUresult is
    CUDA_SUCCESS; CudaError with CUDA's code and name otherwise."""
    error, *values = result if isinstance(result, tuple) else (result,)
    code = int(error)
    if code != CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(error)
        _, text = driver.cuGetErrorString(error)
        raise CudaError(code, f"{(name or b'').decode()}: {(text or b'').decode()}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _host_address(buffer: memoryview) -> int:
    """Where a buffer's bytes are (read-only ones too), for the driver to copy straight from
    or into: it stages pageable memory itself, faster than copying through a pinned buffer
    of our own one piece at a time (a tenth of the driver's bandwidth, measured on an H200),
    and memory registered with it (a client's page-locked buffers, see map_host) goes by
    DMA."""
    return np.frombuffer(buffer, np.uint8).ctypes.data


def _let_go(driver, result) -> bool:
    """The result of a call that gives something back: an error is raised, except the one
    of a context lost to a fault (all its memory goes with it); whether it was that."""
    try:
        _call(driver, result)
    except CudaError as exc:
        if exc.code not in _KERNEL_FAULTS:
            raise
        return True
    return False


def _describe(d, device) -> DeviceDescription:
    """The device as its own attributes say (every CUdevice_attribute the driver answers)."""
    from vgpu.api.cudadefs import CUdevice_attribute

    attributes = {}
    for attribute in CUdevice_attribute:
        try:
            which = d.CUdevice_attribute(int(attribute))
            attributes[int(attribute)] = int(_call(d, d.cuDeviceGetAttribute(which, device)))
        except (ValueError, CudaError):  # unknown to this driver or these bindings
            attributes[int(attribute)] = 0
    for key, value in MANAGED_CONTRACT.items():
        attributes[int(CUdevice_attribute["CU_DEVICE_ATTRIBUTE_" + key])] = value
    major = attributes[int(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)]
    minor = attributes[int(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)]
    name = _call(d, d.cuDeviceGetName(256, device))
    return DeviceDescription(
        name=name.split(b"\0", 1)[0].decode(errors="replace"),
        uuid=bytes(_call(d, d.cuDeviceGetUuid(device)).bytes),
        total_memory=int(_call(d, d.cuDeviceTotalMem(device))),
        compute_capability=(major, minor),
        attributes=attributes,
    )


# ----------------------------------------------------------------- device printf


class _StdoutCapture:
    """What the driver writes to the process's stdout (device printf) and stderr (failed
    asserts) while a kernel is waited for, taken for its client. One capture at a time in
    the process; a line the server itself logs meanwhile would be taken too."""

    lock = threading.Lock()
    _libc = ctypes.CDLL(None)  # the process's C library: its stdout is what printf fills

    def __enter__(self):
        self.lock.acquire()
        self._flush()
        self._files = [os.memfd_create("vgpu-device-output") for _ in range(2)]
        self._saved = [os.dup(1), os.dup(2)]
        os.dup2(self._files[0], 1)
        os.dup2(self._files[1], 2)
        self.output = self.diagnostics = ""
        return self

    def _flush(self) -> None:
        stdout = ctypes.c_void_p.in_dll(self._libc, "stdout")
        self._libc.fflush(stdout)

    def __exit__(self, *exc):
        try:
            self._flush()
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)
            self.output, self.diagnostics = (
                os.pread(f, os.fstat(f).st_size, 0).decode(errors="replace")
                for f in self._files)
        finally:
            for fd in (*self._files, *self._saved):
                os.close(fd)
            self.lock.release()


# ----------------------------------------------------------------- memory


@dataclass
class _Device:
    """A GPU as one session uses it."""

    ordinal: int
    handle: object  # its CUdevice
    prop: object  # CUmemAllocationProp: memory on it
    accessors: list[int]  # the devices whose kernels reach its memory: itself and its peers
    context: object = None  # the session's, once it used the device
    printf_fifo: int = 0  # the printf FIFO size set in that context
    legacy_mark: object = None  # an event the session's streams wait for the legacy stream by


@dataclass
class _Chunk:
    """Physical memory mapped at [start, start+size): granules brought to life together."""

    start: int
    size: int
    handle: object
    device: int  # whose memory it is
    live: int = 0  # granules in it that allocations use


@dataclass
class _Physical:
    """Memory of the virtual memory API: a physical allocation of the program's."""

    handle: object
    size: int
    device: int


@dataclass
class _Import:
    """Another session's memory mapped in this one's range (IPC)."""

    device: int  # whose memory it is
    span: int
    mappings: list[tuple[int, int]]  # (address, size) of each cuMemMap


@dataclass(eq=False)
class _Stream:
    """A session stream's device stream (see stream_created)."""

    device: int
    handle: object
    mark: object  # an event the legacy stream waits for it by
    queued: bool = False  # work queued on it since the legacy stream last waited for it
    behind: bool = False  # legacy-stream work queued since it last waited for that


@dataclass(eq=False)
class _Event:
    """A session's event: a CUDA event in the session's context on `device`."""

    handle: object  # its CUevent
    device: int
    timing: bool
    # A restored event is recorded at its restore, having completed `lag_ms` earlier.
    lag_ms: float = 0.0


@dataclass
class _Module:
    module: object
    device: int  # the device it is loaded on
    functions: dict[str, object] = field(default_factory=dict)
    printing: set[str] = field(default_factory=set)  # kernels that may printf or assert


class CudaBackend(Backend):
    name = "cuda"
    memory_is_host_ram = False
    shares_address_space = True
    host_buffers_at_client_addresses = True

    def __init__(self) -> None:
        self._d = d = _load_driver()
        self._devices = [self._gpu(ordinal) for ordinal in range(_device_count)]
        self._description = _description(d, 0)
        self._cancelled = threading.Event()
        minimum = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        self.granule = max(int(_call(d, d.cuMemGetAllocationGranularity(device.prop, minimum)))
                           for device in self._devices)
        self._piece_bytes = 0  # what one piece of the arena's range spans (attach_arena)
        self._regions: list[int] = []  # where each device's region of the arena begins
        self._arena = (0, 0)
        self._open()

    def _gpu(self, ordinal: int) -> _Device:
        d = self._d
        handle = _call(d, d.cuDeviceGet(ordinal))
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = ordinal
        # Memory that another process can map (a session in a device process of its own:
        # IPC between sessions), where the device has it.
        posix = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        if _call(d, d.cuDeviceGetAttribute(posix, handle)):
            prop.requestedHandleTypes = _POSIX_FD(d)
        accessors = [ordinal] + [
            other for other in range(_device_count) if other != ordinal and
            _call(d, d.cuDeviceCanAccessPeer(_call(d, d.cuDeviceGet(other)), handle))]
        return _Device(ordinal, handle, prop, accessors)

    def _open(self) -> None:
        """A context of the session's own on device 0, made at its first use."""
        self._busy: set[int] = set()  # devices with launches not waited for
        self._copying: set[int] = set()  # devices with copies or memsets not waited for
        self._pieces: dict[int, int] = {}  # reserved start -> size
        self._chunks: dict[int, _Chunk] = {}  # granule address -> its chunk
        self._granule_users: dict[int, int] = {}  # granule address -> allocations in it
        self._allocations: dict[int, int] = {}  # address -> size
        self._host_only: dict[int, memoryview] = {}  # clients' host buffers (map_host)
        self._registered_host: set[int] = set()  # those kernels reach (registered)
        self._vmm_mappings: dict[int, int] = {}  # address -> size
        self._vmm_devices: dict[int, int] = {}  # mapping address -> its memory's device
        self._imports: dict[int, _Import] = {}  # IPC: address -> what it maps
        self._lost_imports: set[int] = set()  # those a recovery gave up
        self._access: dict[int, int] = {}  # mapping address -> the access it allows
        self._variables = _Variables()
        self._streams: dict[int, _Stream] = {}  # by the session's stream handle
        self._events: set[_Event] = set()  # those alive (a lost context takes its own)

    def recover(self) -> None:
        """The program reset its device after a fault: the contexts the fault lost, and all
        the memory in them, are given up for fresh ones (CUDA's way back from a fault)."""
        d = self._d
        used = [device for device in self._devices if device.context is not None]
        # The clients' host buffers stay theirs: shown to the fresh context as to the lost.
        hosts, self._host_only = self._host_only, {}
        reached = set(self._registered_host)
        # IPC mappings go with the lost context, as on CUDA; closing them later is a no-op.
        lost_imports = self._lost_imports | set(self._imports)
        self._release()
        # vgpu's own driver clears a fault at the device's reset. NVIDIA's never does: a
        # device-side fault is sticky for the whole process (every context, and every one
        # made after it, fails; seen on an H200), so there this recovery cannot succeed and
        # only a fresh process can use the GPU again: what a session in a device process of
        # its own gets instead (isolated.py's recover).
        for device in used:
            _let_go(d, d.cuDevicePrimaryCtxReset(device.handle))
        self._open()
        self._lost_imports = lost_imports
        if self._piece_bytes:
            self._reserve_regions()
        for address, view in hosts.items():
            if address in reached:
                self.map_host(address, len(view), view)
            else:
                self._host_only[address] = view

    # ----------------------------------------------------------------- plumbing

    def _context(self, ordinal: int):
        """The session's context on device `ordinal`, made at its first use."""
        device = self._devices[ordinal]
        if device.context is None:
            d = self._d
            device.context = _call(d, d.cuCtxCreate(None, 0, device.handle))
            _call(d, d.cuCtxPopCurrent())
        return device.context

    @contextlib.contextmanager
    def _current(self, ordinal: int = 0):
        """The session's context on device `ordinal` current on this thread for the block
        (it may be already: inside `running`, device 0's)."""
        d = self._d
        context = self._context(ordinal)
        if int(_call(d, d.cuCtxGetCurrent())) == int(context):
            yield
            return
        _call(d, d.cuCtxPushCurrent(context))
        try:
            yield
        finally:
            # Unless the block destroyed it (recover), which took it off the stack.
            if int(_call(d, d.cuCtxGetCurrent())) == int(context):
                _call(d, d.cuCtxPopCurrent())

    def running(self):
        return self._current()

    def describe(self) -> DeviceDescription:
        return self._description

    def devices_driven(self) -> int:
        return len(self._devices)

    def describe_device(self, ordinal: int) -> DeviceDescription:
        return _description(self._d, ordinal)

    def can_access_peer(self, device: int, peer: int) -> bool:
        return device != peer and device in self._devices[peer].accessors

    def _owner(self, address: int) -> int:
        """The device whose memory `address` is (device 0 for what is no device's)."""
        chunk = self._chunks.get(self._floor(address))
        if chunk is not None:
            return chunk.device
        for start, size in self._vmm_mappings.items():
            if start <= address < start + size:
                return self._vmm_devices[start]
        for start, imported in self._imports.items():
            if start <= address < start + imported.span:
                return imported.device
        return self._variables.owner(address)

    def _wait_for_others(self, ordinal: int, launches: bool = True) -> None:
        """Wait for the work of devices other than `ordinal` that may touch what work on it
        touches next: their copies and memsets, and (`launches`) their kernels."""
        d = self._d
        others = (self._copying | (self._busy if launches else set())) - {ordinal}
        for other in sorted(others):
            with self._current(other):
                _call(d, d.cuCtxSynchronize())
            self._busy.discard(other)
            self._copying.discard(other)

    # ----------------------------------------------------------------- addresses

    def attach_arena(self, base: int, size: int, regions: list[int] | None = None) -> None:
        """Reserve the arena's range, in pieces: the first of each device's region now, the
        others once addresses in them are handed out. The arena places first-fit from each
        region's start, so its allocations reach little beyond the device's memory, and the
        driver keeps the rest of the address space (it places module variables, say, where
        it likes)."""
        self._arena = (base, size)
        self._regions = regions or [base]
        piece = 1 << (self._description.total_memory - 1).bit_length()
        self._piece_bytes = min(max(piece, self.granule), size)
        self._reserve_regions()

    def _reserve_regions(self) -> None:
        for start in self._regions:
            self._cover(start, 1)

    def _reserve_piece(self, start: int) -> None:
        d = self._d
        base, size = self._arena
        span = min(self._piece_bytes, base + size - start)
        with self._current():
            got = int(_call(d, d.cuMemAddressReserve(span, 0, start, 0)))
            if got != start:  # the driver treats the address as a hint, and it was taken
                _call(d, d.cuMemAddressFree(got, span))
                raise CudaError(CUDA_ERROR_OUT_OF_MEMORY,
                                f"the device's addresses 0x{start:x}+0x{span:x} (the "
                                "session's range) cannot be reserved: something else on the "
                                "device uses them")
        self._pieces[start] = span

    def _cover(self, address: int, size: int) -> None:
        """Reserve the pieces of the arena's range [address, +size) lies in, if not yet."""
        base, arena_size = self._arena
        if not self._piece_bytes or not base <= address < base + arena_size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"0x{address:x} is not in the session's address range")
        first = base + (address - base) // self._piece_bytes * self._piece_bytes
        for start in range(first, address + size, self._piece_bytes):
            if start not in self._pieces:
                self._reserve_piece(start)

    # ----------------------------------------------------------------- allocations

    def map(self, address: int, size: int, backing: memoryview | None = None,
            device: int = 0) -> None:
        if backing is not None:
            self._host_only[address] = memoryview(backing).cast("B")
            return
        self._cover(address, size)
        granules = range(self._floor(address), address + size, self.granule)
        fresh = [g for g in granules if g not in self._chunks]
        with self._current():
            for start, length in _runs(fresh, self.granule):
                self._new_chunk(start, length, device)
        for g in granules:
            users = self._granule_users.get(g, 0)
            if users == 0:
                self._chunks[g].live += 1
            self._granule_users[g] = users + 1
        self._allocations[address] = size

    def map_host(self, address: int, size: int, buffer: memoryview,
                 file: int | None = None) -> str | None:
        """A client's page-locked buffer: copies and memsets reach it here (host_view). With
        unified addressing a kernel reaches host memory at its host address, which is the
        client's, so the buffer is registered with the driver only where the session mapped
        it at that same address in this process (host_buffers_at_client_addresses), and the
        driver must agree that the device sees it there."""
        d = self._d
        view = memoryview(buffer).cast("B")
        self._host_only[address] = view
        if ctypes.addressof(ctypes.c_char.from_buffer(view)) != address:
            return (f"the client's address 0x{address:x} is not free in the server's "
                    "process, where the device would have to see the buffer")
        with self._current():
            try:
                _call(d, d.cuMemHostRegister(
                    address, size, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_DEVICEMAP))
            except CudaError as exc:
                return f"the driver does not map the buffer into the device: {exc.message}"
            device = int(_call(d, d.cuMemHostGetDevicePointer(address, 0)))
            if device != address:
                _call(d, d.cuMemHostUnregister(address))
                return (f"the device sees host memory at other addresses than the host "
                        f"(0x{address:x} at 0x{device:x}): kernels need the host's")
        self._registered_host.add(address)
        return None

    def _floor(self, address: int) -> int:
        return address // self.granule * self.granule

    def _new_chunk(self, start: int, size: int, device: int) -> None:
        d = self._d
        handle = _call(d, d.cuMemCreate(size, self._devices[device].prop, 0))
        try:
            _call(d, d.cuMemMap(start, size, 0, handle, 0))
            try:
                self._grant(start, size, 3, device)
            except BaseException:
                _call(d, d.cuMemUnmap(start, size))
                raise
        except BaseException:
            _call(d, d.cuMemRelease(handle))
            raise
        chunk = _Chunk(start, size, handle, device)
        for g in range(start, start + size, self.granule):
            self._chunks[g] = chunk

    def _grant(self, address: int, size: int, access: int, device: int) -> None:
        """`access` to [address, +size), memory of `device`, for the devices that reach it."""
        d = self._d
        descriptions = []
        for ordinal in self._devices[device].accessors:
            desc = d.CUmemAccessDesc()
            desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = ordinal
            desc.flags = d.CUmemAccess_flags(access)
            descriptions.append(desc)
        _call(d, d.cuMemSetAccess(address, size, descriptions, len(descriptions)))

    def unmap(self, address: int) -> None:
        host = self._host_only.pop(address, None)
        if host is not None:
            if address in self._registered_host:
                # Kernels queued before may still use it: they finish first, as CUDA's
                # unregistering and freeing of page-locked memory wait for the device.
                self._registered_host.discard(address)
                self._wait_for_all()
                with self._current():
                    _let_go(self._d, self._d.cuMemHostUnregister(address))
            host.release()  # the session closes its map of the buffer next
            return
        d = self._d
        if address in self._lost_imports:
            self._lost_imports.discard(address)
            return
        if address in self._imports:
            with self._current():
                for at, length in self._imports.pop(address).mappings:
                    _let_go(d, d.cuMemUnmap(at, length))
            return
        if address in self._vmm_mappings:
            with self._current():
                _let_go(d, d.cuMemUnmap(address, self._vmm_mappings.pop(address)))
            self._vmm_devices.pop(address)
            self._access.pop(address, None)
            return
        size = self._allocations.pop(address)
        for g in range(self._floor(address), address + size, self.granule):
            self._granule_users[g] -= 1
            if self._granule_users[g]:
                continue
            del self._granule_users[g]
            chunk = self._chunks[g]
            chunk.live -= 1
            if chunk.live == 0:
                self._free_chunk(chunk)

    def _free_chunk(self, chunk: _Chunk) -> None:
        d = self._d
        with self._current():
            _let_go(d, d.cuMemUnmap(chunk.start, chunk.size))
            _let_go(d, d.cuMemRelease(chunk.handle))
        for g in range(chunk.start, chunk.start + chunk.size, self.granule):
            del self._chunks[g]

    # ----------------------------------------------------------------- IPC

    def export_memory(self, address: int, size: int) -> SharedMemory:
        """The device whose memory [address, +size) is, and the physical memory of the
        granules it lies in, piece by piece (handle, offset, length): another session's
        context maps it again. Like CUDA's, an export shows the whole granules, the
        allocation's neighbours in them included."""
        start = self._floor(address)
        pieces: list[list] = []
        for g in range(start, address + size, self.granule):
            chunk = self._chunks[g]
            if pieces and pieces[-1][0] is chunk and \
                    pieces[-1][1] + pieces[-1][2] == g - chunk.start:
                pieces[-1][2] += self.granule
            else:
                pieces.append([chunk, g - chunk.start, self.granule])
        span = sum(length for _, _, length in pieces)
        device = self._chunks[start].device
        shared = [(self._shareable(chunk.handle, device), offset, length)
                  for chunk, offset, length in pieces]
        return SharedMemory((device, shared), size, address - start, span, self.granule)

    def _shareable(self, handle, device: int):
        """`handle` as another session can map it: a file descriptor (which another
        process imports) where the memory was made to export to one, else the handle
        (which only this process's other sessions can map)."""
        if not int(self._devices[device].prop.requestedHandleTypes):
            return handle
        d = self._d
        with self._current():
            return FileDescriptor(int(_call(d, d.cuMemExportToShareableHandle(
                handle, _POSIX_FD(d), 0))))

    def _adopted(self, shared):
        """A handle of this process for what `_shareable` gave (its own, to release)."""
        if not isinstance(shared, FileDescriptor):
            return shared, False
        d = self._d
        return _call(d, d.cuMemImportFromShareableHandle(shared.fd, _POSIX_FD(d))), True

    def import_memory(self, address: int, shared: SharedMemory) -> None:
        """Another session's physical memory mapped at `address` (granule-aligned), readable
        and writable. The exporter may free it meanwhile: the driver keeps physical memory
        while a mapping shows it."""
        d = self._d
        device, pieces = shared.memory
        self._cover(address, shared.span)
        mapped: list[tuple[int, int]] = []
        with self._current():
            try:
                at = address
                for shared_handle, offset, length in pieces:
                    handle, imported = self._adopted(shared_handle)
                    try:
                        _call(d, d.cuMemMap(at, length, offset, handle, 0))
                    finally:
                        if imported:  # the mapping keeps the memory
                            _let_go(d, d.cuMemRelease(handle))
                    mapped.append((at, length))
                    at += length
                self._grant(address, shared.span, 3, device)
            except BaseException:
                for at, length in mapped:
                    _let_go(d, d.cuMemUnmap(at, length))
                raise
        self._imports[address] = _Import(device, shared.span, mapped)

    # ----------------------------------------------------------------- the VMM API

    def create_physical(self, size: int, contents: bytearray | None = None,
                        device: int = 0) -> _Physical:
        d = self._d
        with self._current():
            physical = _Physical(_call(d, d.cuMemCreate(size, self._devices[device].prop, 0)),
                                 size, device)
        if contents is not None:
            self.write_physical(physical, 0, memoryview(contents))
        return physical

    def export_physical(self, physical: _Physical) -> tuple[object, int, int]:
        return self._shareable(physical.handle, physical.device), physical.size, \
            physical.device

    def import_physical(self, shared: object, size: int, device: int) -> _Physical:
        with self._current():
            handle, _ = self._adopted(shared)
        return _Physical(handle, size, device)

    @contextlib.contextmanager
    def _mapped_somewhere(self, physical: _Physical):
        """`physical` mapped, readable and writable, at an address the driver picks (outside
        the arena): where a checkpoint reads it and a restore writes it."""
        d = self._d
        with self._current():
            address = int(_call(d, d.cuMemAddressReserve(physical.size, 0, 0, 0)))
            try:
                _call(d, d.cuMemMap(address, physical.size, 0, physical.handle, 0))
                try:
                    self._grant(address, physical.size, 3, physical.device)
                    # Copies there run on the memory's device (_owner).
                    self._vmm_mappings[address] = physical.size
                    self._vmm_devices[address] = physical.device
                    yield address
                finally:
                    self._vmm_mappings.pop(address, None)
                    self._vmm_devices.pop(address, None)
                    _call(d, d.cuMemUnmap(address, physical.size))
            finally:
                _call(d, d.cuMemAddressFree(address, physical.size))

    def read_physical(self, physical: _Physical, offset: int, out: memoryview) -> None:
        with self._mapped_somewhere(physical) as address:
            self.read_into(address + offset, out)

    def write_physical(self, physical: _Physical, offset: int, data: memoryview) -> None:
        with self._mapped_somewhere(physical) as address:
            self.write(address + offset, data)

    def map_physical(self, address: int, size: int, physical: _Physical) -> None:
        self._cover(address, size)
        d = self._d
        with self._current():
            _call(d, d.cuMemMap(address, size, 0, physical.handle, 0))
        self._vmm_mappings[address] = size
        self._vmm_devices[address] = physical.device

    def set_access(self, address: int, access: int) -> None:
        if access == self._access.get(address, 0):
            return  # a fresh mapping allows no access already: nothing to ask the driver
        with self._current():
            self._grant(address, self._vmm_mappings[address], access, self._vmm_devices[address])
        self._access[address] = access

    def release_physical(self, physical: _Physical) -> None:
        d = self._d
        with self._current():
            _let_go(d, d.cuMemRelease(physical.handle))

    # ----------------------------------------------------------------- copies

    def host_view(self, address: int, size: int, writing: bool = True) -> memoryview | None:
        """Page-locked host memory (see map) is in host RAM: a view of it; None elsewhere."""
        for start, buffer in self._host_only.items():
            if start <= address and address + size <= start + len(buffer):
                return buffer[address - start:address - start + size]
        return None

    def write(self, address: int, data: memoryview) -> None:
        d = self._d
        data = memoryview(data).cast("B")
        host = self.host_view(address, len(data))
        if host is not None:
            host[:] = data
            return
        owner = self._owner(address)
        self._wait_for_others(owner)
        address = self._variables.device_address(address)
        with self._current(owner):
            self._enter(0, owner)
            if data:
                _call(d, d.cuMemcpyHtoD(address, _host_address(data), len(data)))

    def read_into(self, address: int, out: memoryview) -> None:
        d = self._d
        out = memoryview(out).cast("B")
        host = self.host_view(address, len(out))
        if host is not None:
            out[:] = host
            return
        owner = self._owner(address)
        self._wait_for_others(owner)
        address = self._variables.device_address(address)
        with self._current(owner):
            self._enter(0, owner)
            if out:
                _call(d, d.cuMemcpyDtoH(_host_address(out), address, len(out)))

    def copy(self, dst: int, src: int, size: int) -> None:
        if self.host_side_copy(dst, src, size):
            return
        d = self._d
        owner, source_owner = self._owner(dst), self._owner(src)
        self._wait_for_others(owner)
        dst, src = self._variables.device_address(dst), self._variables.device_address(src)
        with self._current(owner):
            self._enter(0, owner)
            _call(d, d.cuMemcpyDtoD(dst, src, size))
            if source_owner != owner:  # a peer copy: done before the peer's next work
                _call(d, d.cuCtxSynchronize())
            else:
                self._copying.add(owner)
                self._legacy_queued(owner)

    def fill(self, address: int, pattern: bytes, count: int) -> None:
        if self.host_side_fill(address, pattern, count):
            return
        d = self._d
        owner = self._owner(address)
        self._wait_for_others(owner)
        address = self._variables.device_address(address)
        setter = {1: d.cuMemsetD8, 2: d.cuMemsetD16, 4: d.cuMemsetD32}[len(pattern)]
        with self._current(owner):
            self._enter(0, owner)
            _call(d, setter(address, int.from_bytes(pattern, "little"), count))
        self._copying.add(owner)
        self._legacy_queued(owner)

    # ----------------------------------------------------------------- modules

    def load_module(self, image: bytes, allocate: Callable[[int], int],
                    device: int = 0) -> LoadedModule:
        """The whole image to the driver (a fatbin's SASS for this GPU, or its PTX JIT
        compiled). Each module variable gets an arena address too (`allocate`, in the order
        and sizes emu's would), which copies reach it by (see _variable_at)."""
        d = self._d
        decoded = decode_image(image)
        if decoded.ptx and not is_binary(image):  # PTX text: the driver wants it ended
            image = image.rstrip(b"\0") + b"\0"
        with self._current(device):
            if image[:8] == LINKED_PTX_MAGIC:
                image = self._linked(decoded.ptx)
            module = _call(d, d.cuModuleLoadData(image))
            try:
                loaded = self._describe_module(module, decoded.ptx, image, allocate, device)
            except BaseException:
                _call(d, d.cuModuleUnload(module))
                raise
        return loaded

    def _linked(self, ptx: list[str]) -> bytes:
        """What a program's cuLink* calls made (vgpu's link output: the PTX modules added,
        see vgpu.module_image), linked by the driver."""
        d = self._d
        state = _call(d, d.cuLinkCreate(0, [], []))
        try:
            for i, text in enumerate(ptx):
                data = text.encode() + b"\0"
                _call(d, d.cuLinkAddData(state, d.CUjitInputType.CU_JIT_INPUT_PTX, data,
                                         len(data), f"module{i}.ptx".encode(), 0, [], []))
            image, size = _call(d, d.cuLinkComplete(state))
            return ctypes.string_at(int(image), int(size))
        finally:
            _call(d, d.cuLinkDestroy(state))

    def _describe_module(self, module, ptx: list[str], image: bytes,
                         allocate: Callable[[int], int], device: int) -> LoadedModule:
        d = self._d
        count = int(_call(d, d.cuModuleGetFunctionCount(module)))
        printing = printing_kernels(image, ptx)
        handle = _Module(module, device)
        kernels = {}
        for function in _call(d, d.cuModuleEnumerateFunctions(count, module)) or ():
            # Under CUDA's lazy loading (the default) a function is loaded at first use, and
            # its name and attributes are refused until then: describing it is that use.
            _call(d, d.cuFuncLoad(function))
            name = _call(d, d.cuFuncGetName(function)).decode()
            handle.functions[name] = function
            kernels[name] = self._describe_kernel(name, function, name in printing)
            if name in printing:
                handle.printing.add(name)
        variables, managed = {}, set()
        found = declared_variables(ptx) or [(name, 0, False)
                                            for name, _ in cubin_variables(image)]
        for name, declared, is_managed in found:
            try:
                address, size = (int(v) for v in
                                 _call(d, d.cuModuleGetGlobal(module, name.encode())))
            except CudaError:  # a name the driver does not give: its place is taken alike
                if declared:
                    allocate(declared, managed=is_managed)
                continue
            # A __managed__ variable's host view is the client's (shim/driver/managed.py),
            # agreed with the variable through copies to its place, as for any variable.
            place = allocate(declared or size, managed=is_managed)
            variables[name] = (place, size)
            if is_managed:
                managed.add(name)
            self._variables.add(place, size, address, device)
        return LoadedModule(kernels=kernels, variables=variables, handle=handle,
                            managed=managed)

    def _describe_kernel(self, name: str, function, may_print: bool) -> KernelDescription:
        d = self._d
        offsets, sizes = [], []
        while True:
            try:
                offset, size = _call(d, d.cuFuncGetParamInfo(function, len(offsets)))
            except CudaError as exc:
                if exc.code != CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                    raise
                break
            offsets.append(int(offset))
            sizes.append(int(size))
        attributes = {
            key: int(_call(d, d.cuFuncGetAttribute(d.CUfunction_attribute(value), function)))
            for key, value in _FUNCTION_ATTRIBUTES.items()
        }
        end = max((o + s for o, s in zip(offsets, sizes, strict=True)), default=0)
        return KernelDescription(name=name, param_offsets=offsets, param_sizes=sizes,
                                 param_buffer_size=end, attributes=attributes,
                                 uses_printf=may_print)

    def unload_module(self, module: LoadedModule) -> None:
        d = self._d
        for place, _ in module.variables.values():
            self._variables.remove(place)
        with self._current(module.handle.device):
            _let_go(d, d.cuModuleUnload(module.handle.module))

    # ----------------------------------------------------------------- launches

    def prepare_launch(self, module: LoadedModule, kernel: str, grid, block,
                       shared_bytes: int, cooperative: bool = False
                       ) -> Callable[..., tuple[str, str]]:
        d = self._d
        function = module.handle.functions[kernel]
        device = module.handle.device
        static = module.kernels[kernel].attributes.get("shared_size_bytes", 0)
        if shared_bytes + static > DEFAULT_SHARED_BYTES:
            with self._current(device):
                _call(d, d.cuFuncSetAttribute(
                    function,
                    d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes))
        may_print = kernel in module.handle.printing
        grid, block = tuple(int(v) for v in grid), tuple(int(v) for v in block)
        offsets = module.kernels[kernel].param_offsets

        def run(params: bytes, printf_fifo_bytes: int, stream: int = 0) -> tuple[str, str]:
            if self._cancelled.is_set():
                raise Cancelled
            buffer = ctypes.create_string_buffer(bytes(params), max(len(params), 1))
            size = ctypes.c_size_t(len(params))
            extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buffer), 2,
                                          ctypes.addressof(size), 0)
            self._wait_for_others(device, launches=False)
            with self._current(device):
                # A stream of another device's: the driver refuses the launch, as CUDA does.
                on = self._enter(stream, device)
                if on == 0:
                    self._legacy_queued(device)
                if may_print and printf_fifo_bytes != self._devices[device].printf_fifo:
                    self._set_printf_fifo(device, printf_fifo_bytes)
                if cooperative:  # the driver takes no parameter buffer here: pointers
                    pointers = (ctypes.c_void_p * max(len(offsets), 1))(
                        *(ctypes.addressof(buffer) + o for o in offsets))
                    _call(d, d.cuLaunchCooperativeKernel(
                        function, *grid, *block, shared_bytes, on,
                        ctypes.addressof(pointers)))
                else:
                    _call(d, d.cuLaunchKernel(function, *grid, *block, shared_bytes, on, 0,
                                              ctypes.addressof(extra)))
                if not may_print:
                    self._busy.add(device)
                    return "", ""
                with _StdoutCapture() as captured:
                    result = d.cuCtxSynchronize()
            try:
                _call(d, result)
            except CudaError as exc:
                if exc.code in _KERNEL_FAULTS:
                    raise KernelFault(exc.code, exc.message, captured.output,
                                      captured.diagnostics) from None
                raise
            return captured.output, captured.diagnostics

        return run

    def stream_created(self, handle: int, device: int = 0) -> None:
        """A stream of the device's own, so that launches on different streams overlap.
        It behaves as a blocking stream whatever the program asked for (copies and memsets
        run on the context's legacy stream after all the work before them, as
        `prepare_launch` says every backend's do), but the backend orders it with the
        legacy stream itself, through events (`_enter`): a driver may let one context's
        legacy stream wait for other contexts' blocking streams (vgpu's own does, for all of
        a process's), which would hold one session's copies behind another's kernels."""
        d = self._d
        with self._current(device):
            stream = _call(d, d.cuStreamCreate(_STREAM_NON_BLOCKING))
            mark = _call(d, d.cuEventCreate(_EVENT_DISABLE_TIMING))
        self._streams[handle] = _Stream(device, stream, mark)

    def stream_destroyed(self, handle: int) -> None:
        """Its queued work still runs (CUDA's rule), before the legacy stream's next."""
        d = self._d
        stream = self._streams.pop(handle, None)
        if stream is not None:  # else one the context lost to a fault took with it
            with self._current(stream.device):
                self._legacy_after(stream)
                _let_go(d, d.cuEventDestroy(stream.mark))
                _let_go(d, d.cuStreamDestroy(stream.handle))

    def _enter(self, stream: int, device: int):
        """The device stream for work on session stream `stream` (0: the legacy stream of
        `device`'s context, current), ordered as blocking streams are: the legacy stream's
        work after what the streams queued before, a stream's after the legacy stream's."""
        d = self._d
        entered = self._streams.get(stream)
        if entered is None:
            for other in self._streams.values():
                if other.device == device:
                    self._legacy_after(other)
            return 0
        if entered.behind:
            gpu = self._devices[entered.device]
            if gpu.legacy_mark is None:
                with self._current(entered.device):
                    gpu.legacy_mark = _call(d, d.cuEventCreate(_EVENT_DISABLE_TIMING))
            with self._current(entered.device):
                _call(d, d.cuEventRecord(gpu.legacy_mark, 0))
            _call(d, d.cuStreamWaitEvent(entered.handle, gpu.legacy_mark, 0))
            entered.behind = False
        entered.queued = True
        return entered.handle

    def _legacy_after(self, stream: _Stream) -> None:
        """The legacy stream of the stream's context waits for what it queued (that context
        current)."""
        if stream.queued:
            d = self._d
            _call(d, d.cuEventRecord(stream.mark, stream.handle))
            _call(d, d.cuStreamWaitEvent(0, stream.mark, 0))
            stream.queued = False

    def _legacy_queued(self, device: int) -> None:
        """Work was queued on `device`'s legacy stream: the streams' next waits for it."""
        for stream in self._streams.values():
            if stream.device == device:
                stream.behind = True

    # ----------------------------------------------------------------- events

    def create_event(self, device: int, timing: bool) -> _Event:
        """A CUDA event that blocks the waiting thread (a server's threads must not spin)."""
        d = self._d
        flags = _EVENT_BLOCKING_SYNC | (0 if timing else _EVENT_DISABLE_TIMING)
        with self._current(device):
            event = _Event(_call(d, d.cuEventCreate(flags)), device, timing)
        self._events.add(event)
        return event

    def record_event(self, event: _Event, stream: int) -> None:
        """On the stream's device stream; one of another device's is refused by the driver,
        as CUDA refuses it."""
        d = self._d
        with self._current(event.device):
            _call(d, d.cuEventRecord(event.handle, self._enter(stream, event.device)))
        event.lag_ms = 0.0

    def wait_event(self, stream: int, event: _Event) -> None:
        d = self._d
        if stream in self._streams:
            device = self._streams[stream].device
            with self._current(device):
                _call(d, d.cuStreamWaitEvent(self._enter(stream, device), event.handle, 0))
            return
        # The legacy stream of the context the program has current, which the session does
        # not know: every context's (the streams wait for it in turn).
        for device in self._devices:
            if device.context is not None:
                with self._current(device.ordinal):
                    _call(d, d.cuStreamWaitEvent(self._enter(0, device.ordinal),
                                                 event.handle, 0))
                self._legacy_queued(device.ordinal)

    def event_done(self, event: _Event) -> bool:
        d = self._d
        result = d.cuEventQuery(event.handle)
        if int(result[0] if isinstance(result, tuple) else result) == _NOT_READY:
            return False
        _call(d, result)
        return True

    def synchronize_event(self, event: _Event) -> None:
        if self._cancelled.is_set():
            raise Cancelled
        _call(self._d, self._d.cuEventSynchronize(event.handle))

    def elapsed_ms(self, start: _Event, end: _Event) -> float:
        """The device's time between the records (a restored event's from its restore,
        less how long before that it completed)."""
        d = self._d
        ms = _call(d, d.cuEventElapsedTime(start.handle, end.handle))
        return float(ms) + start.lag_ms - end.lag_ms

    def event_age(self, event: _Event) -> float:
        """Timed against an event recorded now on the event's device."""
        if not event.timing:
            return 0.0
        d = self._d
        with self._current(event.device):
            now = _call(d, d.cuEventCreate(_EVENT_BLOCKING_SYNC))
            try:
                _call(d, d.cuEventRecord(now, 0))
                _call(d, d.cuEventSynchronize(now))
                result = d.cuEventElapsedTime(event.handle, now)
            finally:
                _let_go(d, d.cuEventDestroy(now))
        if int(result[0]) != CUDA_SUCCESS:  # never recorded
            return 0.0
        return (float(result[1]) + event.lag_ms) / 1000.0

    def backdate_event(self, event: _Event, age: float) -> None:
        self.record_event(event, 0)
        event.lag_ms = age * 1000.0

    def destroy_event(self, event: _Event) -> None:
        """A record not yet completed still completes (CUDA's rule); the event goes then."""
        if event in self._events:
            self._events.discard(event)
            with self._current(event.device):
                _let_go(self._d, self._d.cuEventDestroy(event.handle))

    def work_done(self) -> bool:
        """Every device stream of the session, and each context's legacy stream, idle."""
        d = self._d
        for device in self._devices:
            if device.context is None:
                continue
            with self._current(device.ordinal):
                streams = [s.handle for s in self._streams.values()
                           if s.device == device.ordinal]
                for stream in [0, *streams]:
                    result = d.cuStreamQuery(stream)
                    if int(result[0] if isinstance(result, tuple) else result) == _NOT_READY:
                        return False
                    _call(d, result)
        return True

    def _set_printf_fifo(self, device: int, size: int) -> None:
        d = self._d
        try:
            _call(d, d.cuCtxSetLimit(d.CUlimit.CU_LIMIT_PRINTF_FIFO_SIZE, size))
        except CudaError:  # fixed once a kernel that prints has run: CUDA keeps the first
            pass
        self._devices[device].printf_fifo = size

    def set_device_runtime_limit(self, limit: int, value: int) -> None:
        """The devices' own heap and pending-launch limits (their driver refuses them once a
        kernel using them has run, as the emulator's session does), in each context the
        session has."""
        d = self._d
        for device in self._devices:
            if device.context is not None:
                with self._current(device.ordinal):
                    _call(d, d.cuCtxSetLimit(d.CUlimit(limit), value))

    def set_memcheck(self, strict: bool) -> None:
        """A GPU checks nothing beyond its own faults: nothing to set."""

    def synchronize(self) -> None:
        d = self._d
        if self._cancelled.is_set():
            raise Cancelled
        for device in self._devices:
            if device.context is not None:
                with self._current(device.ordinal):
                    _call(d, d.cuCtxSynchronize())
        self._busy.clear()
        self._copying.clear()
        for stream in self._streams.values():
            stream.queued = stream.behind = False

    def _wait_for_all(self) -> None:
        """Wait for every device's work, whatever became of it (it is given up next)."""
        for device in self._devices:
            if device.context is not None:
                with self._current(device.ordinal):
                    _let_go(self._d, self._d.cuCtxSynchronize())

    def cancel(self) -> None:
        """No later launch runs; a kernel running now runs to its end (a GPU cannot be told
        to stop one), and close() then waits for it."""
        self._cancelled.set()

    def close(self) -> None:
        used = [device for device in self._devices if device.context is not None]
        if used and self._release():
            # A fault is kept for the whole process: vgpu's own driver clears it at the
            # reset, for the other sessions; NVIDIA's never does (see recover).
            for device in used:
                _let_go(self._d, self._d.cuDevicePrimaryCtxReset(device.handle))

    def _release(self) -> bool:
        """Give everything back; whether the context was lost to a fault."""
        d = self._d
        lost = False
        # Mappings, physical memory and reservations are the process's, not the context's:
        # given back one by one; the context takes its modules with it.
        with self._current():
            for address in list(self._vmm_mappings):
                lost |= _let_go(d, d.cuMemUnmap(address, self._vmm_mappings.pop(address)))
            for imported in self._imports.values():
                for at, length in imported.mappings:
                    lost |= _let_go(d, d.cuMemUnmap(at, length))
            self._imports.clear()
            for chunk in {id(c): c for c in self._chunks.values()}.values():
                lost |= _let_go(d, d.cuMemUnmap(chunk.start, chunk.size))
                lost |= _let_go(d, d.cuMemRelease(chunk.handle))
            self._chunks.clear()
            for start, span in self._pieces.items():
                lost |= _let_go(d, d.cuMemAddressFree(start, span))
            self._pieces.clear()
            for address in self._registered_host:
                lost |= _let_go(d, d.cuMemHostUnregister(address))
            self._registered_host.clear()
        for host in self._host_only.values():
            host.release()
        self._streams.clear()  # the contexts take them with them
        self._events.clear()
        for device in self._devices:
            if device.context is not None:
                lost |= _let_go(d, d.cuCtxDestroy(device.context))
                device.context, device.printf_fifo = None, 0
                device.legacy_mark = None
        return lost


def _runs(granules: list[int], granule: int) -> list[tuple[int, int]]:
    """Contiguous runs of sorted granule addresses: (start, size) each."""
    runs: list[list[int]] = []
    for g in granules:
        if runs and runs[-1][0] + runs[-1][1] == g:
            runs[-1][1] += granule
        else:
            runs.append([g, granule])
    return [(start, size) for start, size in runs]


class _Variables:
    """Module variables: each has an arena address (its place, what the session and the
    program see, the same on every backend) and the address where the driver put it, which
    the kernels' code uses. Copies to a place reach the variable; a kernel given a place as
    a pointer does not (it faults where nothing is mapped there)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        # place -> (size, device address, the device's ordinal)
        self._found: dict[int, tuple[int, int, int]] = {}

    def add(self, place: int, size: int, device: int, ordinal: int) -> None:
        bisect.insort(self._starts, place)
        self._found[place] = (size, device, ordinal)

    def _holding(self, address: int) -> int | None:
        """The place of the variable holding `address`, if one does."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._starts[i] + self._found[self._starts[i]][0]:
            return self._starts[i]
        return None

    def owner(self, address: int) -> int:
        """The device of the variable holding `address` (0 where none does)."""
        place = self._holding(address)
        return 0 if place is None else self._found[place][2]

    def remove(self, place: int) -> None:
        if self._found.pop(place, None) is not None:
            self._starts.remove(place)

    def device_address(self, address: int) -> int:
        """Where a copy to `address` goes: into the variable whose place holds it, else
        there."""
        place = self._holding(address)
        if place is None:
            return address
        return self._found[place][1] + address - place
