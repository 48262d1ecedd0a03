"""Connection: the client end of the vgpu protocol, as it runs inside the application.

It queues calls whose result the application does not need yet and sends them in batches
(a round trip costs about 100 us), moves bulk data through a shared-memory staging ring when
the server is on this host, and never hangs: a server that does not answer within a bounded
time, or whose process is gone, turns into CUDA_ERROR_DEVICE_UNAVAILABLE.

A session can move without the application noticing: a server that migrated it says where
to (a redirect), and with a failover list (VGPU_SERVER="ADDR1,ADDR2,...") a session whose
server died goes on at the next address, restored from its last checkpoint there. Either
way the client says hello there with its session token and resends what the new server
lacks (vgpu.outbox keeps it), with the seqs it was waiting for.

Kept light on purpose, since it loads into every application: the standard library, pyzmq
and msgpack only.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import os
import secrets
import socket
import sys
import threading
import time
from typing import Protocol

import zmq

from . import wire
from .errors import CudaError, DeviceUnavailable
from .host_functions import HostFunctions
from .outbox import Outbox, relocate, replay_form, staged_ranges
from .processes import pid_alive
from .protocol import (
    BYE,
    CALLS,
    DEFAULT_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    HELLO,
    HOSTFN,
    KEEPALIVE_SEQ,
    MEMCHECK_MODES,
    PROTOCOL_VERSION,
    RELEASE,
    STICKY_ERRORS,
    pack,
    packer,
    unpack,
)
from .sealed_files import sealed_file
from .transport import (
    EVENTS,
    POLLIN,
    ConnectionDropped,
    TransportError,
    Watch,
    connect,
    send_within,
    wait_answer,
)

__all__ = ["Connection", "default_server_address", "STAGING_BYTES", "CHUNK_BYTES"]

STAGING_BYTES = 64 << 20  # the shared-memory ring bulk copies go through
CHUNK_BYTES = 8 << 20  # bulk copies are pipelined in chunks of this size
# Without shared memory (a server on another host), larger copies stream in chunks of this
# size, a message each, with this many device-to-host chunks asked for at once.
STREAM_CHUNK_BYTES = 2 << 20
STREAM_CHUNKS_IN_FLIGHT = 4
# Announces a streamed copy: its direction and size, which `vgpu ps` shows it against.
TRANSFER = "vgpuTransfer"
MAX_QUEUED_CALLS = 512  # a batch is sent once this many calls are waiting
# A bounded queue, as CUDA's own: every BATCHES_PER_MARK-th batch sent without a wait asks the
# server to answer once it has run it (a mark), and with MARKS_IN_FLIGHT marks unanswered
# the next one waits for the oldest. So a program that queues work faster than the device
# runs it blocks (as a launch does when CUDA's queue is full) instead of piling up calls in
# the server's memory: at most about (MARKS_IN_FLIGHT + 1) * BATCHES_PER_MARK batches.
BATCHES_PER_MARK = 8
MARKS_IN_FLIGHT = 4
INLINE_BYTES = 4096  # small copies travel inside the message; no staging needed
# With a failover list, sent data is kept until the server says a checkpoint covers it. A
# server that does not checkpoint (no --checkpoint-every) would have us keep all of it:
# past this much, the session gives up failing over rather than the application's memory.
RETAIN_LIMIT_BYTES = 2 << 30
# From this size on, a pageable copy is worth a round trip for one memcpy instead of two
# through the ring: ours, into the device allocation mapped here (server/shared_allocations),
# or else the server's, straight from or to the application's buffer (server/peer_memory).
PEER_COPY_BYTES = 1 << 20
# Calls after which device windows mapped here may be of freed allocations.
RELEASING_CALLS = frozenset({"cuMemFree", "cuCtxDestroy", "cuDevicePrimaryCtxReset"})
POLL_SLICE_MS = 100
# How long a wait for a reply looks at the socket at a time while host functions are
# queued: what it takes at most to pass on that one ran.
HOST_FUNCTION_POLL_MS = 1
# How long a client whose connection dropped tries to reconnect (the server keeps the
# session for its --reconnect-grace, 5 s by default), and how often.
RECONNECT_WINDOW_S = 10.0
RECONNECT_PAUSE_S = 0.2
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
# Ends a failover's replay of messages whose answers the application already has.
DISCARD_REPORTED = "vgpuDiscardReported"
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_READY = 600
# How long a synchronizing call polls for its reply before it sleeps in the kernel. Waking a
# sleeping thread costs tens of microseconds on an idle machine, more than a round trip's
# own work, so, like CUDA's default scheduling (spin while cores are free), we poll briefly,
# yielding the core between looks (vgpu.wire.recv).
# A context created with CU_CTX_SCHED_BLOCKING_SYNC sets it to 0; VGPU_SPIN_US overrides.
DEFAULT_SPIN_S = 100e-6


def server_addresses(text: str) -> list[str]:
    """The addresses of a VGPU_SERVER value: one, or a failover list separated by commas."""
    return [a.strip() for a in text.split(",") if a.strip()]


def default_server_address() -> str:
    """Where a client looks for a server when VGPU_SERVER does not say."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/vgpu-{os.getuid()}"
    return f"ipc://{runtime}/vgpu/server.sock"


class ManagedHooks(Protocol):
    """What the connection tells the host view of managed memory."""

    def before(self, op: str) -> None:
        """Call `op` is about to go out (the host's writes must reach the device first)."""

    def settled(self) -> None:
        """Every call sent so far has finished (the device's writes may come back)."""


