"""A session's backend in a process of its own (`vgpu server --session-processes`).

On a GPU, a device-side fault (an illegal address, a trap) is kept by NVIDIA's driver for
the whole process, for good: every context of the process fails from then on, and no new
one can be made (measured on an H200). A server that ran every session's device work in the
server's process would lose all its sessions, and the GPU, to one program's fault. Here each
session's backend runs in a device process of its own (device_process.py), behind this
proxy: a fault ends only that process's use of the GPU, and the session's recovery
(cudaDeviceReset after the fault) starts a fresh process. Ending a session can kill its
process, which also stops a kernel that would never finish.

The proxy forwards the backend interface over a channel (process_channel.py). What stays on
the server's side: clients' pinned host buffers (copies to and from them are the server's
own; the device process maps the same memory file at the client's address for kernels),
and copies of bulk data, which go through a staging file both processes map.
"""

from __future__ import annotations

import functools
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vgpu.errors import CudaError

from .base import (
    Backend,
    Cancelled,
    DeviceDescription,
    FileDescriptor,
    KernelFault,
    LoadedModule,
    SharedMemory,
)
from .process_channel import ChannelClosed, Endpoint, ForeignObject, RemoteObject

__all__ = ["IsolatedBackend"]

CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_LAUNCH_FAILED = 719
STAGING_BYTES = 8 << 20  # bulk copies go through the staging file in pieces of this size
INLINE_BYTES = 64 << 10  # smaller copies travel in the call's message
CLOSE_WAIT_S = 10.0  # how long a closing device process may take to give the device back
SPARE_DELAY_S = 1.0  # after a spare is taken, when the next one starts
# Calls that only give something back: once the process is gone, what they would release
# went with it, and they succeed.
_RELEASES = frozenset({"unmap", "unload_module", "release_physical", "destroy_event",
                       "stream_destroyed"})


