"""Moving a session's state: checkpoints, suspend and resume, live migration.

Each operation runs on a thread of its own, so that the server's I/O thread goes on serving
every session while an image is compressed and written, or memory is sent to another server.
An operation touches its session only through control tasks (`SessionHost.control`), which
the session's worker runs in line with its calls: a task sees the session exactly as the
calls before it left it, and runs alone with it.

Live migration pre-copies: while the session keeps running, its memory is hashed in slices
of MiBs (XXH3, at several GB/s: the last pass runs while the session is stopped, and a
content hash of cryptographic strength is not needed to tell what changed) and each chunk
that differs from what the target holds is sent; rounds repeat until
what changed in one is small. Then the session stops (its later calls are held), the last
changed chunks and the journal go to the target, which restores the session, and the client
is told to reconnect there. The downtime is that last step only.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import xxhash
import zmq

from vgpu.protocol import ADMIN, HANDSHAKE_TIMEOUT_S, pack, unpack
from vgpu.replay.image import read_image, write_image
from vgpu.transport import TransportError, connect, wait_answer

from .peers import Access
from .session import Session

__all__ = ["SessionHost", "MoveError", "checkpoint", "suspend", "resume_here", "move",
           "Incoming", "MIGRATION_CHUNK"]

log = logging.getLogger("vgpu.server")

# Migration compares and sends memory in chunks of this size.
MIGRATION_CHUNK = 1 << 20
# Pre-copy hashes at most this much memory per control task, so the session's own calls
# wait at most a few tens of milliseconds for one.
SLICE_BYTES = 64 << 20
# Pre-copy stops when a round found at most this much changed (or after MAX_ROUNDS).
CONVERGED_BYTES = 16 << 20
MAX_ROUNDS = 8
# How long a server waits for another to answer one step of a migration, and one step
# while the session is stopped (then the session goes on here).
LINK_TIMEOUT_S = 120.0
STOPPED_LINK_TIMEOUT_S = 20.0


class MoveError(Exception):
    """An operation that could not be done; its message is for the user."""


class SessionHost(Protocol):
    """What an operation needs of the server (ProxyServer implements it)."""

    context: zmq.Context
    access: Access

    def control(self, identity: bytes, task: Callable[[Session, int], object],
                hold: bool = False) -> Future: ...

    def call_soon(self, fn: Callable[[], None]) -> None: ...


Progress = Callable[[str, int, int], None]  # (phase, done, total)


# ----------------------------------------------------------------- checkpoints

def checkpoint(host: SessionHost, identity: bytes, path: str, progress: Progress) -> dict:
    """Write the session's image to `path`; what it cost, for the admin reply."""
    started = time.perf_counter()
    buffers = _capture_buffers(host, identity)
    capture, stop_s = host.control(
        identity, lambda s, p: _timed_capture(s, p, buffers)).result()
    stats = write_image(path, capture.state, capture.regions,
                        progress=lambda done, total: progress("write", done, total))
    return {"path": stats.path, "bytes": stats.image_bytes, "written": stats.bytes_written,
            "memory": stats.bytes_total, "chunks": stats.chunks,
            "shared_chunks": stats.chunks - stats.chunks_written, "stop_s": stop_s,
            "total_s": time.perf_counter() - started,
            "position": capture.state["position"]}


def _capture_buffers(host: SessionHost, identity: bytes) -> dict[int, mmap.mmap]:
    """Memory to copy the session's allocations into, one buffer per allocation there is
    now, with its pages already in place: touching fresh pages costs several times the copy
    itself, and the session need not be stopped while that happens."""
    layout = host.control(identity, lambda s, p: s.regions()).result()
    return {address: mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                               getattr(mmap, "MAP_POPULATE", 0))
            for address, size in layout}


def _timed_capture(session: Session, position: int, buffers=None):
    started = time.perf_counter()
    session.wait_windows_released()
    with session.backend.running():
        capture = session.capture(position, buffers)
    return capture, time.perf_counter() - started