class StagingRing:
    """A memory file mapped by client and server; bulk data is staged through it."""

    def __init__(self, size: int):
        # Sealed at its size, so that we cannot shrink it under the server's mapping; the
        # server maps it through this descriptor (see vgpu.sealed_files).
        self.fd: int | None = sealed_file("vgpu-ring", size)
        try:
            self.map = mmap.mmap(self.fd, size)
        except OSError:
            self.close_file()
            raise
        self.size = size
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.position = 0
        self.pending = 0  # bytes staged that the server has not confirmed consuming

    def close_file(self) -> None:
        """Close the descriptor the server maps the ring through; the mapping stays."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def take_contents(self, old: StagingRing, ranges) -> None:
        """Hold what `old` holds in `ranges` ((offset, size)), at the same offsets: messages
        being resent name them. (Only those: copying a whole ring costs tens of ms.)"""
        for offset, size in ranges:
            ctypes.memmove(self.address + offset, old.address + offset, size)
        self.position, self.pending = old.position, old.pending


class _ServerLost(Exception):
    """The server is gone or does not answer (the message says which, in words)."""


class _Redirect(Exception):
    """The server moved the session: (address, position its state covers there)."""


class _Dropped(_ServerLost):
    """The connection to the server dropped; the server may still hold the session."""


class _MoveFailed(Exception):
    """A server the session was moving to did not take it (the message says why)."""


class _NoAnswer(_MoveFailed):
    """A server the session was moving to did not answer."""


class Connection:
    """One application's session with a vgpu server."""

    def __init__(self, address: str | None = None, timeout: float | None = None):
        addresses = server_addresses(address or os.environ.get("VGPU_SERVER") or "")
        addresses = addresses or [default_server_address()]
        self.address, self._standbys = addresses[0], addresses[1:]
        # With standbys, every message is kept until a checkpoint covers it, and nothing
        # changes device memory outside a message (no device windows, no direct copies from
        # our memory): a replay on a standby could not redo it.
        self.failover = bool(self._standbys)
        self.token = secrets.token_hex(16)  # names the session across servers
        self._outbox = Outbox(retain_all=self.failover)
        self._segments: set[int] = set()  # pinned host segments the server has mapped
        self.moves: list[dict] = []  # the session's moves so far: why, where, seconds, resent
        self.timeout = timeout or float(os.environ.get("VGPU_TIMEOUT", DEFAULT_TIMEOUT_S))
        spin_us = os.environ.get("VGPU_SPIN_US")
        self.spin_s = float(spin_us) * 1e-6 if spin_us is not None else DEFAULT_SPIN_S
        self.owner_pid = os.getpid()  # a forked child must leave its parent's connection alone
        self._lock = threading.RLock()
        self._pack = packer()  # (messages are packed and sent holding the lock)
        self.lock = self._lock  # (for HostFunctions: who may use the socket)
        self.host_functions = HostFunctions(self)
        # Whether work went to a stream other than the legacy one since the last context
        # synchronization: the server runs such streams beside its answers, so an answer
        # no longer says that work is done.
        self.streams_used = False
        # The stream each thread's copies and memsets are issued on (`issued_on`), and the
        # one the calls queued so far leave the server's session in (vgpuStreamScope).
        self._scopes = threading.local()
        self._queued_scope = 0
        self._zmq = zmq.Context()
        # Each socket's watch (vgpu.transport.Watch): why a handshake failed, and for a TCP
        # socket whether its connection dropped.
        self._watches: dict[zmq.Socket, Watch] = {}
        try:
            self._socket = self._open_socket(self.address)
        except TransportError as exc:
            self._zmq.term()
            raise DeviceUnavailable(f"cannot connect to {self.address}: {exc}") from None
        self._queue: list = []
        self._frames: list = []
        self._seq = 0
        self._lost: str | None = None
        self._unconfirmed = False  # sent work the server has not answered for yet
        self._batches_unmarked = 0  # batches sent without a wait since the last mark
        self._marks: collections.deque[int] = collections.deque()  # their seqs, oldest first
        # What answered marks brought, held for the next synchronizing call: the first
        # error of queued work ([code, message]), device printf output and diagnostics,
        # which CUDA also shows at synchronization.
        self._marked_error: list | int = 0
        self._marked_output: list[str] = []
        self._marked_diagnostics: list[str] = []
        self.sticky_error = 0  # a context-breaking error the server reported, until reset
        self.stdout_writer, self.stderr_writer = _c_writers()
        self.ring: StagingRing | None = None
        self.peer_memory = False
        self.max_message: int | None = None
        # Device allocations mapped into this process: base -> (serial, map, address).
        self._windows: dict[int, tuple[int, mmap.mmap, int]] = {}
        # Whether the server shares large allocations' files (it says at hello), until the
        # kernel refuses us one: else a large copy asks for no window and costs one round trip.
        self._windows_work = False
        self.server_pid: int | None = None
        # The host view of managed memory (shim/driver/managed.py), when the program has
        # some: told before each call goes out (the host's writes go first) and after each
        # synchronization (the device's writes come back).
        self.managed: ManagedHooks | None = None
        try:
            self.info = self._first_hello()
        except _ServerLost as exc:
            self._lost = str(exc)
            self._close_socket(self._socket)
            self._zmq.term()
            raise DeviceUnavailable(self._lost) from None
        except CudaError:
            self._close_socket(self._socket)
            self._zmq.term()
            raise

    # ----------------------------------------------------------------- session

    @property
    def _socket(self) -> zmq.Socket:
        return self._sock

    @_socket.setter
    def _socket(self, sock: zmq.Socket) -> None:
        # Its libzmq handle too, for vgpu.wire's calls; a new connection is not known lost.
        self._sock, self._handle, self._broken = sock, sock.underlying, None

    def _open_socket(self, address: str) -> zmq.Socket:
        """A socket to `address`, secured as its transport needs (vgpu.transport), and its
        watch, which explains a hello nobody answers and sees a TCP connection drop."""
        # A network connection can drop, or go silent, while both ends live: heartbeats
        # close a silent one, and its watch tells us so that we reconnect.
        sock, watch = connect(self._zmq, zmq.DEALER, address, watch=True,
                              drops=address.startswith("tcp://"))
        self._watches[sock] = watch
        sock.setsockopt(zmq.RCVTIMEO, POLL_SLICE_MS)
        return sock

    def _close_socket(self, sock: zmq.Socket, linger: int = 0) -> None:
        watch = self._watches.pop(sock, None)
        if watch is not None:
            watch.close()
        sock.close(linger=linger)

    def _dropped(self) -> bool:
        """Whether the current socket's connection dropped (zmq reconnects it by itself,
        but as a new connection, which the server does not know), or took a message no more."""
        watch = self._watches.get(self._socket)
        return self._broken is not None or (watch is not None and watch.dropped())

    def _drop(self) -> _Dropped:
        return _Dropped(self._broken or f"the connection to the vgpu server at {self.address} "
                                        "dropped")

    def _first_hello(self) -> dict:
        """Open the session. If the connection drops meanwhile, say hello again as a client
        coming back: the session the first hello opened, if it arrived, is taken over with
        the staging ring it mapped; else a new one opens (without the ring, which the
        server can no longer map)."""
        deadline = time.monotonic() + RECONNECT_WINDOW_S
        resume = None
        while True:
            try:
                return self._hello(resume, reconnect=resume is not None)
            except _Dropped:
                if time.monotonic() >= deadline:
                    raise
                resume = {"position": 0, "waiting": []}
                time.sleep(RECONNECT_PAUSE_S)

    def _hello(self, resume: dict | None, staged=(), reconnect: bool = False) -> dict:
        """Open the session on the server at self.address (`resume`: None, or where a moving
        session's state stands; `staged`: what of the old ring to take along; `reconnect`:
        back to the same server, whose session, if it still has it, keeps the ring it
        mapped). Raises _ServerLost when it does not answer."""
        old = self.ring
        if not reconnect:
            try:  # only a server behind a local socket maps our files (server/client_files)
                local = self.address.startswith("ipc://")
                self.ring = StagingRing(STAGING_BYTES) if local else None
            except OSError:
                self.ring = None  # no memory file: bulk data goes inline
            if old is not None and self.ring is not None:
                self.ring.take_contents(old, staged)
        # Bytes the server may read back from our memory to learn whether it can copy
        # straight from application buffers (see vgpu.server.peer_memory).
        probe = ctypes.create_string_buffer(secrets.token_bytes(16), 16)
        offered = self.ring if not reconnect else None
        body = {
            "version": PROTOCOL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
            "argv": _command_line(),
            "shm": {"fd": offered.fd, "size": offered.size} if offered else None,
            "probe": [ctypes.addressof(probe), probe.raw] if not reconnect else None,
            "memcheck": _memcheck_mode(),
            "token": self.token,
            "resume": resume,
        }
        self._seq = seq = self._seq + 1
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        try:
            # Not a blocking send: a socket whose handshake was already refused (while a
            # hello said again after a drop waited) takes nothing, ever (vgpu.transport).
            watch = self._watches.get(self._socket)
            if not (send_within(self._socket, watch, [self._pack([HELLO, seq, body])],
                                HANDSHAKE_TIMEOUT_S)
                    and wait_answer(self._socket, watch, deadline - time.monotonic())):
                raise _ServerLost((watch and watch.refusal(final=True))
                                  or f"no answer from the vgpu server at {self.address} "
                                     f"within {HANDSHAKE_TIMEOUT_S:g} s")
            code, info = self._receive(seq, HANDSHAKE_TIMEOUT_S)[:2]
        except _Redirect:
            raise _ServerLost(f"the vgpu server at {self.address} redirected the session "
                              "before it was open") from None
        except ConnectionDropped:  # the hello may be lost: say it again, on the new one
            raise _Dropped(f"the connection to the vgpu server at {self.address} dropped "
                           "during the handshake") from None
        except TransportError as exc:  # a refused handshake: say what it was
            raise _ServerLost(str(exc)) from None
        finally:
            if offered:
                offered.close_file()  # both ends have mapped it (or never will)
        if code:
            raise CudaError(code, f"the vgpu server at {self.address} refused the session: {info}")
        self.server_pid = info["server_pid"] if info["host"] == socket.gethostname() else None
        if not info["shm"]:
            self.ring = None
        self.peer_memory = bool(info.get("peer_memory")) and not self.failover
        self._windows_work = bool(info.get("device_windows")) and not self.failover
        # The largest message part the server takes: a larger one would cost us the
        # connection, so it is refused here, with a reason.
        self.max_message = info.get("max_message") or None
        return info

    def _move(self, address: str, position: int, why: str, reconnect: bool = False) -> None:
        """Take the session to the server at `address`, whose state for it covers (or, when
        it says so at hello, covers instead) the first `position` messages, and resend the
        messages after that (`reconnect`: to the server it was on, over a new connection).
        Raises _MoveFailed when that server does not take it."""
        if self._segments and not reconnect:
            self._lose(f"the session cannot move to {address} ({why}): it has pinned host "
                       "memory mapped into the server (cuMemHostAlloc, cuMemHostRegister), "
                       "which cannot move to another server yet")
        started = time.perf_counter()
        old_socket, old_ring, old_address = self._socket, self.ring, self.address
        old_broken = self._broken
        old_pid, self.server_pid = self.server_pid, None  # not the new server's
        self._forget_windows(None)  # they map the old server's memory
        try:
            self._socket, self.address = self._open_socket(address), address
        except TransportError as exc:
            self._socket, self.server_pid, self._broken = old_socket, old_pid, old_broken
            raise _MoveFailed(f"{address}: {exc}") from None
        try:
            resume = {"position": position}
            if reconnect:  # the replies awaited: the server sends them again
                resume["waiting"] = self._outbox.waiting()
            info = self._hello(resume,
                               [*self._outbox.staged(), *staged_ranges(self._queue)],
                               reconnect)
            resumed = info.get("position")
            if (not isinstance(resumed, int) or resumed < self._outbox.oldest - 1
                    or resumed > self._outbox.position):
                raise _MoveFailed(
                    f"it resumed the session at message {resumed!r}, but this client has sent "
                    f"{self._outbox.position} and holds messages {self._outbox.oldest} on")
        except (_ServerLost, CudaError, _MoveFailed) as exc:
            if not isinstance(exc, _ServerLost):  # it answered: let go of what it opened
                self._transmit(BYE, 0, None, [])
            self._close_socket(self._socket, linger=100)
            self._socket, self.ring, self.address = old_socket, old_ring, old_address
            self.server_pid, self._broken = old_pid, old_broken
            failure = _NoAnswer if isinstance(exc, _ServerLost) else _MoveFailed
            raise failure(f"{address}: {exc}") from None
        self.info = info
        ring_map = old_ring.map if old_ring is not None else None
        resent = self._outbox.after(resumed)
        # The application has heard everything up to the last answered message: the errors
        # and device output that replaying those messages produce again are dropped there.
        last_answered = max((i for i, e in enumerate(resent) if e.answered), default=None)
        for i, entry in enumerate(resent):
            seq, calls, frames = replay_form(entry, ring_map, self.ring is not None,
                                             self.peer_memory)
            if i == last_answered:
                calls = [*calls, (DISCARD_REPORTED, ())]
            self._transmit(CALLS, seq, calls, frames)
        if self._queue and old_ring is not None and self.ring is None:
            self._queue, self._frames = relocate(self._queue, self._frames, ring_map,
                                                 False, self.peer_memory)
        self._outbox.forget_waits()
        self._close_socket(old_socket)
        if old_ring is not None and old_ring is not self.ring:
            old_ring.map.close()
        self.moves.append({"why": why, "to": address, "position": resumed,
                           "resent": len(resent), "seconds": time.perf_counter() - started})
        if os.environ.get("VGPU_TRACE"):
            _write_fd(2, f"vgpu trace: session moved to {address} ({why}) at message "
                         f"{resumed}, {len(resent)} resent, in "
                         f"{self.moves[-1]['seconds'] * 1e3:.1f} ms\n".encode())

    def _fail_over(self, why: str) -> None:
        """The server is gone (`why`): go on at the next standby that takes the session."""
        if not self._standbys:
            self._lose(why)
        refusals = []
        while self._standbys:
            address = self._standbys.pop(0)
            try:
                self._move(address, self._outbox.oldest - 1, "failover")
            except _MoveFailed as exc:
                refusals.append(str(exc))
                continue
            move = self.moves[-1]
            self.stderr_writer(f"vgpu: {why}; the session goes on at {address}, restored at "
                               f"message {move['position']} ({move['resent']} replayed)\n")
            return
        self._lose(f"{why}; no standby server took the session over ({'; '.join(refusals)})")

    def _lose(self, why: str):
        """The device is gone for good: this call and every later one fail with `why`."""
        self._lost = why
        raise DeviceUnavailable(why)

    @property
    def shares_host_memory(self) -> bool:
        """Whether pinned host memory may live in segments the server maps: only for a server
        on this host, and not with standbys (a segment's contents change outside any message,
        so no replay could restore them, and segments cannot move to another server yet)."""
        return self.ring is not None and not self.failover

    def __del__(self) -> None:
        # A connection nobody holds says goodbye; one a forked child inherited is its
        # parent's. (No atexit hook: CUDA must work in exit hooks registered before it
        # started; vgpu.shim.driver closes its connection after them.)
        if "_lost" in self.__dict__ and self.owner_pid == os.getpid():
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._lost is None:
                try:
                    self._socket.send_multipart([pack([BYE, 0, None])], flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
                self._lost = "the connection was closed"
            if not self._zmq.closed:
                self._close_socket(self._socket, linger=100)
                self._zmq.term()

    # ----------------------------------------------------------------- calls

    def post(self, op: str, *args) -> None:
        """Queue a call whose result nobody waits for; its error surfaces at the next sync."""
        with self._lock:
            if self.managed is not None:
                self.managed.before(op)
            self._rescope()
            self._queue.append((op, args))
            if op in RELEASING_CALLS and self._windows:
                self._forget_windows(args[0] if op == "cuMemFree" else None)
            if len(self._queue) >= MAX_QUEUED_CALLS:
                self._flush()

    def call(self, op: str, *args) -> tuple[object, list]:
        """Run a call now (after everything queued); returns (result, reply payload frames).

        Raises CudaError with the call's own code, or with the first error of queued work.
        """
        with self._lock:
            if self.managed is not None:
                self.managed.before(op)
            self._rescope()
            self._queue.append((op, args))
            if op == "vgpuUnmapHostSegment":
                self._segments.discard(args[0])
            reply = self._finish(self._round_trip())
            if op == "vgpuMapHostSegment":
                self._segments.add(args[0])
            return reply

    @contextlib.contextmanager
    def issued_on(self, stream: int):
        """The copies and memsets this thread makes inside are issued on `stream`: the
        server runs each after the work queued before it on that stream (and on no other).

        The server's session has one scope (vgpuStreamScope) for every thread of the
        program, which share this connection. A scope, its copy and the scope's end posted
        one by one let another thread's scope in between, and the copy then waited for
        the other stream's work, reading memory the kernels on its own stream had not
        written yet. So the scope is the thread's, and every call is queued after a
        vgpuStreamScope naming its thread's scope wherever the calls before it leave the
        session in another (each call queues its scope itself, see _rescope: back-to-back
        copies on one stream send it once)."""
        outer = getattr(self._scopes, "stream", 0)
        self._scopes.stream = stream
        try:
            yield
        finally:
            self._scopes.stream = outer

    def _rescope(self) -> None:
        """Queue vgpuStreamScope for the calling thread's scope if the calls queued so far
        leave the session in another (the lock is held)."""
        stream = getattr(self._scopes, "stream", 0)
        if stream != self._queued_scope:
            self._queue.append(("vgpuStreamScope", (stream,)))
            self._queued_scope = stream

    def synchronize(self, kind: str = "context", handle: int = 0, ask: bool = False) -> None:
        """Wait for the work sent so far: all of it (cuCtxSynchronize and kin), or a
        stream's, or up to an event's record (`kind` "stream" or "event", and its handle).

        When everything sent has already been answered for, nothing is queued and no
        stream ran beside the answers, there is nothing to wait for: no round trip, unless
        `ask` (another process's work is waited for: an event opened through IPC). A
        sticky error the server reported keeps being returned, as CUDA does.
        """
        with self._lock:
            if self._queue or self._unconfirmed or self.streams_used or ask:
                if kind == "context":
                    self.call("vgpuSynchronize")
                    self.streams_used = False
                else:
                    self.call("vgpuSynchronize", kind, handle)
            elif self.sticky_error:
                raise CudaError(self.sticky_error, "the context has a sticky error")
            if self.managed is not None:
                self.managed.settled()

    def query(self, kind: str = "context", handle: int = 0, ask: bool = False) -> bool:
        """Has the work sent so far finished (cuStreamQuery, cuEventQuery: see
        `synchronize`)? Never waits for the work itself: the server answers at once, from
        its I/O thread."""
        with self._lock:
            if not (self._queue or self._unconfirmed or self.streams_used or ask):
                if self.sticky_error:
                    raise CudaError(self.sticky_error, "the context has a sticky error")
                if self.managed is not None:
                    self.managed.settled()
                return True
            self._queue.append(("vgpuQuery", () if kind == "context" else (kind, handle)))
            reply = self._round_trip()
            try:  # "not ready" is answered ahead of the work it is about: it confirms nothing
                self._finish(reply, confirms=reply[0] != CUDA_ERROR_NOT_READY)
            except CudaError as exc:
                if exc.code != CUDA_ERROR_NOT_READY:
                    raise
                # The work sent with the query is still to run: the next query asks the
                # server again (CuPy reuses a pinned staging buffer once its copy's event
                # is done; an early "done" let the copy read the buffer's next contents).
                self._unconfirmed = True
                return False
            if self.managed is not None:
                self.managed.settled()
            return True

    def frame(self, payload) -> list:
        """A reference to `payload` sent as a raw frame with the next message."""
        if self.max_message is not None and len(payload) > self.max_message:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{len(payload)} bytes in one message is more than the vgpu "
                            f"server at {self.address} accepts ({self.max_message})")
        self._frames.append(payload)
        return ["frame", len(self._frames) - 1]

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self, want_reply: bool = False) -> int:
        if not self._queue:
            return 0
        calls, frames = self._queue, self._frames
        self._queue, self._frames = [], []
        if want_reply:
            return self._send(CALLS, calls, frames)
        self._batches_unmarked += 1
        if self._batches_unmarked < BATCHES_PER_MARK:
            return self._send(CALLS, calls, frames, want_reply=False)
        self._batches_unmarked = 0
        if len(self._marks) >= MARKS_IN_FLIGHT:  # the queue is full: wait for the device
            self._take_mark(self._wait(self._marks[0], self.timeout))
        self._marks.append(self._send(CALLS, calls, frames))
        self._unconfirmed = True
        return 0

    def _round_trip(self) -> list:
        """Send the queued calls as one message and return its reply (see _wait).

        Every synchronous call comes here, and on loaded cores each step of Python costs it
        microseconds (caches go cold while the thread waits), so the usual case takes few
        steps: a message without payloads whose reply is the next message to arrive. The
        outbox takes it only if something else came first (at the position it had: nothing
        else went out meanwhile, the lock being held), or else as answered at once."""
        if self._lost:
            raise DeviceUnavailable(self._lost)
        calls, frames = self._queue, self._frames
        self._queue, self._frames = [], []
        if frames or self.failover or self.host_functions.outstanding:
            return self._wait(self._send(CALLS, calls, frames), self.timeout)
        self._seq = seq = self._seq + 1
        message = self._pack([CALLS, seq, calls])
        sent = self._broken is None and (wire.send(self._handle, message)
                                         or self._send_within([message]))
        try:
            got = wire.recv(self._handle, 1, self.spin_s, None) if sent else None
        except BaseException:  # (a signal handler's exception): the message went out
            self._outbox.sent(seq, calls, frames)
            raise
        if got is not None and not got[1]:
            reply = unpack(got[0])
            # ("No session" may come from a connection zmq opened again by itself: _take
            # looks into that.)
            if reply[0] == seq and reply[1] != CUDA_ERROR_DEVICE_UNAVAILABLE:
                self._outbox.sent_answered(seq, calls, reply[1])
                return [*reply[1:], []]
        self._outbox.sent(seq, calls, frames)
        return self._wait(seq, self.timeout, got)

    def _take_mark(self, reply: list) -> None:
        """An answered mark: its batch and everything before it has run."""
        self._marks.popleft()
        code, result, deferred, output, diagnostics, _ = reply
        if output:
            self._marked_output.append(output)
        if diagnostics:
            self._marked_diagnostics.append(diagnostics)
        if not self._marked_error and (deferred or code):
            self._marked_error = deferred or [code, result if isinstance(result, str) else ""]

    def _send(self, kind: str, body, frames: list, want_reply: bool = True) -> int:
        if self._lost:
            raise DeviceUnavailable(self._lost)
        seq = 0
        if want_reply:
            self._seq = seq = self._seq + 1
        else:
            self._unconfirmed = True
        self._transmit(kind, seq, body, frames)
        if kind == CALLS:
            self._outbox.sent(seq, body, frames, self.ring.map if self.ring else None)
            if self.failover and self._outbox.retained_bytes > RETAIN_LIMIT_BYTES:
                self._stop_failing_over()
        return seq

    def _stop_failing_over(self) -> None:
        self.stderr_writer(
            f"vgpu: {self._outbox.retained_bytes >> 20} MiB of work sent to {self.address} "
            f"awaits a checkpoint there (does it run with --checkpoint-dir and "
            f"--checkpoint-every?); this session will not fail over to "
            f"{', '.join(self._standbys)}\n")
        self._outbox.stop_retaining()
        self.failover, self._standbys = False, []

    def _transmit(self, kind: str, seq: int, body, frames: list) -> None:
        """Send a message on the current connection, unless that is taken for lost (see
        _send_within): then the message is lost with it, as on one that dropped."""
        if self._broken is not None:
            return
        header = self._pack([kind, seq, body])
        if frames:  # bulk payloads go zero-copy; the header is small and cheaper copied
            self._send_within([header, *frames], copy=False)
        elif not wire.send(self._handle, header):
            self._send_within([header])

    def _send_within(self, parts: list, copy: bool = True) -> bool:
        """Send a message the socket did not take at once, waiting for it with a bound; False
        if it did not. A socket that takes nothing for that long, or whose connection
        dropped or was refused meanwhile (libzmq gives up for good a connection whose
        handshake failed as a protocol error: the server restarted with another key, or a
        middlebox garbled its greeting), has its connection taken for lost (_broken): the
        message goes again, from the outbox, once the next wait for a reply reconnects."""
        try:
            if send_within(self._socket, self._watches.get(self._socket), parts,
                           self.timeout, copy=copy):
                return True
            self._broken = (f"the vgpu server at {self.address} took no message within "
                            f"{self.timeout:g} s")
        except ConnectionDropped:
            self._broken = f"the connection to the vgpu server at {self.address} dropped"
        except TransportError as exc:
            self._broken = (f"the server at {self.address} refused this client's handshake "
                            f"when it connected again: {exc}")
        return False

    def answer_host_function(self, gate: int) -> None:
        """The host function of `gate` ran (the lock is held): its stream goes on (not a
        CALLS message: the server handles it on arrival, whatever it is running)."""
        if not self._lost:
            self._transmit(HOSTFN, 0, gate, [])

    def take_notices(self) -> None:
        """Take the messages that wait on the socket, without waiting (the lock is held,
        and nobody waits for a reply: see HostFunctions)."""
        while not self._lost and self._socket.get(EVENTS) & POLLIN:
            frames = self._receive_frames()
            if frames is None:  # a signal came first (its handler ran)
                return
            self._take(frames, None)

    def _release_window(self) -> None:
        """Done copying through a device window: a migration waits for that (not a CALLS
        message: it has no position, and the server handles it on arrival)."""
        if not self._lost:
            self._transmit(RELEASE, 0, None, [])

    def _wait(self, seq: int, timeout: float, got: tuple | None = None) -> list:
        """The reply to `seq`, wherever the session goes meanwhile (`got`: a message already
        received, as vgpu.wire.recv returns it, to take first)."""
        while True:
            try:
                first, got = got, None
                return self._receive(seq, timeout, first)
            except _Redirect as redirect:
                address, position = redirect.args
                try:
                    self._move(address, position, "redirect")
                except _MoveFailed as exc:
                    self._fail_over(f"the session could not move to {exc}")
            except _Dropped as exc:
                self._reconnect(str(exc))
            except _ServerLost as exc:
                self._fail_over(str(exc))

    def _reconnect(self, why: str) -> None:
        """The connection dropped (`why`): go on with the session on a new connection to
        the same server, which keeps it for a grace period; else fail over or give up."""
        deadline = time.monotonic() + RECONNECT_WINDOW_S
        server_pid = self.server_pid
        while True:
            try:
                self._move(self.address, self._outbox.oldest - 1, "reconnect", reconnect=True)
                return
            except _MoveFailed as exc:
                # A server that answers without the session will not find it later, and
                # one whose process is gone will not answer.
                gone = server_pid is not None and not pid_alive(server_pid)
                if not isinstance(exc, _NoAnswer) or gone or time.monotonic() >= deadline:
                    self._fail_over(f"{why}, and reconnecting failed: {exc}")
                    return
                time.sleep(RECONNECT_PAUSE_S)

    def _receive(self, seq: int, timeout: float, got: tuple | None = None) -> list:
        """The reply to `seq` from the current server (`got`: a message already received,
        taken first); raises _Redirect for a redirect notice, _ServerLost when the server is
        gone or silent for `timeout`."""
        if got is not None:
            reply = self._take(self._frames_of(got), seq)
            if reply is not None:
                return reply
        deadline = time.monotonic() + timeout
        # The first receive spins (asking the socket, in C without the GIL) before it
        # sleeps: see DEFAULT_SPIN_S.
        spin_s = self.spin_s
        sock = self._socket
        # Host functions queued (no other can be while we hold the lock) may finish while
        # we wait: their answers cannot wait for the receive's time slice.
        host_functions = self.host_functions if self.host_functions.outstanding else None
        while True:
            if self._broken is not None:  # a message of ours was lost with the connection
                raise self._drop()
            if host_functions is not None:
                host_functions.send_answers()
                if not sock.poll(HOST_FUNCTION_POLL_MS):
                    if time.monotonic() > deadline:
                        raise _ServerLost(f"no answer from the vgpu server at "
                                          f"{self.address} within {timeout:g} s")
                    continue
                spin_s = 0.0
            # Blocks at most RCVTIMEO: one call into zmq per reply, no separate poll.
            got = wire.recv(self._handle, 1, spin_s, None)
            spin_s = 0.0
            if got is None:
                if self.server_pid is not None and not pid_alive(self.server_pid):
                    raise _ServerLost(f"the vgpu server (pid {self.server_pid}) at "
                                      f"{self.address} is gone")
                if self._dropped():
                    raise self._drop()
                if time.monotonic() > deadline:
                    raise _ServerLost(f"no answer from the vgpu server at {self.address} "
                                      f"within {timeout:g} s")
                continue
            reply = self._take(self._frames_of(got), seq)
            if reply is not None:
                return reply
            # The server is alive: a keepalive (it is still running our calls), a notice, a
            # mark's answer, or one to a request abandoned after a timeout.
            deadline = time.monotonic() + timeout

    def _receive_frames(self) -> list | None:
        """One message's parts, or None if none came within the socket's RCVTIMEO."""
        got = wire.recv(self._handle, 1, 0.0, None)
        return None if got is None else self._frames_of(got)

    def _frames_of(self, got: tuple) -> list:
        """A message whose header vgpu.wire received (`got`: header, more, origin), with
        its payloads, rare in replies, read through pyzmq as frames (whose `more` costs a
        tenth of asking the socket)."""
        if not got[1]:
            return [got[0]]
        frames, more = [got[0]], got[1]
        while more:
            part = self._socket.recv(copy=False)
            frames.append(part.bytes)
            more = part.more
        return frames

    def _take(self, frames: list, seq: int | None) -> list | None:
        """A message from the server: the reply to `seq`, returned; or one taken here (a
        notice, a mark's answer), None."""
        reply = unpack(frames[0])
        if reply[1] == CUDA_ERROR_DEVICE_UNAVAILABLE and reply[0] and self._dropped():
            # Sent after the drop, on the connection zmq opened again by itself: the
            # server does not know it, and answered "no session". Resent after the
            # reconnect.
            raise self._drop()
        if reply[0] != KEEPALIVE_SEQ:
            self._outbox.answered(reply[0], reply[1])
        if reply[0] == seq:
            return [*reply[1:], frames[1:]]
        if reply[0] == KEEPALIVE_SEQ:
            if reply[1]:  # the server is going away, and why
                raise _ServerLost(f"{reply[2]} ({self.address})")
            notice = reply[2]
            if isinstance(notice, dict):
                if "redirect" in notice:
                    raise _Redirect(str(notice["redirect"]), int(notice["position"]))
                if "checkpointed" in notice:
                    self._outbox.checkpointed(int(notice["checkpointed"]))
                if "host_functions" in notice:
                    self.host_functions.arrived(notice["host_functions"])
        if self._marks and reply[0] == self._marks[0]:
            self._take_mark([*reply[1:], frames[1:]])
        return None

    def _finish(self, reply: list, confirms: bool = True) -> tuple[object, list]:
        """Take a synchronizing call's reply. It `confirms` that everything sent before has
        run (replies come in order), except for a query the server answered early."""
        code, result, deferred, output, diagnostics, frames = reply
        if confirms:
            self._unconfirmed = False
            if self.ring:
                self.ring.pending = 0
        if self._marked_output:
            output = "".join(self._marked_output) + (output or "")
            self._marked_output.clear()
        if self._marked_diagnostics:
            diagnostics = "".join(self._marked_diagnostics) + (diagnostics or "")
            self._marked_diagnostics.clear()
        if output:
            self.stdout_writer(output)
        if diagnostics:  # after the device's printf output, as CUDA prints assert lines
            self.stderr_writer(diagnostics)
        if self._marked_error:
            deferred, self._marked_error = self._marked_error, 0
        if deferred:
            deferred_code, message = deferred
            if deferred_code in STICKY_ERRORS:
                self.sticky_error = deferred_code
            raise CudaError(deferred_code, message or "an earlier queued call failed")
        if code:
            if code in STICKY_ERRORS:
                self.sticky_error = code
            raise CudaError(code, result if isinstance(result, str) else "")
        return result, frames

    # ----------------------------------------------------------------- bulk data

    def write_device(self, op: str, dst: int, src: int, size: int, *extra) -> None:
        """Copy host memory at address `src` to the device at `dst` (cuMemcpyHtoD and kin).

        Returns once the host buffer may be reused: the data is staged (or sent), not
        necessarily applied. Large copies go in chunks so client and server copy in parallel.
        """
        with self._lock:
            if self.managed is not None:
                self.managed.before(op)
            self._rescope()
            if self.ring is None and size > self._stream_chunk_bytes():
                self._stream_to_device(op, dst, src, size, extra)
                return
            if size <= INLINE_BYTES or self.ring is None:
                spec = ["inline", ctypes.string_at(src, size)] if size <= INLINE_BYTES else \
                    self.frame(ctypes.string_at(src, size))
                self._queue.append([op, (dst, spec, size, *extra)])
                return
            if self.peer_memory and size >= PEER_COPY_BYTES:
                window = self._device_window(dst, size)
                if window is not None:
                    try:
                        ctypes.memmove(window, src, size)
                    finally:
                        self._release_window()
                    return
                if self.peer_memory:  # still: the session may have moved meanwhile
                    self._queue.append([op, (dst, ["peer", src], size, *extra)])
                    self._finish(self._round_trip())
                    return
            for offset in range(0, size, CHUNK_BYTES):
                n = min(CHUNK_BYTES, size - offset)
                slot = self._stage(n)
                if slot is None:  # no ring any more: the session moved to another host
                    spec = self.frame(ctypes.string_at(src + offset, n))
                else:
                    ctypes.memmove(self.ring.address + slot, src + offset, n)
                    spec = ["shm", slot]
                self._queue.append([op, (dst + offset, spec, n, *extra)])
                self._flush()  # start the server on this chunk while we stage the next

    def _stream_to_device(self, op: str, dst: int, src: int, size: int, extra) -> None:
        """A large copy to a server without shared memory: chunks sent as they go, each a
        message of its own, so the network carries one while the server writes the last.
        They go without a copy, straight from the application's buffer (zmq reads it as it
        sends), so the copy returns once the server has them all: until then the buffer
        must stay as it is, and the messages a reconnect resends come from it too. With
        standbys, whose replays may come much later, the chunks are copies."""
        self._queue.append((TRANSFER, ("HtoD", size)))
        chunk = self._stream_chunk_bytes()
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            data = ctypes.string_at(src + offset, n) if self.failover else \
                memoryview((ctypes.c_char * n).from_address(src + offset)).cast("B")
            self._queue.append([op, (dst + offset, self.frame(data), n, *extra)])
            if offset + n < size:
                self._flush()
        self._finish(self._round_trip())

    def _stream_from_device(self, op: str, src: int, dst: int, size: int, extra) -> None:
        """A large copy from a server without shared memory: chunks asked for a few at a
        time, so the server reads the next while the network carries the last."""
        self._queue.append((TRANSFER, ("DtoH", size)))
        in_flight: collections.deque[tuple[int, int, int]] = collections.deque()
        chunk = self._stream_chunk_bytes()
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            self._queue.append([op, (src + offset, n, ["frame"], *extra)])
            in_flight.append((self._flush(want_reply=True), offset, n))
            if len(in_flight) == STREAM_CHUNKS_IN_FLIGHT:
                self._take_chunk(in_flight.popleft(), dst)
        while in_flight:
            self._take_chunk(in_flight.popleft(), dst)

    def _stream_chunk_bytes(self) -> int:
        """A streamed copy's chunk: no larger than the server takes in one message."""
        return min(STREAM_CHUNK_BYTES, self.max_message or STREAM_CHUNK_BYTES)

    def _take_chunk(self, chunk: tuple[int, int, int], dst: int) -> None:
        seq, offset, n = chunk
        _, frames = self._finish(self._wait(seq, self.timeout))
        ctypes.memmove(dst + offset, frames[0] if frames else b"", n)

    def _stage(self, n: int) -> int | None:
        """Where in the ring to stage `n` bytes (waiting for the server to consume what is
        there if need be); None without a ring."""
        ring = self.ring
        if ring is None:
            return None
        if ring.position + n > ring.size:
            ring.pending += ring.size - ring.position  # the unused tail, until it wraps back
            ring.position = 0
        if ring.pending + n > ring.size:
            self._queue.append(["vgpuSynchronize", ()])
            self._finish(self._round_trip())
            ring = self.ring  # the session may have moved meanwhile
            if ring is None:
                return None
        slot = ring.position
        ring.position += n
        ring.pending += n
        return slot

    def read_device(self, op: str, src: int, dst: int, size: int, *extra) -> None:
        """Copy device memory at `src` into host memory at address `dst` (waits for it).

        Wherever the data was to land, a reply that carries it in a frame wins: a copy the
        new server of a moved session could not do that way comes back so."""
        with self._lock:
            if self.managed is not None:
                self.managed.before(op)
            self._rescope()
            if self.ring is None and size > self._stream_chunk_bytes():
                self._stream_from_device(op, src, dst, size, extra)
                return
            if self.ring is None or size <= INLINE_BYTES:
                self._queue.append([op, (src, size, ["frame"], *extra)])
                _, frames = self._finish(self._round_trip())
                ctypes.memmove(dst, frames[0] if frames else b"", size)
                return
            if self.peer_memory and size >= PEER_COPY_BYTES:
                window = self._device_window(src, size)
                if window is not None:
                    try:
                        ctypes.memmove(dst, window, size)
                    finally:
                        self._release_window()
                    return
                spec = ["peer", dst] if self.peer_memory else ["frame"]
                self._queue.append([op, (src, size, spec, *extra)])
                _, frames = self._finish(self._round_trip())
                if frames:
                    ctypes.memmove(dst, frames[0], size)
                return
            # Two chunks in flight: the server fills one half of the ring while we drain the
            # other. Everything queued earlier runs first, so the whole ring is free to use.
            half = min(CHUNK_BYTES, self.ring.size // 2)
            in_flight: list[tuple[int, int, int, int]] = []
            for i, offset in enumerate(range(0, size, half)):
                n = min(half, size - offset)
                slot = (i % 2) * half
                if len(in_flight) == 2:  # this slot still holds chunk i-2: drain it first
                    self._drain(in_flight.pop(0), dst)
                spec = ["shm", slot] if self.ring is not None else ["frame"]
                self._queue.append([op, (src + offset, n, spec, *extra)])
                in_flight.append((self._flush(want_reply=True), offset, n, slot))
            for chunk in in_flight:
                self._drain(chunk, dst)

    def _device_window(self, address: int, size: int) -> int | None:
        """Where device memory [address, +size) is mapped in this process, once the work
        queued before has run (a round trip); None where the server does not share it.
        A window granted is the caller's to release (_release_window) once it has copied:
        until then the server cannot take the session's state (a checkpoint, a move)."""
        if not self._windows_work:
            return None
        self._queue.append(["vgpuDeviceWindow", (address, size)])
        reply = self._round_trip()
        try:
            window, _ = self._finish(reply)
        except CudaError:
            if reply[0] == 0 and reply[1] is not None:  # granted, but queued work failed
                self._release_window()
            raise
        if window is None:
            return None
        pid, fd, serial, inode, base, length = window
        mapped = self._windows.get(base)
        if mapped is None or mapped[0] != serial:  # new, or the same place reallocated
            self._forget_windows(base)
            try:
                mapped = (serial, *_map_server_file(pid, fd, inode, length))
            except (OSError, ValueError):  # not allowed to open it: the server copies
                self._windows_work = False
                self._release_window()
                return None
            self._windows[base] = mapped
        return mapped[2] + (address - base)

    def _forget_windows(self, base: int | None) -> None:
        """Unmap the window of the allocation at `base` (freed), or every one (None)."""
        for key in [base] if base is not None else list(self._windows):
            mapped = self._windows.pop(key, None)
            if mapped is not None:
                mapped[1].close()

    def _drain(self, chunk: tuple[int, int, int, int], dst: int) -> None:
        seq, offset, n, slot = chunk
        _, frames = self._finish(self._wait(seq, self.timeout))
        ctypes.memmove(dst + offset, frames[0] if frames else self.ring.address + slot, n)


def _map_server_file(pid: int, fd: int, inode: int, length: int) -> tuple[mmap.mmap, int]:
    """Map a file the server holds open (the kernel checks we may ptrace it), if it is the
    one the server means."""
    own = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR | os.O_CLOEXEC)
    try:
        found = os.fstat(own)
        if found.st_ino != inode or found.st_size != length:
            raise ValueError(f"/proc/{pid}/fd/{fd} is not the server's device memory")
        mapped = mmap.mmap(own, int(length))
    finally:
        os.close(own)
    return mapped, ctypes.addressof(ctypes.c_char.from_buffer(mapped))