class IsolatedBackend(Backend):
    """Backend `name` (emu or cuda) in a device process of the session's own."""

    memory_is_host_ram = False
    # A client's pinned buffer is mapped by its memory file (map_host's `file`): the server
    # keeps the file, and the device process maps it at the client's address.
    host_buffers_at_client_addresses = True

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()
        self._cancelled = False
        self._lost: str | None = None  # why the device process ended, if it did
        self._arena: tuple | None = None
        self._strict = False
        self._host: dict[int, _HostBuffer] = {}  # clients' page-locked buffers, by address
        self._imports: set[int] = set()  # IPC mappings: a recovery loses them
        # Other sessions' physical memory imported here: id(theirs) -> (theirs, ours)
        self._adopted: dict[int, tuple[RemoteObject, RemoteObject]] = {}
        self._lost_mappings: set[int] = set()
        self._description: DeviceDescription | None = None
        self._descriptions: dict[int, DeviceDescription] = {}
        self._start()

    # ----------------------------------------------------------------- the process

    def _start(self) -> None:
        self._device = _spares.take(self.name)
        self._endpoint = Endpoint(self._device.socket, None, owner=self)
        self._lost = None
        try:
            traits = self._call("open")
        except BaseException:
            self._stop()
            raise
        self.launches_run_inline = traits["launches_run_inline"]
        self.shares_address_space = traits["shares_address_space"]
        self.own_device_runtime = traits["own_device_runtime"]
        self.pid = traits["pid"]

    def _stop(self) -> None:
        """End the device process now (its device work with it)."""
        self._device.end()

    def _call(self, method: str, *args, **kwargs):
        return self._on(None, method, args, kwargs)

    def _on(self, target: int | None, method: str | None, args: tuple, kwargs: dict,
            posted: bool = False):
        with self._lock:
            if self._lost is None:
                try:
                    if posted:
                        return self._endpoint.post(target, method, args, kwargs)
                    return self._endpoint.call(target, method, args, kwargs,
                                               takes_held=method not in _RELEASES)
                except ForeignObject:
                    raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                                    f"the {self.name} backend's sessions run in processes "
                                    "of their own, and this object of another session's "
                                    "cannot be used in this one") from None
                except ChannelClosed as exc:
                    self._lost = (f"the session's device process ended ({exc}; exit status "
                                  f"{self._exit_status()})")
            if self._cancelled:
                if method in _RELEASES or method == "synchronize":
                    return None
                raise Cancelled()
            if method in _RELEASES:
                return None
            raise KernelFault(CUDA_ERROR_LAUNCH_FAILED, self._lost)

    def _exit_status(self) -> int:
        """The ended process's exit status (a negative signal number if it was killed)."""
        try:
            return self._device.process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:  # it closed the channel but does not end
            self._device.process.kill()
            return self._device.process.wait()


    def reopen(self) -> Backend:
        return IsolatedBackend(self.name)

    # ----------------------------------------------------------------- the device

    def describe(self) -> DeviceDescription:
        if self._description is None:
            self._description = self._call("describe")
        return self._description

    def describe_device(self, ordinal: int) -> DeviceDescription:
        if ordinal not in self._descriptions:
            self._descriptions[ordinal] = self._call("describe_device", ordinal)
        return self._descriptions[ordinal]

    def devices_driven(self) -> int | None:
        return self._call("devices_driven")

    def can_access_peer(self, device: int, peer: int) -> bool:
        return self._call("can_access_peer", device, peer)

    def attach_arena(self, base: int, size: int, regions: list[int] | None = None) -> None:
        self._arena = (base, size, regions)
        self._call("attach_arena", base, size, regions)

    def set_memcheck(self, strict: bool) -> None:
        self._strict = strict
        self._call("set_memcheck", strict)

    def recover(self) -> None:
        """A fresh device process: the fault may have left the old one unable to use the
        device at all (NVIDIA's driver). The session's memory went with it, as a context's
        goes at a reset; its address range and the client's pinned buffers come back."""
        with self._lock:
            self._stop()
            self._lost_mappings |= self._imports
            self._imports.clear()
            self._adopted.clear()
            self._start()
            if self._arena is not None:
                self._call("attach_arena", *self._arena)
            self._call("set_memcheck", self._strict)
            for address, host in self._host.items():
                if host.file is not None:
                    host.shown, _ = self._call("map_host_file", address, len(host.view),
                                               host.file)

    # ----------------------------------------------------------------- memory

    def map(self, address: int, size: int, backing: memoryview | None = None,
            device: int = 0) -> None:
        if backing is not None:
            self._host[address] = _HostBuffer(memoryview(backing).cast("B"))
            return
        self._call("map", address, size, None, device)

    def map_host(self, address: int, size: int, buffer: memoryview,
                 file: int | None = None) -> str | None:
        host = self._host[address] = _HostBuffer(memoryview(buffer).cast("B"))
        if file is None:
            return ("the server has no memory file of the buffer to show to the session's "
                    "device process")
        host.file = FileDescriptor(os.dup(file))
        try:
            host.shown, unreached = self._call("map_host_file", address, size, host.file)
        except BaseException:
            self._host.pop(address)
            host.file.close()
            raise
        return unreached

    def unmap(self, address: int) -> None:
        host = self._host.pop(address, None)
        if host is not None:
            host.release()
            if not host.shown:
                return
        if address in self._lost_mappings:
            self._lost_mappings.discard(address)
            return
        self._imports.discard(address)
        self._call("unmap", address)

    def export_memory(self, address: int, size: int) -> SharedMemory:
        return self._call("export_memory", address, size)

    def import_memory(self, address: int, shared: SharedMemory) -> None:
        self._call("import_memory", address, shared)
        self._imports.add(address)

    def host_view(self, address: int, size: int, writing: bool = True) -> memoryview | None:
        for start, host in self._host.items():
            if start <= address and address + size <= start + len(host.view):
                return host.view[address - start:address - start + size]
        return None

    def write(self, address: int, data: memoryview) -> None:
        data = memoryview(data).cast("B")
        host = self.host_view(address, len(data))
        if host is not None:
            host[:] = data
            return
        shown = self._shown_at(data)
        if shown is not None:
            self._call("write_from_host", address, shown, len(data))
        elif len(data) <= INLINE_BYTES:
            self._call("write", address, data)
        else:
            self.write_from(address, len(data), _copy_from(data))

    def read_into(self, address: int, out: memoryview) -> None:
        out = memoryview(out).cast("B")
        host = self.host_view(address, len(out))
        if host is not None:
            out[:] = host
            return
        shown = self._shown_at(out)
        if shown is not None:
            self._call("read_to_host", address, shown, len(out))
        elif len(out) <= INLINE_BYTES:
            out[:] = self._call("read_bytes", address, len(out))
        else:
            self.read_to(address, len(out), _copy_into(out))

    def write_from(self, address: int, size: int,
                   fill: Callable[[memoryview, int], None]) -> None:
        """Each piece filled straight into the staging file, then copied to the device."""
        self._through_staging("write_staged", lambda at: (address + at,), size, fill=fill)

    def read_to(self, address: int, size: int, drain: Callable[[memoryview, int], None]
                ) -> None:
        self._through_staging("read_staged", lambda at: (address + at,), size, drain=drain)

    def _shown_at(self, data: memoryview) -> int | None:
        """Where the device process has `data`, when it lies in a client's page-locked
        buffer mapped there too: a copy from or to it goes straight between the device and
        that memory (by DMA on a GPU, where it is registered), with nothing staged."""
        if not data:
            return None
        start = _address_of(data)
        for address, host in self._host.items():
            base = host.base
            if host.shown and base <= start and start + len(data) <= base + len(host.view):
                return address + start - base
        return None

    def _through_staging(self, method: str, place: Callable[[int], tuple], size: int,
                         fill: Callable[[memoryview, int], None] | None = None,
                         drain: Callable[[memoryview, int], None] | None = None) -> None:
        """A bulk copy through the staging file, a piece at a time: `fill(piece, offset)`
        puts each piece there before the device process's `method(*place(offset), length)`
        takes it, or `drain(piece, offset)` takes what the method put there."""
        with self._lock:
            staging = memoryview(self._device.staging)
            try:
                for at in range(0, size, STAGING_BYTES):
                    length = min(STAGING_BYTES, size - at)
                    if fill is not None:
                        fill(staging[:length], at)
                    self._call(method, *place(at), length)
                    if drain is not None:
                        drain(staging[:length], at)
            finally:
                staging.release()

    def copy(self, dst: int, src: int, size: int) -> None:
        if not self.host_side_copy(dst, src, size):
            self._call("copy", dst, src, size)

    def fill(self, address: int, pattern: bytes, count: int) -> None:
        if not self.host_side_fill(address, pattern, count):
            self._call("fill", address, pattern, count)

    def mark(self) -> int:
        return self._call("mark")

    def changed_since(self, mark: int) -> list[tuple[int, int]] | None:
        return self._call("changed_since", mark)

    # ----------------------------------------------------------------- virtual memory

    def create_physical(self, size: int, contents: bytearray | None = None,
                        device: int = 0) -> object:
        physical = self._call("create_physical", size, None, device)
        if contents is not None:
            self.write_physical(physical, 0, memoryview(contents))
        return physical

    def read_physical(self, physical: object, offset: int, out: memoryview) -> None:
        out = memoryview(out).cast("B")
        self._through_staging("read_physical_staged", lambda at: (physical, offset + at),
                              len(out), drain=_copy_into(out))

    def write_physical(self, physical: object, offset: int, data: memoryview) -> None:
        data = memoryview(data).cast("B")
        self._through_staging("write_physical_staged", lambda at: (physical, offset + at),
                              len(data), fill=_copy_from(data))

    def map_physical(self, address: int, size: int, physical: object) -> None:
        self._call("map_physical", address, size, self._own_physical(physical))

    def _own_physical(self, physical: object) -> object:
        """`physical`, or this process's import of it where another session's device process
        made it (memory shared between sessions: server/vmm_sharing.py)."""
        owner = self._foreign(physical)
        if owner is None:
            return physical
        key = id(physical)
        if key not in self._adopted:
            shared, size, device = owner._call("export_physical", physical)
            imported = self._call("import_physical", shared, size, device)
            # (the foreign object is kept with its import: its id stays unique meanwhile)
            self._adopted[key] = (physical, imported)
        return self._adopted[key][1]

    def set_access(self, address: int, access: int) -> None:
        self._call("set_access", address, access)

    def release_physical(self, physical: object) -> None:
        owner = self._foreign(physical)
        if owner is None:
            self._call("release_physical", physical)
            return
        # The last session holding shared memory lets go of it: of this process's import,
        # and of the maker's memory (if its process is still there).
        adopted = self._adopted.pop(id(physical), None)
        if adopted is not None:
            self._call("release_physical", adopted[1])
        owner.release_physical(physical)

    # ----------------------------------------------------------------- modules, launches

    def load_module(self, image: bytes, allocate: Callable[..., int],
                    device: int = 0) -> LoadedModule:
        return self._call("load_module", bytes(image), allocate, device)

    def unload_module(self, module: LoadedModule) -> None:
        self._call("unload_module", module)

    def stream_created(self, handle: int, device: int = 0) -> None:
        self._call("stream_created", handle, device)

    def stream_destroyed(self, handle: int) -> None:
        self._call("stream_destroyed", handle)

    def prepare_launch(self, module: LoadedModule, kernel: str, grid: tuple[int, int, int],
                       block: tuple[int, int, int], shared_bytes: int,
                       cooperative: bool = False) -> Callable[..., tuple[str, str]]:
        launcher = self._call("prepare_launch", module, kernel, grid, block, shared_bytes,
                              cooperative)
        # A backend that queues launches (a GPU's) is not waited for, unless the kernel may
        # print or assert (its launcher waits for it, for its output).
        posted = not self.launches_run_inline and not module.kernels[kernel].uses_printf
        return _Launcher(self, launcher, posted)

    def use_device_runtime(self, place, device_graphs=None) -> None:
        self._call("use_device_runtime", place, device_graphs)

    def graph_environment(self, graph: int):
        return self._call("graph_environment", graph)

    def run_graph_tails(self, environment, printf_fifo_bytes: int) -> tuple[str, str]:
        return self._call("run_graph_tails", environment, printf_fifo_bytes)

    def set_device_runtime_limit(self, limit: int, value: int) -> None:
        self._call("set_device_runtime_limit", limit, value)

    # ----------------------------------------------------------------- events

    def create_event(self, device: int, timing: bool) -> object:
        return self._call("create_event", device, timing)

    def _foreign(self, thing: object) -> IsolatedBackend | None:
        """The backend of another session whose object `thing` is (an IPC event, shared
        physical memory), or None."""
        if isinstance(thing, RemoteObject) and thing.endpoint is not self._endpoint:
            return thing.endpoint.owner
        return None

    def record_event(self, event: object, stream: int) -> None:
        self._call("record_event", event, stream)

    def wait_event(self, stream: int, event: object) -> None:
        owner = self._foreign(event)
        if owner is not None:
            # Another process's event: the server waits for it, in place of the device. The
            # work this session queued before goes to the device first (a query sends it
            # where a driver holds queued work back, as vgpu's own does), since what the
            # event waits for may wait for it.
            self._call("work_done")
            _foreign_event_done(owner, event, wait=True)
            return
        self._call("wait_event", stream, event)

    def event_done(self, event: object) -> bool:
        owner = self._foreign(event)
        if owner is not None:
            return _foreign_event_done(owner, event, wait=False)
        return self._call("event_done", event)

    def synchronize_event(self, event: object) -> None:
        owner = self._foreign(event)
        if owner is not None:
            _foreign_event_done(owner, event, wait=True)
            return
        self._call("synchronize_event", event)

    def elapsed_ms(self, start: object, end: object) -> float:
        return self._call("elapsed_ms", start, end)

    def event_age(self, event: object) -> float:
        return self._call("event_age", event)

    def backdate_event(self, event: object, age: float) -> None:
        self._call("backdate_event", event, age)

    def destroy_event(self, event: object) -> None:
        self._call("destroy_event", event)

    def work_done(self) -> bool:
        return self._call("work_done")

    # ----------------------------------------------------------------- the session's end

    def synchronize(self) -> None:
        self._call("synchronize")

    def cancel(self) -> None:
        """End the device process: its running kernel with it, however long it would run
        (a GPU cannot be told to stop a kernel; its process can be ended)."""
        self._cancelled = True
        if self._device.process.poll() is None:
            self._device.process.kill()

    def close(self) -> None:
        """Close the channel: the device process gives the device back and exits."""
        with self._lock:
            self._device.end(CLOSE_WAIT_S)
            for host in self._host.values():
                host.release()
            self._host.clear()


