"""Checkpoint images: a session's state and the contents of its memory, on disk.

An image is a manifest file (the path the caller names) plus chunks in a store beside it:

    PATH                                  the manifest
    <dirname(PATH)>/.vgpu-chunks/lock     taken (flock) by writers
    <dirname(PATH)>/.vgpu-chunks/ab/<sha256 hex>   one chunk, zstd-compressed

Every memory region is cut into CHUNK_BYTES pieces at region-relative offsets (the last one
may be short); a chunk is stored under the sha256 of its uncompressed bytes and written only
when the store does not hold it yet, so successive checkpoints into one folder share what did
not change (and identical pieces, such as zeroed memory, are stored once).

Manifest: MAGIC (8 bytes), the format version (u32, little-endian), the body's length (u64),
the msgpack body, the sha256 of the body (32 bytes). The body:

    {"format": 1, "vgpu": package version, "created": unix time, "chunk_bytes": 1048576,
     "hash": "sha256", "compression": "zstd", "state": the caller's dict,
     "regions": [[address, size, [digest, ...]], ...]}

Durability: every chunk is written to a temporary file, fsynced and renamed, and the store's
folders fsynced, before the manifest is written the same way; a crash, a full disk or a
read-only folder at any point leaves the previous manifest at PATH and every chunk it
references intact. After a successful write, chunks that no manifest in the folder references
are deleted (a manifest is any file there that starts with MAGIC).

Readers take no lock: an image that another writer replaces while it is being read may lose
its chunks to that writer's clean-up (the read then fails with ImageError, never returns
wrong bytes, since every chunk is checked against its digest).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgpack
import zstandard

from .store import (
    DIGEST_BYTES,
    STORE,
    TEMP,
    chunk_path,
    frame,
    fsync_file,
    fsync_folder,
    read_chunk_into,
    read_framed,
    vgpu_version,
    write_file,
    write_temporary,
)

__all__ = [
    "CHUNK_BYTES", "FORMAT_VERSION", "MAGIC", "ImageError", "WriteStats", "Image",
    "write_image", "read_image", "chunk_digests",
]

CHUNK_BYTES = 4 << 20
FORMAT_VERSION = 1
MAGIC = b"VGPUIMG\x00"

# Level -1, one of zstd's fast levels (no entropy coding of literals): zeroed and repetitive
# memory still shrinks to almost nothing, while float data, which level 1 shrinks by only
# 8-9%, is stored as it is, at 3-4 GB/s each way instead of 0.4-0.7 GB/s. Measured on 4 MiB
# chunks of float32 noise: level 1 compresses at 636 MB/s and decompresses at 699 MB/s, a
# pace below the disk's on two cores; level -1 at 3661 and 7864 MB/s.
_LEVEL = -1
# Hashing, compressing and writing release the GIL: while one thread waits for the disk,
# another compresses, so a few threads keep up with a disk even on 2 cores.
_THREADS = 4


class ImageError(ValueError):
    """An image that cannot be read (not an image, truncated, corrupt, a newer format, a
    missing or damaged chunk) or written (the folder is full, read-only, ...). The message
    names the file and what is wrong."""


@dataclass
class WriteStats:
    """What write_image did. bytes_total: the regions' (uncompressed) bytes; bytes_written:
    what this write added to the disk (new chunks and the manifest); chunks: chunk references
    in the image; chunks_written: those the store did not hold yet; image_bytes: the manifest
    plus every chunk it references, as stored."""

    path: str
    bytes_total: int
    bytes_written: int
    chunks: int
    chunks_written: int
    image_bytes: int
    seconds: float


def write_image(path, state: dict, regions: Sequence[tuple[int, object]],
                progress: Callable[[int, int], None] | None = None) -> WriteStats:
    """Write an image of `state` (a msgpack-able dict) and `regions` ((address, buffer)
    pairs; any C-contiguous buffer) to `path`, replacing the image there only once the new
    one is complete and durable. A region that changes while it is written gives an image
    of a mix of its old and new contents, never a damaged one. `progress(bytes_done,
    bytes_total)` is called as the regions' bytes are stored. Raises ImageError when it
    cannot write (the previous image at `path` is then intact); ValueError for regions that
    are not (address >= 0, contiguous buffer).
    """
    started = time.perf_counter()
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    views = [(address, _bytes_view(address, buffer)) for address, buffer in regions]
    try:
        state_body = msgpack.packb(state, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ImageError(f"cannot write checkpoint {path}: its state cannot be stored "
                         f"({exc})") from None
    store = os.path.join(folder, STORE)
    try:
        os.makedirs(store, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(store, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            stats = _write_locked(path, folder, store, state_body, views, progress)
        except OSError as exc:
            _collect_garbage(folder, store)  # the chunks this write stored for nothing
            raise _cannot_write(path, exc) from None
        _collect_garbage(folder, store)
    finally:
        os.close(lock)
    stats.seconds = time.perf_counter() - started
    return stats


def _bytes_view(address, buffer) -> memoryview:
    if not isinstance(address, int) or address < 0:
        raise ValueError(f"a region's address must be an int >= 0, not {address!r}")
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise ValueError(f"the buffer of region {address:#x} is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _cannot_write(path: str, exc: OSError) -> ImageError:
    why = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename and exc.filename != path else ""
    if os.path.exists(path):
        outcome = "the previous checkpoint is intact"
    else:
        outcome = "no checkpoint was written"
    return ImageError(f"cannot write checkpoint {path}: {why}{where}; {outcome}")


def _write_locked(path, folder, store, state_body, views, progress) -> WriteStats:
    regions_digests: list[list[bytes]] = [[] for _ in views]
    pieces = [(digests, view[offset:offset + CHUNK_BYTES])
              for digests, (_, view) in zip(regions_digests, views, strict=True)
              for offset in range(0, len(view), CHUNK_BYTES)]
    total = sum(len(view) for _, view in views)
    writer = _ChunkWriter(store)
    done = 0
    with ThreadPoolExecutor(_THREADS, thread_name_prefix="vgpu-image") as pool:
        jobs = (functools.partial(writer.store_chunk, piece) for _, piece in pieces)
        for (digests, piece), digest in zip(pieces, _in_order(pool, jobs), strict=True):
            digests.append(digest)
            done += len(piece)
            if progress is not None:
                progress(done, total)
        writer.make_durable(pool)
    regions = [[address, len(view), digests]
               for (address, view), digests in zip(views, regions_digests, strict=True)]
    referenced = {digest for digests in regions_digests for digest in digests}
    # The chunks' names must be durable before a manifest names them, those of chunks that
    # an earlier writer stored (and perhaps did not live to fsync) as well.
    for prefix in sorted({digest[:1].hex() for digest in referenced}):
        fsync_folder(os.path.join(store, prefix))
    manifest = _manifest_bytes({
        "format": FORMAT_VERSION, "vgpu": vgpu_version(), "created": time.time(),
        "chunk_bytes": CHUNK_BYTES, "hash": "sha256", "compression": "zstd",
        "state": state_body, "regions": regions,
    })
    write_file(folder, os.path.basename(path), manifest)
    fsync_folder(folder)
    stored = sum(writer.sizes.get(d) or os.stat(chunk_path(store, d)).st_size
                 for d in referenced)
    return WriteStats(
        path=path, bytes_total=total, bytes_written=writer.bytes + len(manifest),
        chunks=len(pieces), chunks_written=len(writer.sizes),
        image_bytes=len(manifest) + stored, seconds=0.0)


class _ChunkWriter:
    """Stores chunks from several threads at once: each is hashed, and compressed and written
    only if neither the store nor another thread of this write has it."""

    def __init__(self, store: str):
        self.store = store
        self.lock = threading.Lock()
        self.claimed: set[bytes] = set()
        self.sizes: dict[bytes, int] = {}  # the chunks this write stored: their size on disk
        self.bytes = 0
        self.local = threading.local()  # a compressor may not be shared between threads
        # Chunks written under temporary names, not yet fsynced: (temporary, final path).
        # Syncing them all at the end lets the disk take them as one stream, where a sync
        # per chunk would wait for each one in turn.
        self.staged: list[tuple[str, str]] = []

    def store_chunk(self, piece: memoryview) -> bytes:
        # Hashed and compressed from one copy: memory that changes meanwhile (a region still
        # in use) must not give a chunk whose bytes differ from its name, which every later
        # image would share. The copy costs a few percent of the hashing and compressing.
        piece = bytes(piece)
        digest = hashlib.sha256(piece).digest()
        with self.lock:
            if digest in self.claimed:
                return digest
            self.claimed.add(digest)
        target = chunk_path(self.store, digest)
        if os.path.exists(target):
            return digest
        compressor = getattr(self.local, "compressor", None)
        if compressor is None:
            # The frame carries a checksum of its contents, which reading verifies as it
            # decompresses, at no extra pass over the data.
            compressor = self.local.compressor = zstandard.ZstdCompressor(
                level=_LEVEL, write_checksum=True)
        data = compressor.compress(piece)
        folder = os.path.dirname(target)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        temp = write_temporary(folder, data)
        with self.lock:
            self.staged.append((temp, target))
            self.sizes[digest] = len(data)
            self.bytes += len(data)
        return digest

    def make_durable(self, pool: ThreadPoolExecutor) -> None:
        """Sync every staged chunk, then give each its name: a chunk file that has its
        name is always complete (a later write trusts it without reading it)."""
        list(pool.map(fsync_file, [temp for temp, _ in self.staged]))
        for temp, target in self.staged:
            os.rename(temp, target)
        self.staged.clear()


def _in_order(pool: ThreadPoolExecutor, jobs, window: int = 2 * _THREADS):
    """The results of `jobs` (callables) run on `pool`, in order, with at most `window` of
    them submitted at a time: memory stays at a few chunks however large the regions are."""
    pending: deque = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # after a failure: what has not started never will
            future.cancel()


def _manifest_bytes(body: dict) -> bytes:
    """The manifest of `body`, whose "state" is already packed (write_image packs it first,
    to refuse a state that cannot be stored before writing any chunk): it goes in as the
    packed value of its key."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts.append(packer.pack(key))
        parts.append(value if key == "state" else packer.pack(value))
    return frame(MAGIC, FORMAT_VERSION, b"".join(parts))