def _c_writers():
    """(stdout writer, stderr writer). Device printf goes through C stdio's stdout, in order
    with the program's own printf; diagnostics go to file descriptor 2 (where C's unbuffered
    stderr writes too) once C's stdout is flushed, so they follow the output they are about."""
    try:
        libc = ctypes.CDLL(None)
        stdout = ctypes.c_void_p.in_dll(libc, "stdout")
        fwrite = libc.fwrite
        fwrite.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
        fflush = libc.fflush
        fflush.argtypes = [ctypes.c_void_p]

        def write(text: str) -> None:
            data = text.encode()
            fwrite(data, 1, len(data), stdout)

        def write_error(text: str) -> None:
            fflush(stdout)
            _write_fd(2, text.encode())

        return write, write_error
    except (OSError, ValueError, AttributeError):
        return (lambda text: (sys.stdout.write(text), sys.stdout.flush()),
                lambda text: (sys.stdout.flush(), _write_fd(2, text.encode())))


def _write_fd(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:  # a closed stderr: nothing to tell the user through
            return


def _memcheck_mode() -> str | None:
    """The application's VGPU_MEMCHECK, checked; None leaves the choice to the server."""
    mode = os.environ.get("VGPU_MEMCHECK", "").strip().lower()
    if not mode:
        return None
    if mode not in MEMCHECK_MODES:
        _write_fd(2, f"vgpu: VGPU_MEMCHECK={mode!r} is not one of {', '.join(MEMCHECK_MODES)}; "
                     f"the server's setting applies\n".encode())
        return None
    return mode


def _command_line() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)
