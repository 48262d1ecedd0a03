"""ProxyServer: owns the device, serves every client session over one zmq ROUTER socket.

One thread, one socket: messages from all clients are handled in arrival order, each against
its own Session. A client that sends garbage gets an error (or nothing, if its header does
not even decode into a seq to answer to) and the others keep being served; a client that
exits says BYE, and one that crashes is noticed by a periodic check of its pid (clients on
this host) and its session is released.
A session that ends stops its running kernel at once (see worker.py).

Admin requests (`vgpu ps`, checkpoint, suspend, resume, migrate, and sessions handed over
by another server) are in admin.py; the operations that move a session's state run on
threads of their own (moves.py) and reach the I/O thread through `call_soon`.

`stop()` (what SIGTERM and SIGINT call) ends serve_forever: every client is told that the
server is shutting down, every kernel is cancelled, and the process can exit within a second
or two, whatever its kernels were doing.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import socket
import sys
import time
import traceback

import zmq

from vgpu import wire
from vgpu.errors import CudaError
from vgpu.processes import pid_alive
from vgpu.protocol import (
    ADMIN,
    BYE,
    CALLS,
    HELLO,
    HOSTFN,
    KEEPALIVE_SEQ,
    PROTOCOL_VERSION,
    RELEASE,
    ProtocolError,
    pack,
    packer,
    unpack,
)

from .admin import AdminMixin
from .arena import VaArena
from .backends import open_backend, resolve_backend
from .backends.isolated import end_device_processes
from .bell import Bell
from .connections import DEFAULT_RECONNECT_GRACE_S, ConnectionsMixin
from .ipc import IpcRegistry
from .peers import Access, Peer, peer_of
from .quotas import MemoryQuotas
from .recorder import SessionRecorder
from .session import Session
from .transfers import Transfers
from .worker import INLINE_CALLS, LONG_CALLS, Outcome, SessionWorker, run_batch

__all__ = ["ProxyServer", "ARENA_BASE", "ARENA_SPAN"]

log = logging.getLogger("vgpu.server")

# Session arenas live between 16 TiB and 80 TiB of the address space, away from where Linux
# places executables (low), heaps (0x55...) and mmaps (0x7f...), one TiB per session slot.
ARENA_BASE = 0x1000_0000_0000
ARENA_SPAN = 1 << 40
ARENA_SLOTS = 64
# The most devices a server offers (`--devices`): enough for any multi-GPU test or machine.
MAX_DEVICES = 16
LIVENESS_INTERVAL_S = 0.5
QUERY = "vgpuQuery"
# How every CALLS message's header starts in msgpack: an array of 3 ([kind, seq, body]),
# then the kind.
CALLS_PREFIX = b"\x93" + pack(CALLS)
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NOT_READY = 600
SHUTTING_DOWN = "the server is shutting down"
# At shutdown: how long cancelled workers may take to stop (a kernel stops within one step
# of its lanes), and how long the socket may take to deliver the clients' notices.
WORKER_EXIT_S = 1.0
NOTICE_LINGER_MS = 500
# At shutdown: how long recorded sessions may take to write their traces.
TRACE_WRITE_S = 60.0
# Calls one session may have waiting for its worker. vgpu's client holds itself to about
# 20 k (vgpu.client's bounded queue); a client that sends far more without ever waiting is
# not one, and is disconnected before it fills the server's memory.
SESSION_QUEUE_LIMIT = 1 << 18
# The largest message part the server takes (zmq drops the connection of a peer that sends
# a larger one before reading it); vgpu's client learns it at hello and refuses to send one.
MAX_MESSAGE_BYTES = 1 << 30
# Bytes of messages one session may have waiting for its worker, in largest messages: room
# for the one being run and the next. A batch beyond it is refused (CUDA_ERROR_OUT_OF_MEMORY,
# at once or at the next synchronizing call), not kept.
QUEUED_MESSAGES = 2


class ProxyServer(AdminMixin, ConnectionsMixin):
    def __init__(self, address: str, backend: str = "auto", memcheck: str = "report",
                 checkpoint_dir: str | None = None, checkpoint_every: float | None = None,
                 record_dir: str | None = None, record_full: bool = False,
                 reconnect_grace: float = DEFAULT_RECONNECT_GRACE_S,
                 access: Access | None = None,
                 mem_limit: int | None = None, server_mem_limit: int | None = None,
                 max_message: int = MAX_MESSAGE_BYTES, devices: int | None = None,
                 session_processes: bool | None = None):
        self.address = address
        self.backend_name = backend
        # Each session's backend in a device process of its own (backends/isolated.py): by
        # default on a GPU, where a device fault ends its process's use of the device.
        if session_processes is None:
            self.backend_name = backend = resolve_backend(backend)
            session_processes = backend == "cuda"
        self.session_processes = session_processes
        self.memcheck = memcheck  # for sessions whose application does not say
        # Where sessions' images go (`<dir>/<token>.vgpu`), and how often each running
        # session is checkpointed there; a standby server reading the same folder restores
        # a client whose server died.
        self.checkpoint_dir = os.path.abspath(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_every = checkpoint_every
        if checkpoint_every is not None and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir")
        # Where every new session records its trace (see recorder.py), and whether the
        # trace keeps the data that went back to the program besides its digests.
        self.record_dir = os.path.abspath(record_dir) if record_dir else None
        self.record_full = record_full
        # Workers of recorded sessions that ended: shutting down waits for their traces.
        self.ending: list[SessionWorker] = []
        if self.record_dir:
            os.makedirs(self.record_dir, exist_ok=True)
        if devices is not None and not 1 <= devices <= MAX_DEVICES:
            raise ValueError(f"--devices must be between 1 and {MAX_DEVICES}")
        # Fail now, not at the first client, if the backend cannot start.
        probe = open_backend(backend, session_processes)
        try:
            # How many devices the server offers (see Session): on a backend that drives
            # devices (cuda), all of them or the first N; emu's are views of one, 1 or N.
            self.devices = self._devices_offered(probe, devices)
            self.device_memory = probe.describe().total_memory
        finally:
            probe.close()
        # Device memory: each session's limit, and what all of them may hold together (on a
        # GPU, the device; on the emulator, host memory that would otherwise have no bound).
        self.quotas = MemoryQuotas(min(server_mem_limit or self.device_memory,
                                       self.device_memory), mem_limit)
        self.max_message = max_message
        self._pack = packer()  # (the I/O thread's: every reply is packed on it)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message)
        # Who may connect, and who each connection is (server/peers.py): before the bind,
        # so that no connection is ever taken unchecked.
        self.access = access or Access()
        self.access.secure(self.context, self.socket, address)
        # Workers hand finished batches back to the I/O thread and ring this bell, as do
        # other threads handing work to it (call_soon) and stop(); it is bound first.
        self.bell = Bell(self.context, self.socket)
        self.socket.bind(address)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.endpoint.startswith("ipc://"):
            self.access.open_socket_file(self.endpoint[len("ipc://"):])
        self._inproc = self.endpoint.startswith("inproc://")
        self._init_connections(reconnect_grace)
        self.transfers = Transfers()  # large copies streaming, for `vgpu ps`
        self.sessions: dict[bytes, Session] = {}
        self.workers: dict[bytes, SessionWorker] = {}
        self.slots: dict[bytes, int] = {}  # client identity -> arena slot
        # Workers hand finished batches back here (and ring the bell).
        self.finished: collections.deque = collections.deque()
        self.ipc = IpcRegistry()  # device memory sessions export to each other
        self._next_session_id = 1
        self.host = socket.gethostname()
        self.started_at = time.time()
        self._stopping = False
        self._init_admin()

    # ----------------------------------------------------------------- main loop

    def serve_forever(self) -> None:
        """Serve until `stop()` (or an exception), then shut down: see `close()`."""
        # While a worker runs a kernel in Python, hand the interpreter back to this I/O
        # thread often, so other clients wait milliseconds, not the default 5 ms slices.
        sys.setswitchinterval(0.001)
        # What was loaded until now (numpy, the emulator, the API tables) lives as long as
        # the server: keep it out of the garbage collector's full passes, which would
        # otherwise walk it again and again as batches of calls come and go.
        gc.freeze()
        # One blocking receive per message (the bell is a message too, see bell.py), which
        # gives up after the liveness interval so that the checks below run when idle. The
        # socket monitor's news of dropped connections waits for the liveness check (and
        # is read before a hello, see _bind_connection).
        sock = self.socket
        sock.setsockopt(zmq.RCVTIMEO, int(LIVENESS_INTERVAL_S * 1000))
        handle, recv = sock.underlying, wire.recv
        bell = self.bell.identity
        next_check = time.monotonic() + LIVENESS_INTERVAL_S
        try:
            while not self._stopping:
                # A ROUTER delivers identity + header (+ payloads, read zero-copy: bulk
                # data arrives so), with the header's origin (who sent it, through which
                # descriptor: peers.peer_of, _bind_connection) for all but CALLS messages,
                # the only ones that never need it.
                got = recv(handle, 2, 0.0, CALLS_PREFIX)
                if got is not None and len(got) == 4:
                    identity, header, more, origin = got
                    frames = [identity, header]
                    while more:
                        part = sock.recv(copy=False)
                        frames.append(part.buffer)
                        more = part.more
                    if identity == bell:
                        self._hand_back_finished()
                        self._run_soon()
                    else:
                        self.last_origin = origin
                        self._handle(frames, origin)
                if time.monotonic() >= next_check:
                    self._connection_events()
                    self._reap_dead_clients()
                    self._end_dropped_sessions()
                    self._reassure_busy_sessions()
                    self._checkpoint_due_sessions()
                    next_check = time.monotonic() + LIVENESS_INTERVAL_S
        finally:
            self.close()

    def stop(self) -> None:
        """Make serve_forever return. Safe in a signal handler and from any thread (a
        signal that finds the bell busy is noticed at the next wake, within the liveness
        interval)."""
        self._stopping = True
        self.bell.ring(wait=False)

    def close(self) -> None:
        """Shut down: cancel every session's work and tell every client, whose waiting call
        then fails at once with CUDA_ERROR_DEVICE_UNAVAILABLE (not after its VGPU_TIMEOUT)."""
        workers = [*self.workers.values(), *self.ending]
        for identity in list(self.sessions):
            self._close_session(identity, SHUTTING_DOWN)
            self._notice(identity, CUDA_ERROR_DEVICE_UNAVAILABLE, SHUTTING_DOWN)
        # A recorded session writes its trace's manifest as it ends, after its kernel stops.
        limit = TRACE_WRITE_S if self.record_dir else WORKER_EXIT_S
        deadline = time.monotonic() + limit
        stopped = all([w.join(max(0.0, deadline - time.monotonic())) for w in workers])
        if self.session_processes:
            end_device_processes(WORKER_EXIT_S)
        self._close_connections()
        self.socket.close(linger=NOTICE_LINGER_MS)
        self._close_admin()
        if stopped:  # (a worker still running may ring: its bell stays until the exit)
            self.bell.close()
            self.context.term()
        else:  # its socket would hold term() up; the process exit ends the thread
            log.warning("a session's worker did not stop in %g s; leaving it", limit)

    # ----------------------------------------------------------------- messages

    def _handle(self, frames: list, origin: tuple | None) -> None:
        identity = frames[0]
        try:
            header = unpack(frames[1], arrays_as_tuples=True)
        except ProtocolError as exc:
            log.warning("dropping a message from %r: %s", identity[:8], exc)
            return
        if type(header) is tuple and len(header) == 3 and type(header[1]) is int and \
                header[1] >= 0:  # (not a bool, which is an int too)
            kind, seq, body = header
        else:
            seq = _seq_of(header)
            if seq is None:  # nothing to answer to
                log.warning("dropping a message from %r: its header %.60r is not "
                            "[kind, seq, body]", identity[:8], header)
            else:
                self._reply(identity, seq, 1, "malformed message: the header is not "
                                              "[kind, seq, body]")
            return
        payloads = frames[2:]
        try:
            if kind == CALLS:
                session = self.sessions.get(identity)
                if session is not None:
                    session.position += 1  # every message counts, whatever is in it
                    self.transfers.arrived(session, body)
                elif identity in self.moved:
                    return  # sent before its client heard that the session moved
                self._calls(session, identity, seq, body, payloads, frames[1])
            elif kind == RELEASE:
                session = self.sessions.get(identity)
                if session is not None:
                    session.window_released()
            elif kind == HOSTFN:
                session = self.sessions.get(identity)
                if session is not None:
                    session.host_function_done(body)
            elif kind == HELLO:
                self._hello(identity, seq, body, peer_of(origin, self._inproc))
            elif kind == ADMIN:
                self._admin(identity, seq, body, payloads, peer_of(origin, self._inproc))
            elif kind == BYE:
                self._close_session(identity, "client said goodbye")
            else:
                self._reply(identity, seq, 1, f"unknown message kind {kind!r}")
        except Exception:  # the server must survive any client; log and keep serving
            log.error("internal error serving %r:\n%s", identity[:8], traceback.format_exc())
            self._reply(identity, seq, 999, "internal server error")

    def _reply(self, identity: bytes, seq, code: int, result=None, deferred=0,
               output: str = "", diagnostics: str = "", payloads=()) -> None:
        if seq:
            header = [seq, code, result, deferred, output, diagnostics]
            self._send_reply(identity, header, payloads)
            self._keep_reply(identity, header, payloads)  # the connection may drop

    def _notice(self, identity: bytes, code: int = 0, why=None) -> None:
        """A reply to no request (seq 0): with code 0, the server is alive and still running
        the client's calls; otherwise it is going away, and `why` says why."""
        self._send_reply(identity, [KEEPALIVE_SEQ, code, why, 0, "", ""])

    def _tell(self, worker: SessionWorker, notice: dict) -> None:
        """A notice for the session's client, wherever it is connected now (I/O thread)."""
        if self.workers.get(worker.identity) is worker:
            self._notice(worker.identity, 0, notice)

    def _send_reply(self, identity: bytes, header: list, payloads=()) -> None:
        packed = self._pack(header)  # first: a failure after the identity went would leave the
        # socket holding half a message, which the next reply, to anyone, would complete
        if payloads:  # bulk payloads go zero-copy; small frames are cheaper copied
            self.socket.send_multipart([identity, packed, *payloads], copy=False)
        else:  # (a ROUTER takes every message: one it cannot pass on, it drops)
            wire.send(self.socket.underlying, identity, packed)

    def _hello(self, identity: bytes, seq, body, peer: Peer) -> None:
        if not isinstance(body, dict):
            self._reply(identity, seq, 1, f"malformed hello: {body!r:.60} is not a map")
            return
        if body.get("version") != PROTOCOL_VERSION:
            self._reply(identity, seq, 803, f"protocol version mismatch: server speaks "
                                            f"{PROTOCOL_VERSION}, client sent "
                                            f"{body.get('version')!r:.60}")
            return
        self._bind_connection(identity)
        if body.get("resume") and self._rebind(identity, seq, body, peer):
            return  # a live session's client, back on a new connection
        if identity in self.sessions:
            self._close_session(identity, "client reconnected")
        self.moved.pop(identity, None)
        self._forget_restoring(identity)
        try:
            if body.get("resume"):
                opened = self._resumed_session(identity, seq, body, peer)
                if opened is None:
                    return  # restored from its image on another thread; answered then
                session, slot = opened
            else:
                if self.record_dir:
                    # No shared staging segment and no access to the client's memory: what
                    # a recorded session's calls use arrives in the messages we record.
                    body = {**body, "shm": None, "probe": None}
                session, slot = self._new_session(body, body.get("arena"), peer)
                if self.record_dir:
                    SessionRecorder(session, self.record_dir, self.record_full)
        except (TypeError, ValueError, AttributeError) as exc:  # a pid that is no number...
            self._reply(identity, seq, 1, f"malformed hello: {exc}")
            return
        except CudaError as exc:
            self._reply(identity, seq, exc.code, exc.message)
            return
        self._open(identity, seq, session, slot)

    def _open(self, identity: bytes, seq, session: Session, slot: int) -> None:
        """Serve `session` to the client at `identity`, and answer its hello."""
        self.sessions[identity] = session
        self.slots[identity] = slot
        worker = SessionWorker(session, self.bell, self.finished)
        worker.identity = identity  # where its replies go; a reconnect moves it
        self.workers[identity] = worker
        session.notify = lambda notice: self.call_soon(lambda: self._tell(worker, notice))
        session.ipc = self.ipc
        log.info("session %d opened for %s: pid %d %s", session.id, session.peer.name,
                 session.pid, " ".join(session.argv))
        self._welcome(identity, seq, session)

    def _welcome(self, identity: bytes, seq, session: Session) -> None:
        """Answer the hello of the client at `identity`, whose session is `session`."""
        self._reply(identity, seq, 0, {
            "session": session.id,
            "position": session.position,
            "server_pid": os.getpid(),
            "host": self.host,
            "backend": session.backend.name,
            "max_message": self.max_message,
            "shm": session.staging is not None,
            "peer_memory": session.peer_memory,
            "device_windows": session.shared is not None,
            "device": self._describe_device(session, 0),
            "devices": [self._describe_device(session, d) for d in range(self.devices)],
        })

    @staticmethod
    def _devices_offered(probe, asked: int | None) -> int:
        """How many devices to offer when `--devices` asked for `asked` (None: not given)."""
        driven = probe.devices_driven()
        if driven is None:
            return asked or 1
        if asked is not None and asked > driven:
            raise ValueError(f"--devices {asked}: the {probe.name} backend has "
                             f"{driven} device{'s' * (driven != 1)}")
        return asked or min(driven, MAX_DEVICES)

    def _describe_device(self, session: Session, ordinal: int) -> dict:
        """Device `ordinal` as the session sees it, as its backend describes it; `peers`:
        the devices whose memory its kernels can reach (cuDeviceCanAccessPeer)."""
        backend = session.backend
        device = backend.describe_device(ordinal)
        return {
            "name": device.name,
            "uuid": device.uuid,
            # A session sees a device the size of its memory limit (see quotas.py).
            "total_memory": min(session.memory.info()[1], device.total_memory),
            "compute_capability": list(device.compute_capability),
            "attributes": device.attributes,
            "peers": [peer for peer in range(self.devices)
                      if backend.can_access_peer(ordinal, peer)],
        }

    def _new_session(self, hello: dict, arena_base: int | None, peer: Peer
                     ) -> tuple[Session, int]:
        """A fresh session for `hello` from `peer`, in a free arena slot (or the one at
        `arena_base`: a restored session keeps its addresses)."""
        self._check_session_count(peer)
        if arena_base is None:
            slot = self._free_slot()
            if slot is None:
                raise CudaError(2, "the server has no free session slot")
        else:
            slot, rest = divmod(int(arena_base) - ARENA_BASE, ARENA_SPAN)
            if rest or not 0 <= slot < ARENA_SLOTS:
                raise CudaError(1, f"0x{arena_base:x} is not a session address range")
        arena = VaArena(ARENA_BASE + slot * ARENA_SPAN, ARENA_SPAN,
                        fixed_window=(ARENA_BASE, ARENA_SLOTS * ARENA_SPAN))
        backend = open_backend(self.backend_name, self.session_processes)
        try:
            # Each emulated session has an address space of its own; sessions of a backend
            # that share one (a GPU's) cannot both have one range.
            if arena_base is not None and backend.shares_address_space and \
                    slot in self._slots_in_use():
                raise CudaError(2, "the session's address range is in use on this server")
            session = Session(self._next_session_id, hello, backend, arena, self.memcheck,
                              peer, self.quotas.account(peer), self.devices)
        except BaseException:
            backend.close()
            raise
        self._next_session_id += 1
        return session, slot

    def _check_session_count(self, peer: Peer) -> None:
        """A key's `sessions` option bounds how many sessions it has open at once."""
        limit = peer.options.get("sessions")
        if limit is None:
            return
        open_now = sum(s.peer.name == peer.name for s in self.sessions.values())
        if open_now >= int(limit):
            # As a device in exclusive compute mode refuses a second context.
            raise CudaError(CUDA_ERROR_DEVICE_UNAVAILABLE,
                            f"{peer.name} may have {limit} session(s) open at once, "
                            f"and has {open_now}")

    def _free_slot(self) -> int | None:
        used = self._slots_in_use()
        return next((i for i in range(ARENA_SLOTS) if i not in used), None)

    def _slots_in_use(self) -> set[int]:
        """Served sessions' slots, and those of sessions restored for clients to come."""
        return {*self.slots.values(), *(slot for _, slot in self.restoring.values()),
                *(slot for _, slot, _ in self.adopted.values())}

    def _calls(self, session: Session | None, identity: bytes, seq, body, payloads,
               header: bytes | None = None) -> None:
        """Run (or queue) the calls `body` of a message from the client at `identity`, whose
        session is `session`; `header`: the message's encoded header when `body` is all of
        its calls (a recorder may keep it as they are)."""
        if session is None:
            self._reply(identity, seq, 46, "no session: say hello first")
            return
        worker = self.workers[identity]
        if type(body) is tuple and len(body) == 1 and not worker.busy() and \
                not _is_long_call(body[0]) and not session.lanes.busy():
            # A single short call of an idle session (a synchronizing call, most often):
            # every check below would pass, a query's included (nothing is running), so
            # it runs here at once.
            self._send_outcome(identity, seq, run_batch(session, seq, body, payloads, header))
            return
        if not isinstance(body, tuple):
            if seq:
                self._reply(identity, seq, 1, "malformed call batch: not a list of calls")
            else:  # like any failure of queued work, it surfaces at the next synchronization
                session.defer(1, "malformed call batch: not a list of calls")
            return
        if body and isinstance(body[-1], tuple) and body[-1][:1] == (QUERY,):
            # A query must not wait for the work it asks about: what came with it is queued
            # like any other work, and while the worker is busy the answer is "not ready".
            if len(body) > 1:
                self._calls(session, identity, 0, body[:-1], payloads)
                header = None  # the query alone is left
            if worker.pending:
                self._reply(identity, seq, CUDA_ERROR_NOT_READY, "work is still running")
                return
            body = body[-1:]
        if worker.queued_calls + len(body) > SESSION_QUEUE_LIMIT:
            log.warning("session %d queued %d calls without waiting for any", session.id,
                        worker.queued_calls + len(body))
            self._reply(identity, seq, CUDA_ERROR_OUT_OF_MEMORY,
                        "the session queued more work than the server holds")
            self._close_session(identity, "it queued more work than the server holds")
            return
        # A message is whole in memory once it is here: what is bounded is what waits.
        size = len(header or b"") + (sum(map(len, payloads)) if payloads else 0)
        if worker.queued_bytes and \
                worker.queued_bytes + size > QUEUED_MESSAGES * self.max_message:
            why = (f"the session has {worker.queued_bytes} bytes of calls waiting to run; "
                   f"the server holds at most {QUEUED_MESSAGES * self.max_message}")
            if seq:
                self._reply(identity, seq, CUDA_ERROR_OUT_OF_MEMORY, why)
            else:
                session.defer(CUDA_ERROR_OUT_OF_MEMORY, why)
            return
        if worker.busy() or len(body) > INLINE_CALLS or any(map(_is_long_call, body)) or \
                session.lanes.busy():  # a call may wait for the streams' work
            worker.submit(identity, seq, body, payloads, size, header)
        else:
            self._send_outcome(identity, seq, run_batch(session, seq, body, payloads, header))

    def _send_outcome(self, identity: bytes, seq, outcome: Outcome) -> None:
        code, result, frames, deferred, output, diagnostics = outcome
        if frames:
            self.transfers.sent(self.sessions[identity], frames)
        self._reply(identity, seq, code, result, deferred, output, diagnostics, frames)

    def _hand_back_finished(self) -> None:
        while self.finished:
            worker, _, seq, job, outcome = self.finished.popleft()
            worker.handed_back(job)
            identity = worker.identity  # where its client is now
            if outcome is not None and self.workers.get(identity) is worker:  # still there
                self._send_outcome(identity, seq, outcome)

    # ----------------------------------------------------------------- liveness

    def _close_session(self, identity: bytes, why: str) -> None:
        session = self.sessions.pop(identity, None)
        self.slots.pop(identity, None)
        worker = self.workers.pop(identity, None)
        self._forget_connection(identity)
        if session is not None:
            self._forget_replies(session)
            self.transfers.forget(session)
            log.info("session %d closing (%s); %d bytes to release", session.id, why,
                     session.memory_in_use())
            worker.cancel()  # stops its kernel, then releases the session
            if session.recorder is not None:
                self.ending = [w for w in self.ending if not w.join(0)]
                self.ending.append(worker)

    def _reassure_busy_sessions(self) -> None:
        """Clients whose calls are still running hear that the server is alive (a client
        waiting for a kernel longer than its VGPU_TIMEOUT would otherwise give up on us)."""
        for identity, worker in self.workers.items():
            if worker.pending:
                self._notice(identity)
        for identity in self.restoring:  # waiting for its hello's answer
            self._notice(identity)

    def _reap_dead_clients(self) -> None:
        for identity, session in list(self.sessions.items()):
            if not self._client_alive(session):
                self._close_session(identity, f"client pid {session.pid} is gone")

    def _client_alive(self, session: Session) -> bool:
        """False once a client on this host is gone; a remote one is presumed alive."""
        return not (session.host == self.host and session.pid and not pid_alive(session.pid))


def _seq_of(header) -> int | None:
    """The seq of a decoded header [kind, seq, body], if it has a usable one."""
    if isinstance(header, tuple) and len(header) >= 2:
        seq = header[1]
        if type(seq) is int and seq >= 0:  # not a bool, which is an int too
            return seq
    return None


def _is_long_call(call) -> bool:
    return isinstance(call, tuple) and bool(call) and isinstance(call[0], str) and \
        call[0] in LONG_CALLS