def suspend(host: SessionHost, identity: bytes, path: str, progress: Progress) -> dict:
    """Save the session to `path` and free its device memory; its later calls wait."""
    started = time.perf_counter()

    buffers = _capture_buffers(host, identity)

    def capture_and_release(session: Session, position: int):
        capture, stop_s = _timed_capture(session, position, buffers)
        session.release_device()
        return capture, stop_s

    capture, stop_s = host.control(identity, capture_and_release, hold=True).result()
    try:
        stats = write_image(path, capture.state, capture.regions,
                            progress=lambda done, total: progress("write", done, total))
    except Exception:
        # Nothing may be lost: put the session back from what was copied aside.
        host.control(identity, _restore_task(capture.state, [
            (address, len(data)) for address, data in capture.regions],
            lambda i, out: out.__setitem__(slice(None), capture.regions[i][1]))).result()
        raise
    return {"path": stats.path, "bytes": stats.image_bytes, "memory": stats.bytes_total,
            "stop_s": stop_s, "total_s": time.perf_counter() - started,
            "position": capture.state["position"]}


def resume_here(host: SessionHost, identity: bytes, path: str, progress: Progress) -> dict:
    """Restore a suspended session from its image on this server, and let its calls run."""
    started = time.perf_counter()
    image = read_image(path)
    total = sum(size for _, size in image.regions)
    done = 0

    def fill(i: int, out: memoryview) -> None:
        nonlocal done
        image.read_region(i, out)
        done += len(out)
        progress("read", done, total)

    host.control(identity, _restore_task(image.state, image.regions, fill)).result()
    return {"restore_s": time.perf_counter() - started, "memory": total}


def _restore_task(state: dict, regions, fill):
    def restore(session: Session, position: int) -> None:
        session.renew_backend()
        try:
            with session.backend.running():
                session.restore(state, regions, fill)
        except BaseException:
            # Not restored (the device memory it needs is taken, say): it stays suspended,
            # holding nothing, and its image can be resumed again later.
            session.release_device()
            raise
    return restore


def temporary_image_path(directory: str | None, token: str) -> str:
    """Where a suspended session's image goes when the server keeps none of its own."""
    if directory:
        return os.path.join(directory, f"{token}.vgpu")
    return os.path.join(tempfile.mkdtemp(prefix="vgpu-suspended-"), f"{token}.vgpu")


# ----------------------------------------------------------------- migration

@dataclass
class _Sent:
    """What the target holds: (address, offset) -> digest of the chunk sent there."""

    digests: dict[tuple[int, int], bytes] = field(default_factory=dict)
    bytes: int = 0


def move(host: SessionHost, identity: bytes, token: str, target: str, precopy: bool,
         progress: Progress, image_path: str | None = None) -> dict:
    """Move the session to the server at `target` and redirect its client there. With
    `image_path` the session is suspended and comes from its image; else it is running, and
    it is pre-copied (`precopy`) or stopped and copied at once."""
    started = time.perf_counter()
    link = _Link(host.context, target, host.access.link_key())
    try:
        link.request({"phase": "begin", "token": token}, timeout=HANDSHAKE_TIMEOUT_S)
        sent = _Sent()
        if image_path is not None:
            return _move_suspended(host, identity, link, token, image_path, progress,
                                   started)
        rounds = 0
        mark = None
        if precopy:
            while rounds < MAX_ROUNDS:
                rounds += 1
                changed, mark = _precopy_round(host, identity, link, token, sent, progress,
                                               mark)
                if changed <= CONVERGED_BYTES:
                    break
        stop = host.control(identity, lambda s, p: _final_stop(s, p, sent, mark),
                            hold=True).result()
        try:
            # The session is stopped now: a target that stalls must not hold it for long.
            _send_chunks(link, token, stop.chunks, sent, timeout=STOPPED_LINK_TIMEOUT_S)
            link.request({"phase": "commit", "token": token, "state": stop.state,
                          "regions": stop.regions}, timeout=STOPPED_LINK_TIMEOUT_S)
        except BaseException:
            host.control(identity, lambda s, p: None)  # let the held calls run here
            raise
        _redirect(host, identity, target, stop.state["position"])
        downtime = time.perf_counter() - stop.stopped_at
        return {"moved_to": target, "downtime_s": downtime, "rounds": rounds,
                "bytes_sent": sent.bytes, "total_s": time.perf_counter() - started,
                "position": stop.state["position"]}
    except BaseException:
        link.abort_quietly()
        raise
    finally:
        link.close()


def _move_suspended(host, identity, link, token, image_path, progress, started) -> dict:
    image = read_image(image_path)
    total = sum(size for _, size in image.regions)
    sent = _Sent()  # nothing to compare with: every chunk goes
    for i, (address, size) in enumerate(image.regions):
        data = memoryview(bytearray(size))
        image.read_region(i, data)
        _send_chunks(link, token, [(address, size, offset, data[offset:offset + MIGRATION_CHUNK],
                                    b"") for offset in range(0, size, MIGRATION_CHUNK)], sent)
        progress("send", sent.bytes, total)
    link.request({"phase": "commit", "token": token, "state": image.state,
                  "regions": [list(r) for r in image.regions]})
    _redirect(host, identity, link.address, image.state["position"])
    return {"moved_to": link.address, "bytes_sent": total,
            "total_s": time.perf_counter() - started, "position": image.state["position"]}


