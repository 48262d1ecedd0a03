"""What checkpoint images and traces share on disk: a store of content-named chunks, files
written atomically, and framed manifests.

A chunk is the zstd frame (checksummed) of some bytes, stored under the sha256 of those
bytes at `<store>/<first two hex digits>/<64 hex digits>`: a piece of data is stored once
however often it is written. A manifest is MAGIC, a format version (u32, little-endian),
the body's length (u64), the body (msgpack) and the sha256 of the body.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import struct

import zstandard

__all__ = ["STORE", "TEMP", "DIGEST_BYTES", "chunk_path", "write_file", "write_temporary",
           "fsync_file", "fsync_folder", "frame", "read_framed", "vgpu_version",
           "read_chunk_into"]

STORE = ".vgpu-chunks"
TEMP = ".vgpu-tmp-"  # prefix of files being written; any found under the writers' lock are stale
DIGEST_BYTES = 32
HEADER = struct.Struct("<8sIQ")  # magic, format version, body length
FRAME_HEADER_MAX = 18  # bytes: zstd's ZSTD_FRAMEHEADERSIZE_MAX


def chunk_path(store: str, digest: bytes) -> str:
    name = digest.hex()
    return os.path.join(store, name[:2], name)


def write_file(folder: str, name: str, data) -> None:
    """`data` as folder/name, atomically: a temporary file, fsynced, renamed over the name.
    The temporary file is removed on any failure."""
    temp = write_temporary(folder, data)
    try:
        fsync_file(temp)
        os.rename(temp, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_temporary(folder: str, data) -> str:
    """`data` in a new temporary file in `folder` (not synced); its path. Removed on any
    failure; one left by a crash is removed by the next image writer."""
    temp = os.path.join(folder, TEMP + secrets.token_hex(8))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            # Start writing it to the disk now, while the next chunks are prepared: Linux
            # begins writeback of a file's dirty pages on this advice (and drops them from
            # the cache once written), so the final sync waits for little.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return temp


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def frame(magic: bytes, version: int, encoded: bytes) -> bytes:
    """The manifest holding the msgpack body `encoded`."""
    return (HEADER.pack(magic, version, len(encoded)) + encoded
            + hashlib.sha256(encoded).digest())


def read_framed(path: str, magic: bytes, version: int, error: type[Exception],
                what: str, reading: str) -> tuple[bytes, int]:
    """The checked body of the manifest at `path` (still encoded), and the manifest's size.
    Raises `error` naming the file: "PATH is not a vgpu {what}", truncated, corrupt, of
    another version, or "cannot read {reading} PATH: why"."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER.size)
            if head[:len(magic)] != magic:
                if head and len(head) < len(magic) and magic.startswith(head):
                    raise error(f"{path} is truncated ({size} bytes)")
                raise error(f"{path} is not a vgpu {what}")
            if len(head) < HEADER.size:
                raise error(f"{path} is truncated ({size} bytes, shorter than a header)")
            _, found, length = HEADER.unpack(head)
            if found != version:
                upgrade = " (upgrade vgpu)" if found > version else ""
                raise error(f"{path} has format version {found}; this vgpu reads "
                            f"version {version}{upgrade}")
            expected = HEADER.size + length + DIGEST_BYTES
            if size < expected:
                raise error(f"{path} is truncated ({size} bytes; its header says {expected})")
            if size > expected:
                raise error(f"{path} is corrupt ({size - expected} bytes past its end)")
            encoded = f.read(length)
            checksum = f.read(DIGEST_BYTES)
    except OSError as exc:
        raise error(f"cannot read {reading} {path}: {exc.strerror}") from None
    if hashlib.sha256(encoded).digest() != checksum:
        raise error(f"{path} is corrupt (checksum mismatch)")
    return encoded, size


def read_chunk_into(store: str, digest: bytes, target: memoryview, error: type[Exception],
                    where: str, decompressor: zstandard.ZstdDecompressor) -> None:
    """Fill `target` with the bytes stored as chunk `digest`, which must be exactly as many,
    straight from the file a little at a time: no copy of the whole chunk in between (whose
    fresh pages would cost as much as the chunk's own). zstd checks the frame's checksum as
    the frame ends. `error`, starting with `where`, if the chunk is missing or damaged."""
    try:
        with open(chunk_path(store, digest), "rb") as f:
            # The frame says how large it unpacks to: checked first, so that a damaged one
            # cannot make us write past the chunk's place.
            header = f.read(FRAME_HEADER_MAX)
            if zstandard.frame_content_size(header) != len(target):
                raise error(f"{where} is corrupt (wrong size)")
            if not zstandard.get_frame_parameters(header).has_checksum:
                raise error(f"{where} is corrupt (no checksum of its contents)")
            f.seek(0)
            with decompressor.stream_reader(f, read_size=1 << 18) as reader:
                filled = 0
                while filled < len(target):
                    n = reader.readinto(target[filled:])
                    if not n:
                        break
                    filled += n
                # Reading on to the frame's end makes zstd check its checksum.
                complete = filled == len(target) and not reader.read(1)
    except FileNotFoundError:
        raise error(f"{where} is missing from {store}") from None
    except zstandard.ZstdError:
        raise error(f"{where} is corrupt (checksum mismatch)") from None
    except OSError as exc:
        raise error(f"{where} cannot be read: {exc.strerror}") from None
    if not complete:
        raise error(f"{where} is corrupt (truncated)")


@functools.cache
def vgpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vgpu")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