def _collect_garbage(folder: str, store: str) -> None:
    """Delete the chunks no manifest in `folder` references, and temporary files left by
    writers that died (the caller holds the writers' lock, so no live writer has any). If a
    manifest there cannot be read, nothing is deleted: its chunks are unknown."""
    referenced = _referenced_chunks(folder)
    if referenced is None:
        return
    with contextlib.suppress(OSError):  # tidying up: whatever cannot be removed stays
        for entry in os.scandir(folder):
            if entry.name.startswith(TEMP):
                _remove(entry.path)
        for sub in os.scandir(store):
            if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(sub.path):
                if entry.name.startswith(TEMP) or (
                        _is_digest_name(entry.name)
                        and bytes.fromhex(entry.name) not in referenced):
                    _remove(entry.path)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _is_digest_name(name: str) -> bool:
    return len(name) == 2 * DIGEST_BYTES and all(c in "0123456789abcdef" for c in name)


def _referenced_chunks(folder: str) -> set[bytes] | None:
    """The digests every manifest in `folder` references; None if some file there that
    starts like a manifest (or cannot be opened to tell) cannot be read."""
    referenced: set[bytes] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    for entry in entries:
        if entry.name.startswith(TEMP) or not entry.is_file():
            continue
        try:
            with open(entry.path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    continue
            body = _load_manifest(entry.path)[0]
        except (OSError, ImageError):
            return None
        for _, _, digests in body["regions"]:
            referenced.update(digests)
    return referenced


# ----------------------------------------------------------------- reading

class Image:
    """An image whose manifest has been read and checked, and whose chunks all exist.

    path: the manifest; state: the dict it was written with; regions: (address, size) of
    each region, in the order written; created: when it was written (unix time);
    vgpu_version: the version of vgpu that wrote it; bytes_on_disk: the manifest plus every
    chunk it references, as stored.
    """

    def __init__(self, path: str, body: dict, manifest_bytes: int, chunk_sizes: int):
        self.path = path
        self.state: dict = body["state"]
        self.regions: list[tuple[int, int]] = [(a, s) for a, s, _ in body["regions"]]
        self.created: float = float(body["created"])
        self.vgpu_version: str = body["vgpu"]
        self.bytes_on_disk = manifest_bytes + chunk_sizes
        self._digests = [digests for _, _, digests in body["regions"]]
        self._chunk_bytes: int = body["chunk_bytes"]
        self._store = os.path.join(os.path.dirname(os.path.abspath(path)), STORE)
        self._local = threading.local()

    def read_region(self, index: int, out, progress: Callable[[int, int], None] | None = None
                    ) -> None:
        """Fill `out` (a writable buffer of exactly the region's size) with region `index`:
        each chunk is decompressed and checked against its sha256. Raises ImageError naming
        the chunk and the region if one is missing or damaged (`out` then holds part of the
        region). `progress(bytes_done, bytes_total)` is called as chunks arrive."""
        address, size = self.regions[index]
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise ValueError("read_region needs a writable, contiguous buffer")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if len(view) != size:
            raise ValueError(f"region {address:#x} holds {size} bytes; the buffer given for it "
                             f"holds {len(view)}")
        step = self._chunk_bytes
        targets = [view[offset:offset + step] for offset in range(0, size, step)]
        jobs = (functools.partial(self._load_chunk, address, digest, target)
                for digest, target in zip(self._digests[index], targets, strict=True))
        done = 0
        with ThreadPoolExecutor(_THREADS, thread_name_prefix="vgpu-image") as pool:
            for length in _in_order(pool, jobs):
                done += length
                if progress is not None:
                    progress(done, size)

    def _load_chunk(self, address: int, digest: bytes, target: memoryview) -> int:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = zstandard.ZstdDecompressor()
        read_chunk_into(self._store, digest, target, ImageError,
                        f"{self.path}: chunk {digest.hex()} of region {address:#x}",
                        decompressor)
        return len(target)


def read_image(path) -> Image:
    """Read and check the image at `path`: the manifest completely (magic, format version,
    length, checksum, structure) and that every chunk it references exists. Raises
    ImageError saying what is wrong otherwise. Reads no region: see Image.read_region."""
    path = os.fspath(path)
    body, manifest_bytes = _load_manifest(path)
    store = os.path.join(os.path.dirname(os.path.abspath(path)), STORE)
    stored = 0
    seen: set[bytes] = set()
    for address, _, digests in body["regions"]:
        for digest in digests:
            if digest in seen:
                continue
            seen.add(digest)
            try:
                stored += os.stat(chunk_path(store, digest)).st_size
            except FileNotFoundError:
                raise ImageError(f"{path}: chunk {digest.hex()} of region {address:#x} is "
                                 f"missing from {store}") from None
            except OSError as exc:
                raise ImageError(f"{path}: chunk {digest.hex()} of region {address:#x} "
                                 f"cannot be read: {exc.strerror}") from None
    return Image(path, body, manifest_bytes, stored)


def _load_manifest(path: str) -> tuple[dict, int]:
    """The checked body of the manifest at `path`, and the manifest's size."""
    encoded, size = read_framed(path, MAGIC, FORMAT_VERSION, ImageError, "checkpoint image",
                                "checkpoint")
    try:
        body = msgpack.unpackb(encoded, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        raise ImageError(f"{path} is corrupt (its body does not decode)") from None
    _check_body(path, body)
    return body, size


_FIELDS = {"format": int, "vgpu": str, "created": (int, float), "chunk_bytes": int,
           "hash": str, "compression": str, "state": dict, "regions": list}


def _check_body(path: str, body) -> None:
    def corrupt(why: str) -> ImageError:
        return ImageError(f"{path} is corrupt ({why})")

    if not isinstance(body, dict):
        raise corrupt("its body is not a map")
    for key, kind in _FIELDS.items():
        if not isinstance(body.get(key), kind):
            raise corrupt(f"{key!r} is missing or of the wrong type")
    if body["format"] != FORMAT_VERSION:
        raise corrupt(f"its header says format {FORMAT_VERSION}, its body {body['format']}")
    if (body["hash"], body["compression"]) != ("sha256", "zstd"):
        raise ImageError(f"{path} uses {body['hash']} and {body['compression']}; this vgpu "
                         "reads sha256 and zstd")
    step = body["chunk_bytes"]
    if step <= 0:
        raise corrupt(f"chunk size {step}")
    for region in body["regions"]:
        if not (isinstance(region, list) and len(region) == 3
                and isinstance(region[0], int) and region[0] >= 0
                and isinstance(region[1], int) and region[1] >= 0
                and isinstance(region[2], list)):
            raise corrupt(f"a region is malformed: {region!r:.80}")
        address, size, digests = region
        if len(digests) != -(-size // step):
            raise corrupt(f"region {address:#x} of {size} bytes has {len(digests)} chunks")
        if not all(isinstance(d, bytes) and len(d) == DIGEST_BYTES for d in digests):
            raise corrupt(f"region {address:#x} has a malformed chunk digest")


def chunk_digests(buffer) -> list[bytes]:
    """The sha256 digest of each CHUNK_BYTES piece of `buffer` (the last may be short): the
    names its chunks have in an image, so that two versions of a region can be compared
    piece by piece."""
    view = _bytes_view(0, buffer)
    jobs = (functools.partial(_sha256, view[offset:offset + CHUNK_BYTES])
            for offset in range(0, len(view), CHUNK_BYTES))
    if len(view) <= CHUNK_BYTES:
        return [job() for job in jobs]
    with ThreadPoolExecutor(_THREADS, thread_name_prefix="vgpu-image") as pool:
        return list(_in_order(pool, jobs))


def _sha256(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()
