"""Traces: what a program asked of its device, call by call, to run again without it.

A trace is a folder: one manifest per session (one per process of the recorded program),
written when the session ends, and a chunk store the sessions share (see store.py):

    TRACE/<id>-<token>.trace              a session's manifest
    TRACE/.vgpu-chunks/ab/<sha256 hex>    data sent by the program (and, with `full`, data
                                          it got back), zstd, stored once by content

A manifest is framed as an image's (store.py) with MAGIC and FORMAT_VERSION; its body:

    {"format": 1, "vgpu": version, "created": unix time, "hash": "sha256",
     "compression": "zstd", "chunk_bytes": CHUNK_BYTES, "full": bool,
     "session": {"id", "token", "argv", "pid", "memcheck", "backend", "arena", "started"},
     "calls": [[op, args, outcome], ...]}

`args` are the call's arguments as the program sent them, except that data it sent (a copy
to the device, a module's image) is `["blob", size, [chunk digest, ...]]`. `outcome` is what
went back to the program: {"code": CUresult} and, when there was one, the sha256 of the
result value (msgpack), of each piece of data copied to the host ("data", a list), of the
device printf text ("output") and of the diagnostics text; with `full`, "kept" holds the
same things themselves ({"result", "data": [blob, ...], "output", "diagnostics"}). A
recording adds "time": [start, duration] of the call on the server, in ns from the
session's start (not compared by replay; absent from traces made before it was kept;
calls run back to back may share their time evenly: see server/recorder.py).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import time
from dataclasses import dataclass

import msgpack
import zstandard

from .image import CHUNK_BYTES
from .store import (
    DIGEST_BYTES,
    STORE,
    chunk_path,
    frame,
    read_chunk_into,
    read_framed,
    vgpu_version,
    write_file,
    write_temporary,
)

__all__ = ["MAGIC", "FORMAT_VERSION", "SUFFIX", "TraceError", "TraceWriter", "Trace",
           "SessionTrace", "read_trace", "outcome_of", "digest"]

MAGIC = b"VGPUTRC\x00"
FORMAT_VERSION = 1
SUFFIX = ".trace"
BLOB = "blob"
_LEVEL = -1  # as images: fast, and checksummed
_MESSAGE = "message"  # marks a run of plain calls kept as their message's header


class TraceError(ValueError):
    """A trace that cannot be read (missing, not a trace, truncated, corrupt, a newer
    format, a chunk missing or damaged); the message names the file and what is wrong."""


def digest(data) -> bytes:
    return hashlib.sha256(data).digest()


def outcome_of(code: int, result, data: list, output: str, diagnostics: str,
               full: bool, store_blob=None) -> dict:
    """The outcome of one call as a trace keeps it (and as replay compares it)."""
    outcome: dict = {"code": code}
    if result is not None:
        outcome["result"] = digest(msgpack.packb(result, use_bin_type=True))
    if data:
        outcome["data"] = [digest(piece) for piece in data]
    if output:
        outcome["output"] = digest(output.encode())
    if diagnostics:
        outcome["diagnostics"] = digest(diagnostics.encode())
    if full:
        outcome["kept"] = {"result": result, "data": [store_blob(piece) for piece in data],
                           "output": output, "diagnostics": diagnostics}
    return outcome


class TraceWriter:
    """One session's trace, written as its calls run: data goes to the chunk store at once,
    the manifest when the session ends (`finish`)."""

    def __init__(self, folder: str, session: dict, full: bool):
        self.folder = os.path.abspath(folder)
        self.store = os.path.join(self.folder, STORE)
        os.makedirs(self.store, mode=0o700, exist_ok=True)
        self.session = session
        self.full = full
        # Calls as recorded: [op, args, outcome], or a run of calls that succeeded with
        # nothing to return (add_plain): [(op, args), ...] in marshal's bytes (the fastest
        # of the standard library's encoders; these bytes never leave this process), when
        # the run started and how long each of its calls took. Plain calls, most of any
        # program's, then cost no object of their own until the manifest is written: kept
        # as objects by the million, they kept the garbage collector busy while the
        # program ran.
        self.calls: list = []
        self._plain = outcome_of(0, None, [], "", "", full, self.blob)
        self.name = f"{session['id']:04d}-{session['token']}{SUFFIX}"
        self._known: set[bytes] = set()  # chunks this writer stored or found stored
        self._compressor = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=True)
        self._finished = False

    def blob(self, data) -> list:
        """`data` in the chunk store; the reference a trace holds to it."""
        view = memoryview(data).cast("B")
        digests = []
        for offset in range(0, len(view), CHUNK_BYTES) or [0]:
            piece = bytes(view[offset:offset + CHUNK_BYTES])
            name = digest(piece)
            digests.append(name)
            if name in self._known:
                continue
            target = chunk_path(self.store, name)
            if not os.path.exists(target):
                folder = os.path.dirname(target)
                os.makedirs(folder, mode=0o700, exist_ok=True)
                # Another session may store the same chunk meanwhile: both rename the same
                # bytes into place.
                os.rename(write_temporary(folder, self._compressor.compress(piece)), target)
            self._known.add(name)
        return [BLOB, len(view), digests]

    def add(self, call: list, outcome: dict) -> None:
        self.calls.append([*call, outcome])

    def add_plain(self, calls: list, start_ns: int, each_ns: int) -> None:
        """Calls (op, args) that succeeded with nothing to return, run one after the other
        from `start_ns` (from the session's start), each taking `each_ns`."""
        self.calls.append((marshal.dumps(calls), start_ns, each_ns))

    def add_message(self, header: bytes, start_ns: int, each_ns: int) -> None:
        """The calls of a message (its encoded header, [kind, seq, calls]), all of which
        succeeded with nothing to return, as add_plain's."""
        self.calls.append((header, start_ns, each_ns, _MESSAGE))

    def _recorded_calls(self) -> list:
        recorded = []
        for entry in self.calls:
            if type(entry) is tuple:
                packed, start, each, *message = entry
                calls = (msgpack.unpackb(packed, raw=False, strict_map_key=False)[2]
                         if message else marshal.loads(packed))
                recorded.extend([*call, {**self._plain, "time": [start + k * each, each]}]
                                for k, call in enumerate(calls))
            else:
                recorded.append(entry)
        return recorded

    def finish(self) -> None:
        """Write the manifest (once)."""
        if self._finished:
            return
        self._finished = True
        body = {"format": FORMAT_VERSION, "vgpu": vgpu_version(), "created": time.time(),
                "hash": "sha256", "compression": "zstd", "chunk_bytes": CHUNK_BYTES,
                "full": self.full, "session": self.session, "calls": self._recorded_calls()}
        write_file(self.folder, self.name,
                   frame(MAGIC, FORMAT_VERSION, msgpack.packb(body, use_bin_type=True)))


@dataclass
class SessionTrace:
    path: str
    session: dict
    full: bool
    calls: list  # [[op, args, outcome], ...]


class Trace:
    """A trace whose manifests were read and checked, and whose chunks were all found whole."""

    def __init__(self, path: str, sessions: list[SessionTrace]):
        self.path = path
        self.sessions = sessions
        self._store = os.path.join(path, STORE)
        self._decompressor = zstandard.ZstdDecompressor()

    def load(self, blob: list, where: str = "") -> bytes:
        """The bytes a blob reference names."""
        _, size, digests = blob
        data = bytearray(size)
        view = memoryview(data)
        for i, name in enumerate(digests):
            piece = view[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]
            what = f"{where or self.path}: chunk {name.hex()}"
            read_chunk_into(self._store, name, piece, TraceError, what, self._decompressor)
            # Chunks are named by what they hold: one renamed into another's place is
            # whole and checksummed, yet not what the trace means.
            if digest(piece) != name:
                raise TraceError(f"{what} is corrupt (its contents are not what it is named)")
        return bytes(data)


def read_trace(path) -> Trace:
    """Read the trace at `path` and check all of it (every manifest, every chunk) before
    anything is run from it; TraceError says what is wrong otherwise."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise TraceError(f"cannot read trace {path}: No such file or directory")
        raise TraceError(f"{path} is not a vgpu trace (a trace is a folder)")
    names = sorted(n for n in os.listdir(path) if n.endswith(SUFFIX))
    if not names:
        raise TraceError(f"{path} is not a vgpu trace (it holds no {SUFFIX} file)")
    sessions = [_read_session(os.path.join(path, name)) for name in names]
    sessions.sort(key=lambda s: (s.session["started"], s.session["id"]))
    trace = Trace(path, sessions)
    for one in sessions:
        for index, (_, args, outcome) in enumerate(one.calls):
            for blob in _blobs(args, outcome):
                trace.load(blob, f"{one.path}: call {index}")
    return trace


def _read_session(path: str) -> SessionTrace:
    encoded, _ = read_framed(path, MAGIC, FORMAT_VERSION, TraceError, "trace", "trace")
    try:
        body = msgpack.unpackb(encoded, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        raise TraceError(f"{path} is corrupt (its body does not decode)") from None
    _check_body(path, body)
    return SessionTrace(path, body["session"], body["full"], body["calls"])


_FIELDS = {"format": int, "vgpu": str, "created": (int, float), "hash": str,
           "compression": str, "chunk_bytes": int, "full": bool, "session": dict,
           "calls": list}
_SESSION_FIELDS = {"id": int, "token": str, "argv": list, "pid": int, "memcheck": str,
                   "backend": str, "arena": int, "started": (int, float)}


def _check_body(path: str, body) -> None:
    def corrupt(why: str) -> TraceError:
        return TraceError(f"{path} is corrupt ({why})")

    if not isinstance(body, dict):
        raise corrupt("its body is not a map")
    for key, kind in _FIELDS.items():
        if not isinstance(body.get(key), kind):
            raise corrupt(f"{key!r} is missing or of the wrong type")
    for key, kind in _SESSION_FIELDS.items():
        if not isinstance(body["session"].get(key), kind):
            raise corrupt(f"the session's {key!r} is missing or of the wrong type")
    if body["format"] != FORMAT_VERSION:
        raise corrupt(f"its header says format {FORMAT_VERSION}, its body {body['format']}")
    if (body["hash"], body["compression"], body["chunk_bytes"]) != \
            ("sha256", "zstd", CHUNK_BYTES):
        raise TraceError(f"{path} uses {body['hash']}, {body['compression']} and chunks of "
                         f"{body['chunk_bytes']} bytes; this vgpu reads sha256, zstd and "
                         f"{CHUNK_BYTES}")
    for index, call in enumerate(body["calls"]):
        if not (isinstance(call, list) and len(call) == 3 and isinstance(call[2], dict)
                and isinstance(call[2].get("code"), int)):
            raise corrupt(f"call {index} is malformed: {call!r:.80}")
        try:
            for blob in _blobs(call[1], call[2]):
                _check_blob(blob)
        except (TypeError, ValueError):
            raise corrupt(f"call {index} has a malformed data reference") from None


def _check_blob(blob) -> None:
    _, size, digests = blob
    if not (isinstance(size, int) and size >= 0 and isinstance(digests, list)
            and len(digests) == max(1, -(-size // CHUNK_BYTES))
            and all(isinstance(d, bytes) and len(d) == DIGEST_BYTES for d in digests)):
        raise ValueError("malformed blob")


def is_blob(value) -> bool:
    return isinstance(value, list) and len(value) == 3 and value[0] == BLOB


def _blobs(args, outcome: dict):
    """The blob references of one recorded call: in its arguments and, in a full trace, in
    what it returned."""
    if isinstance(args, list):
        yield from (a for a in args if is_blob(a))
    kept = outcome.get("kept")
    if isinstance(kept, dict):
        yield from kept.get("data", ())