@dataclass
class _HostBuffer:
    """A client's page-locked buffer: the server's view of it, its memory file (where the
    server has one), and whether the device process maps it too."""

    view: memoryview
    file: FileDescriptor | None = None
    shown: bool = False

    @functools.cached_property
    def base(self) -> int:
        """Where the buffer is in the server's process."""
        return _address_of(self.view)

    def release(self) -> None:
        self.view.release()
        if self.file is not None:
            self.file.close()


def _foreign_event_done(owner: IsolatedBackend, event: object, wait: bool) -> bool:
    """Whether another session's event (IPC) has completed, waited for with `wait`. Its
    session's failures are not this one's: an event whose process faulted, died or ended
    has nothing left to wait for."""
    try:
        if wait:
            owner.synchronize_event(event)
            return True
        return owner.event_done(event)
    except (CudaError, Cancelled):
        return True


def _copy_from(data: memoryview) -> Callable[[memoryview, int], None]:
    """A `fill` for _through_staging: the pieces of `data`."""
    def fill(piece: memoryview, at: int) -> None:
        piece[:] = data[at:at + len(piece)]
    return fill


def _copy_into(out: memoryview) -> Callable[[memoryview, int], None]:
    """A `drain` for _through_staging: into the pieces of `out`."""
    def drain(piece: memoryview, at: int) -> None:
        out[at:at + len(piece)] = piece
    return drain