def _redirect(host: SessionHost, identity: bytes, target: str, position: int) -> None:
    """Have the I/O thread tell the client its session is at `target` now; once it did."""
    redirected: Future = Future()
    host.call_soon(lambda: redirected.set_result(host.redirect(identity, target, position)))
    redirected.result()


def _precopy_round(host, identity, link, token, sent: _Sent, progress: Progress,
                   since: tuple | None) -> tuple[int, tuple]:
    """Send every chunk that differs from the target's copy, a slice at a time while the
    session runs: of all memory, or (`since` a mark) of what may have changed since. Returns
    the bytes that had changed, and the mark this round started from."""
    mark, todo = host.control(identity, lambda s, p: _settled_plan(s, since, sent)).result()
    total = sum(n for *_, n in todo)
    changed = done = 0
    for first in range(0, len(todo), SLICE_BYTES // MIGRATION_CHUNK):
        part = todo[first:first + SLICE_BYTES // MIGRATION_CHUNK]
        chunks = host.control(identity, lambda s, p, part=part: _changed(s, part, sent)).result()
        changed += _send_chunks(link, token, chunks, sent)
        done += sum(n for *_, n in part)
        progress("copy", done, total)
    return changed, mark


def _settled_plan(session: Session, since: tuple | None, sent: _Sent) -> tuple[tuple, list]:
    """`_plan` once the work queued on the session's streams has run: a launch counts as a
    change when the session takes it, and one still queued on a stream's lane at the mark
    would write after this round read its memory, unseen by the rounds after the mark."""
    session.settle_streams()
    return _plan(session, since, sent)


def _plan(session: Session, since: tuple | None, sent: _Sent) -> tuple[tuple, list]:
    """A mark, and the chunks to compare with what was sent: every chunk, or those the
    session says may have changed since `since`, and any never sent."""
    mark = session.mark()
    regions = session.regions()
    ranges = session.changed_since(since) if since is not None else None
    if ranges is None:
        return mark, [(address, size, offset, min(MIGRATION_CHUNK, size - offset))
                      for address, size in regions
                      for offset in range(0, size, MIGRATION_CHUNK)]
    wanted = set()
    for address, size in ranges:
        found = session.arena.find(address)
        if found is not None and size > 0:
            start, _ = found
            first = (address - start) // MIGRATION_CHUNK
            last = (address + size - 1 - start) // MIGRATION_CHUNK
            wanted.update((start, k * MIGRATION_CHUNK) for k in range(first, last + 1))
    return mark, [(address, size, offset, min(MIGRATION_CHUNK, size - offset))
                  for address, size in regions
                  for offset in range(0, size, MIGRATION_CHUNK)
                  if (address, offset) in wanted or (address, offset) not in sent.digests]


def _changed(session: Session, todo: list, sent: _Sent) -> list:
    """[(address, region size, offset, bytes, digest)] of the chunks in `todo` (still
    inside a live allocation of the same size) whose digest differs from the one sent."""
    out = []
    for address, size, offset, n in todo:
        if session.region_size(address) != size:
            continue  # freed since it was planned
        view = _view(session, address, offset, n)
        digest = xxhash.xxh3_128_digest(view)
        if sent.digests.get((address, offset)) != digest:
            out.append((address, size, offset, bytes(view), digest))
    return out


def _view(session: Session, address: int, offset: int, size: int) -> memoryview:
    """Bytes of region `address` from `offset`: in place where the backend keeps device
    memory in host RAM, else a copy."""
    if address not in session.vmm.physical:
        view = session.backend.host_view(address + offset, size, writing=False)
        if view is not None:
            return view
    view = memoryview(bytearray(size))
    session.read_region(address, offset, view)
    return view


@dataclass
class _Stop:
    state: dict
    regions: list
    chunks: list
    stopped_at: float


def _final_stop(session: Session, position: int, sent: _Sent, since: tuple | None) -> _Stop:
    """The session stops here: what changed since the last round began, and its journal."""
    stopped_at = time.perf_counter()
    session.wait_windows_released()
    session.check_movable()
    session.settle_streams()
    _, todo = _plan(session, since, sent)
    chunks = _changed(session, todo, sent)
    regions = [list(r) for r in session.regions()]
    return _Stop(session.describe(position), regions, chunks, stopped_at)


def _send_chunks(link: _Link, token: str, chunks: list, sent: _Sent,
                 timeout: float = LINK_TIMEOUT_S) -> int:
    """Send chunks to the target, a few MiB a message; returns their bytes."""
    total = 0
    batch, frames, batch_bytes = [], [], 0
    for address, size, offset, data, digest in chunks:
        batch.append([address, size, offset, len(data)])
        frames.append(data)
        batch_bytes += len(data)
        sent.digests[(address, offset)] = digest
        if batch_bytes >= 8 * MIGRATION_CHUNK:
            link.request({"phase": "memory", "token": token, "chunks": batch}, frames,
                         timeout)
            total += batch_bytes
            batch, frames, batch_bytes = [], [], 0
    if batch:
        link.request({"phase": "memory", "token": token, "chunks": batch}, frames, timeout)
        total += batch_bytes
    sent.bytes += total
    return total


class _Link:
    """A request/reply channel to another vgpu server's admin interface."""

    def __init__(self, context: zmq.Context, address: str, key: Path | None):
        """`key`: this server's key pair, which the other server must admit as an admin
        (None: this user's client key)."""
        self.address = address
        self.token: str | None = None
        try:
            self.socket, self.watch = connect(context, zmq.DEALER, address, secret_file=key,
                                                watch=True)
        except TransportError as exc:
            raise MoveError(str(exc)) from None
        self.seq = 0

    def request(self, args: dict, frames=(), timeout: float = LINK_TIMEOUT_S) -> object:
        self.seq += 1
        if args.get("token"):
            self.token = args["token"]
        self.socket.send_multipart([pack([ADMIN, self.seq, ["adopt", [args]]]), *frames],
                                   copy=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not wait_answer(self.socket, self.watch, 0.1):
                    continue
            except TransportError as exc:
                raise MoveError(str(exc)) from None
            reply = unpack(self.socket.recv_multipart()[0])
            if reply[0] != self.seq:
                continue  # a progress notice or a stale answer
            if reply[1]:
                raise MoveError(f"the server at {self.address} refused: {reply[2]}")
            return reply[2]
        raise MoveError(f"the server at {self.address} did not answer within {timeout:g} s")

    def abort_quietly(self) -> None:
        if self.token:
            try:
                self.socket.send(pack([ADMIN, 0, ["adopt", [{"phase": "abort",
                                                            "token": self.token}]]]),
                                 zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self) -> None:
        self.watch.close()
        self.socket.close(linger=200)


# ----------------------------------------------------------------- the receiving end

class Incoming:
    """A session arriving from another server: its memory, assembled as chunks come in, so
    that the restore at the end maps these buffers instead of copying them."""

    def __init__(self, token: str, memory_limit: int):
        self.token = token
        self.buffers: dict[int, bytearray] = {}  # region address -> contents
        self.started = time.monotonic()
        self.memory_limit = memory_limit  # the device's memory: no session holds more

    def take_chunks(self, chunks: list, frames: list) -> None:
        if len(chunks) != len(frames):
            raise MoveError("memory message: chunks and frames do not match")
        for (address, size, offset, n), frame in zip(chunks, frames, strict=True):
            address, size, offset, n = int(address), int(size), int(offset), int(n)
            if not 0 < size <= 1 << 40 or offset < 0 or offset + n > size or len(frame) != n:
                raise MoveError(f"memory message: chunk 0x{address:x}+{offset} is malformed")
            buffer = self.buffers.get(address)
            if buffer is None or len(buffer) != size:
                held = sum(len(b) for a, b in self.buffers.items() if a != address)
                if held + size > self.memory_limit:
                    raise MoveError(f"the session's memory would exceed the device's "
                                    f"{self.memory_limit} bytes")
                buffer = self.buffers[address] = bytearray(size)
            memoryview(buffer)[offset:offset + n] = frame

    def fill(self, regions: list):
        """(backings, fill) for Session.restore from what arrived; MoveError if a region
        never came."""
        for address, size in regions:
            buffer = self.buffers.get(address)
            if buffer is None or len(buffer) != size:
                raise MoveError(f"region 0x{address:x}+{size} never arrived")

        def fill(i: int, out: memoryview) -> None:
            out[:] = self.buffers[regions[i][0]]

        return self.buffers, fill
