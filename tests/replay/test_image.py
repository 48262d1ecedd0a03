"""Checkpoint images on disk: what is written reads back, what did not change is not written
again, and every damaged, foreign or half-written image is refused with a message that
names the file, while the previous image survives any failed write."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import struct
import tempfile
import threading
from pathlib import Path
from unittest import mock

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu.replay import image as image_module
from vgpu.replay.image import (
    CHUNK_BYTES,
    FORMAT_VERSION,
    ImageError,
    chunk_digests,
    read_image,
    write_image,
)


def noise(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def read_all(image) -> list[bytes]:
    contents = []
    for index, (_, size) in enumerate(image.regions):
        out = bytearray(size)
        image.read_region(index, out)
        contents.append(bytes(out))
    return contents


def chunk_files(folder: Path) -> set[str]:
    return {p.name for p in (folder / ".vgpu-chunks").glob("??/*")}


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith(".vgpu-tmp-")]


def test_regions_and_state_read_back_as_written(tmp_path):
    regions = [
        (0x7F00_0000_0000, noise(3 * CHUNK_BYTES + 17, 1)),  # several chunks, a short last
        (0x7F00_0100_0000, noise(1, 2)),
        (0x7F00_0200_0000, noise(CHUNK_BYTES - 1, 3)),  # just under one chunk
        (0x7F00_0300_0000, b""),
        (0x10, bytes(2 * CHUNK_BYTES)),  # zeroed memory: the same chunk twice
    ]
    state = {"journal": [["cuMemAlloc_v2", [0x7F00_0000_0000, 17]]], 3: b"\x00\xff",
             "nested": {"list": [1.5, None, True]}}
    stats = write_image(tmp_path / "a.vgpu", state, regions)

    image = read_image(tmp_path / "a.vgpu")
    assert image.state == state
    assert image.regions == [(address, len(data)) for address, data in regions]
    assert read_all(image) == [data for _, data in regions]
    assert stats.bytes_total == sum(len(data) for _, data in regions)
    assert stats.chunks == 4 + 1 + 1 + 0 + 2
    assert stats.chunks_written == 7  # the two zeroed chunks are one
    assert image.bytes_on_disk == stats.image_bytes == stats.bytes_written
    assert image.vgpu_version


def test_an_empty_state_and_no_regions_make_an_image(tmp_path):
    write_image(tmp_path / "empty.vgpu", {}, [])
    image = read_image(tmp_path / "empty.vgpu")
    assert (image.state, image.regions) == ({}, [])


def test_typed_buffers_are_stored_as_their_bytes(tmp_path):
    numbers = memoryview(bytearray(noise(4000, 4))).cast("f")
    write_image(tmp_path / "f.vgpu", {}, [(0x1000, numbers)])
    out = bytearray(4000)
    read_image(tmp_path / "f.vgpu").read_region(0, memoryview(out).cast("f"))
    assert out == numbers.tobytes()


def test_progress_counts_up_to_the_total(tmp_path):
    seen = []
    stats = write_image(tmp_path / "p.vgpu", {}, [(0, noise(2 * CHUNK_BYTES + 5)), (1 << 30, b"x")],
                        progress=lambda done, total: seen.append((done, total)))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (stats.bytes_total, stats.bytes_total)
    read = []
    read_image(tmp_path / "p.vgpu").read_region(0, bytearray(2 * CHUNK_BYTES + 5),
                                                 progress=lambda d, t: read.append((d, t)))
    assert read[-1] == (2 * CHUNK_BYTES + 5, 2 * CHUNK_BYTES + 5)


def test_a_rewrite_stores_only_the_chunks_that_changed(tmp_path):
    regions = [(0x1000_0000 * i, bytearray(noise(3 * CHUNK_BYTES, i))) for i in range(6)]
    first = write_image(tmp_path / "s.vgpu", {"n": 1}, regions)
    assert first.chunks_written == 18

    regions[4][1][CHUNK_BYTES + 10] ^= 0xFF  # one byte of the middle chunk of one region
    second = write_image(tmp_path / "s.vgpu", {"n": 2}, regions)
    assert (second.chunks, second.chunks_written) == (18, 1)
    manifest = (tmp_path / "s.vgpu").stat().st_size
    # One chunk of noise, which zstd stores as it is, plus its frame's few bytes.
    assert CHUNK_BYTES // 2 < second.bytes_written - manifest <= CHUNK_BYTES * 1.01
    assert second.image_bytes == first.image_bytes  # a chunk of noise for another
    image = read_image(tmp_path / "s.vgpu")
    assert image.state == {"n": 2}
    assert read_all(image) == [bytes(data) for _, data in regions]
    # The chunk it replaced was referenced by no manifest any more, so it is gone.
    assert len(chunk_files(tmp_path)) == 18

    third = write_image(tmp_path / "s.vgpu", {"n": 3}, regions)
    assert third.chunks_written == 0
    assert third.bytes_written == (tmp_path / "s.vgpu").stat().st_size


def test_clean_up_keeps_the_chunks_of_other_images_in_the_folder(tmp_path):
    shared, only_a, only_b = noise(CHUNK_BYTES, 1), noise(CHUNK_BYTES, 2), noise(100, 3)
    write_image(tmp_path / "a.vgpu", {}, [(0, shared), (CHUNK_BYTES, only_a)])
    write_image(tmp_path / "b.vgpu", {}, [(0, shared), (CHUNK_BYTES, only_b)])
    (tmp_path / "notes.txt").write_text("not an image")
    assert len(chunk_files(tmp_path)) == 3

    write_image(tmp_path / "a.vgpu", {}, [(0, noise(10, 4))])  # a no longer needs its chunks
    assert chunk_files(tmp_path) == {hashlib.sha256(d).hexdigest()
                                     for d in (shared, only_b, noise(10, 4))}
    assert read_all(read_image(tmp_path / "b.vgpu")) == [shared, only_b]


def test_clean_up_deletes_nothing_while_a_manifest_in_the_folder_is_unreadable(tmp_path):
    write_image(tmp_path / "a.vgpu", {}, [(0, noise(100, 1))])
    write_image(tmp_path / "b.vgpu", {}, [(0, noise(100, 2))])
    damaged = bytearray((tmp_path / "b.vgpu").read_bytes())
    damaged[-1] ^= 1
    (tmp_path / "b.vgpu").write_bytes(damaged)
    write_image(tmp_path / "a.vgpu", {}, [(0, noise(100, 3))])
    assert len(chunk_files(tmp_path)) == 3  # b's chunk may still be wanted


def test_two_writers_into_one_folder_both_succeed(tmp_path):
    errors = []

    def writer(name: str, seed: int) -> None:
        try:
            for round_ in range(3):
                write_image(tmp_path / name, {"round": round_},
                            [(0, noise(CHUNK_BYTES + 7, seed + round_)), (1 << 32, bytes(999))])
        except Exception as exc:  # reported below, with the other thread's outcome
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n, s))
               for n, s in (("x.vgpu", 10), ("y.vgpu", 20))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for name, seed in (("x.vgpu", 10), ("y.vgpu", 20)):
        assert read_all(read_image(tmp_path / name)) == [noise(CHUNK_BYTES + 7, seed + 2),
                                                          bytes(999)]
    assert len(chunk_files(tmp_path)) == 2 * 2 + 1


def test_memory_that_changes_while_it_is_written_never_gives_a_damaged_chunk(tmp_path,
                                                                           monkeypatch):
    region = bytearray(noise(CHUNK_BYTES, 1))
    real_sha256 = hashlib.sha256

    def sha256_then_a_kernel_writes(data=b""):
        digest = real_sha256(data)
        region[:8] = noise(8, len(region))  # the region changes right after it was hashed
        return digest

    monkeypatch.setattr(image_module.hashlib, "sha256", sha256_then_a_kernel_writes)
    write_image(tmp_path / "m.vgpu", {}, [(0, region)])
    monkeypatch.undo()
    image = read_image(tmp_path / "m.vgpu")
    assert read_all(image) == [noise(CHUNK_BYTES, 1)]  # what was hashed is what was stored


# ----------------------------------------------------------------- refusals

@pytest.fixture
def image_file(tmp_path) -> Path:
    path = tmp_path / "x.vgpu"
    write_image(path, {"k": "v"}, [(0x7000, noise(CHUNK_BYTES + 3)), (0x9000, b"tail")])
    return path


def refusal(path) -> str:
    with pytest.raises(ImageError) as caught:
        read_image(path)
    return str(caught.value)


def test_a_changed_manifest_byte_is_refused_as_corrupt(image_file):
    data = bytearray(image_file.read_bytes())
    data[40] ^= 0x01
    image_file.write_bytes(data)
    assert refusal(image_file) == f"{image_file} is corrupt (checksum mismatch)"


def test_a_truncated_manifest_is_refused(image_file):
    data = image_file.read_bytes()
    for length in (len(data) - 1, 30, 12, 5):
        image_file.write_bytes(data[:length])
        message = refusal(image_file)
        assert message.startswith(f"{image_file} is truncated ("), message


def test_bytes_past_the_end_are_refused(image_file):
    image_file.write_bytes(image_file.read_bytes() + b"\n")
    assert refusal(image_file) == f"{image_file} is corrupt (1 bytes past its end)"


def test_a_newer_format_asks_for_a_newer_vgpu(image_file):
    data = bytearray(image_file.read_bytes())
    struct.pack_into("<I", data, 8, 7)
    image_file.write_bytes(data)
    assert refusal(image_file) == (f"{image_file} has format version 7; this vgpu reads "
                                   f"version {FORMAT_VERSION} (upgrade vgpu)")


@pytest.mark.parametrize("content", [b"", b"#!/bin/sh\necho hello\n", b"\x7fELF" + bytes(60)])
def test_other_files_are_not_images(tmp_path, content):
    path = tmp_path / "other.vgpu"
    path.write_bytes(content)
    assert refusal(path) == f"{path} is not a vgpu checkpoint image"


def test_a_missing_file_or_a_folder_is_refused(tmp_path):
    assert refusal(tmp_path / "none.vgpu") == (
        f"cannot read checkpoint {tmp_path / 'none.vgpu'}: No such file or directory")
    assert refusal(tmp_path) == f"cannot read checkpoint {tmp_path}: Is a directory"


def test_a_body_that_is_not_msgpack_is_refused_without_msgpack_internals(tmp_path):
    body = b"\xc1" * 10  # 0xc1 is never used in msgpack
    path = tmp_path / "odd.vgpu"
    path.write_bytes(struct.pack("<8sIQ", b"VGPUIMG\x00", 1, len(body)) + body
                     + hashlib.sha256(body).digest())
    assert refusal(path) == f"{path} is corrupt (its body does not decode)"


def test_a_body_of_the_wrong_shape_is_refused(tmp_path):
    import msgpack

    body = msgpack.packb({"format": 1, "regions": "none"})
    path = tmp_path / "odd.vgpu"
    path.write_bytes(struct.pack("<8sIQ", b"VGPUIMG\x00", 1, len(body)) + body
                     + hashlib.sha256(body).digest())
    assert refusal(path).startswith(f"{path} is corrupt (")


def test_a_missing_chunk_is_found_before_anything_is_read(image_file):
    digest = hashlib.sha256(b"tail").hexdigest()
    (image_file.parent / ".vgpu-chunks" / digest[:2] / digest).unlink()
    message = refusal(image_file)
    assert message.startswith(f"{image_file}: chunk {digest} of region 0x9000 is missing")


@pytest.mark.parametrize("damage", ["garbage", "other data", "one flipped byte"])
def test_a_damaged_chunk_is_refused_when_its_region_is_read(image_file, damage):
    digest = hashlib.sha256(b"tail").hexdigest()
    chunk = image_file.parent / ".vgpu-chunks" / digest[:2] / digest
    if damage == "garbage":
        chunk.write_bytes(b"garbage")
    elif damage == "other data":  # well-formed zstd, the right size, the wrong bytes
        chunk.write_bytes(zstandard.ZstdCompressor().compress(b"TAIL"))
    else:
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0x40
        chunk.write_bytes(data)
    image = read_image(image_file)  # the manifest is fine and the chunk is there
    with pytest.raises(ImageError) as caught:
        image.read_region(1, bytearray(4))
    assert str(caught.value).startswith(f"{image_file}: chunk {digest} of region 0x9000 is "
                                        "corrupt (")
    intact = bytearray(CHUNK_BYTES + 3)
    image.read_region(0, intact)  # the other region is fine
    assert intact == noise(CHUNK_BYTES + 3)


def test_a_buffer_of_the_wrong_size_or_read_only_is_a_caller_error(image_file):
    image = read_image(image_file)
    with pytest.raises(ValueError, match="holds 4 bytes; the buffer given for it holds 5"):
        image.read_region(1, bytearray(5))
    with pytest.raises(ValueError, match="writable"):
        image.read_region(1, b"1234")


def test_a_state_that_cannot_be_stored_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ImageError, match="its state cannot be stored"):
        write_image(tmp_path / "s.vgpu", {"x": object()}, [(0, b"data")])
    assert not (tmp_path / "s.vgpu").exists()
    assert chunk_files(tmp_path) == set()


def test_a_negative_address_is_a_caller_error(tmp_path):
    with pytest.raises(ValueError, match="address"):
        write_image(tmp_path / "s.vgpu", {}, [(-1, b"data")])


# ----------------------------------------------------------------- failed writes

def failing_os_write(monkeypatch, fail_when):
    """os.write raising ENOSPC once `fail_when(data)` says so, as a disk that fills up."""
    real_write = os.write

    def write(fd, data):
        if fail_when(bytes(memoryview(data)[:8])):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def previous_image(tmp_path) -> tuple[Path, list[bytes], set[str]]:
    path = tmp_path / "x.vgpu"
    contents = [noise(2 * CHUNK_BYTES, 1), noise(1000, 2)]
    write_image(path, {"n": 1}, list(zip((0x1000, 0x2000), contents, strict=True)))
    return path, contents, chunk_files(tmp_path)


@pytest.mark.parametrize("fails", ["a chunk", "the manifest"])
def test_a_full_disk_mid_write_keeps_the_previous_image(tmp_path, monkeypatch, fails):
    path, contents, chunks = previous_image(tmp_path)
    calls = []
    if fails == "a chunk":  # the third new chunk: two are stored already
        failing_os_write(monkeypatch, lambda head: calls.append(head) or len(calls) >= 3)
    else:
        failing_os_write(monkeypatch, lambda head: head == b"VGPUIMG\x00")
    new = [(0x1000, noise(2 * CHUNK_BYTES, 3)), (0x2000, noise(1000, 4)), (0x3000, b"x" * 99)]
    with pytest.raises(ImageError) as caught:
        write_image(path, {"n": 2}, new)
    assert str(caught.value) == (f"cannot write checkpoint {path}: No space left on device; "
                                 "the previous checkpoint is intact")
    monkeypatch.undo()
    image = read_image(path)
    assert (image.state, read_all(image)) == ({"n": 1}, contents)
    assert leftovers(tmp_path) == []
    assert chunk_files(tmp_path) == chunks  # what the failed write stored is gone again


def test_a_full_disk_on_the_first_write_says_that_nothing_was_written(tmp_path, monkeypatch):
    failing_os_write(monkeypatch, lambda head: True)
    with pytest.raises(ImageError, match="nothing was written|no checkpoint was written"):
        write_image(tmp_path / "x.vgpu", {}, [(0, b"abc")])
    monkeypatch.undo()
    assert not (tmp_path / "x.vgpu").exists()
    assert leftovers(tmp_path) == [] and chunk_files(tmp_path) == set()


def test_a_folder_that_refuses_the_manifest_keeps_the_previous_image(tmp_path, monkeypatch):
    """A read-only folder (simulated: root, who runs CI, writes into any folder a mode
    forbids): the chunks' folder takes writes, the manifest's folder does not."""
    path, contents, chunks = previous_image(tmp_path)
    real_open = os.open

    def read_only_folder(file, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.path.dirname(file) == str(tmp_path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), file)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_folder)
    with pytest.raises(ImageError, match=f"cannot write checkpoint {path}: Read-only file "
                                         "system.*; the previous checkpoint is intact"):
        write_image(path, {"n": 2}, [(0x1000, noise(10, 9))])
    monkeypatch.undo()
    assert read_all(read_image(path)) == contents
    assert chunk_files(tmp_path) == chunks


# ----------------------------------------------------------------- digests, properties

def test_chunk_digests_name_each_chunk_of_a_buffer():
    data = noise(2 * CHUNK_BYTES + 1)
    assert chunk_digests(data) == [hashlib.sha256(data[o:o + CHUNK_BYTES]).digest()
                                   for o in (0, CHUNK_BYTES, 2 * CHUNK_BYTES)]
    assert chunk_digests(b"") == []


def test_chunk_digests_are_the_names_an_image_gives_its_chunks(tmp_path):
    data = noise(CHUNK_BYTES + 10)
    write_image(tmp_path / "d.vgpu", {}, [(0, data)])
    assert {d.hex() for d in chunk_digests(data)} == chunk_files(tmp_path)


@settings(max_examples=40, deadline=None)
@given(regions=st.lists(st.tuples(st.integers(0, 2**48), st.binary(max_size=300)), max_size=5),
       state=st.dictionaries(st.text(max_size=5),
                             st.integers(-2**63, 2**64 - 1) | st.binary(max_size=8), max_size=4),
       chunk=st.sampled_from([1, 7, 64]))
def test_any_regions_read_back_whatever_the_chunk_size(regions, state, chunk):
    with tempfile.TemporaryDirectory() as folder, \
            mock.patch.object(image_module, "CHUNK_BYTES", chunk):
        path = os.path.join(folder, "p.vgpu")
        write_image(path, state, regions)
        image = read_image(path)
        assert image.state == state
        assert image.regions == [(a, len(d)) for a, d in regions]
        assert read_all(image) == [d for _, d in regions]