def _address_of(view: memoryview) -> int:
    """The address of a view's first byte in this process (read-only views too)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class _Spawned:
    """A device process started for backend `name`, with the server's end of its channel
    and the staging file they share."""

    def __init__(self, name: str) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        staging_fd = os.memfd_create("vgpu-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(staging_fd, STAGING_BYTES)
            self.staging = mmap.mmap(staging_fd, STAGING_BYTES)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "vgpu.server.backends.device_process",
                 str(theirs.fileno()), name, str(staging_fd), str(STAGING_BYTES)],
                pass_fds=(theirs.fileno(), staging_fd), stdin=subprocess.DEVNULL,
                env=_environment(name))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(staging_fd)
        self.socket = ours

    def end(self, patience: float = 0.0) -> None:
        """Close the channel: the process gives its device back and exits, or is killed if
        it has not within `patience` seconds (without patience, at once). A patient end is
        waited for on a thread of its own: the server goes on meanwhile."""
        self.socket.close()
        self.staging.close()
        if patience:
            reaper = threading.Thread(target=self._reap, args=(patience,), daemon=True,
                                      name="vgpu-device-process-end")
            _ending.add(reaper)
            reaper.start()
        else:
            self.process.kill()
            self.process.wait()

    def _reap(self, patience: float) -> None:
        try:
            self.process.wait(patience)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            _ending.discard(threading.current_thread())


_ending: set[threading.Thread] = set()  # threads waiting for device processes to end


def end_device_processes(patience: float) -> None:
    """The server stops: the spare device processes end, and those of sessions that ended
    are waited for a while (each gives its device back; under a driver that is a client
    itself, vgpu's own, it says goodbye to its server, which may be about to stop too)."""
    _spares.end_all()
    deadline = time.monotonic() + patience
    for reaper in list(_ending):
        reaper.join(max(0.0, deadline - time.monotonic()))


def _environment(name: str) -> dict[str, str]:
    """The server's environment, and the emulator's settings as the server has them
    (`--compile`, `--threads`)."""
    environment = dict(os.environ)
    if name == "emu":
        from ..emu import native

        environment["VGPU_EMU_COMPILE"] = "1" if native.enabled() else "0"
        environment["VGPU_EMU_THREADS"] = str(native.threads())
    return environment


class _Spares:
    """A device process started ahead for each backend, so that a new session, or one
    recovering from a fault, does not wait for a process to load its modules and driver
    (a few tenths of a second on the emulator; a GPU's driver takes longer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, _Spawned] = {}
        self._ended = False  # the server is stopping: no more spares

    def take(self, name: str) -> _Spawned:
        with self._lock:
            spare = self._ready.pop(name, None)
        if spare is not None and spare.process.poll() is not None:
            spare.end()
            spare = None
        if spare is None:
            spare = _Spawned(name)
        # The next spare starts a little later: loading its modules takes a core for a
        # few tenths of a second, which the session that starts now should have.
        replace = threading.Timer(SPARE_DELAY_S, self._replenish, args=(name,))
        replace.daemon = True
        replace.start()
        return spare

    def _replenish(self, name: str) -> None:
        with self._lock:
            if name not in self._ready and not self._ended:
                self._ready[name] = _Spawned(name)

    def end_all(self) -> None:
        with self._lock:
            spares, self._ready, self._ended = list(self._ready.values()), {}, True
        for spare in spares:
            spare.end(CLOSE_WAIT_S)


_spares = _Spares()


class _Launcher:
    """A prepared launch of the device process, called like the backend's launcher;
    `posted`: not waited for (see process_channel.Endpoint.post)."""

    def __init__(self, backend: IsolatedBackend, remote: RemoteObject, posted: bool) -> None:
        self._backend, self._remote, self._posted = backend, remote, posted

    def __call__(self, *args, **kwargs) -> tuple[str, str]:
        result = self._backend._on(self._remote.number, None, args, kwargs, self._posted)
        return ("", "") if self._posted else result
