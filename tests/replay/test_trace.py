"""Traces on disk: what a recording writes reads back whole, and a damaged, foreign,
truncated or newer trace is refused, naming the file and what is wrong, before anything of
it could run."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest
import zstandard

from vgpu.replay.image import CHUNK_BYTES
from vgpu.replay.store import HEADER, chunk_path, frame
from vgpu.replay.trace import (
    FORMAT_VERSION,
    MAGIC,
    TraceError,
    TraceWriter,
    digest,
    outcome_of,
    read_trace,
)

SESSION = {"id": 3, "token": "ab" * 16, "argv": ["./app", "x"], "pid": 42,
           "memcheck": "report", "backend": "emu", "arena": 1 << 44, "started": 1.5}


def write_trace(folder: Path, full: bool = False, image: bytes = b"ptx text") -> Path:
    writer = TraceWriter(str(folder), SESSION, full)
    writer.add(["cuModuleLoadData", [1, 1, writer.blob(image), len(image)]],
               outcome_of(0, {"kernels": {}}, [], "", "", full, writer.blob))
    big = bytes(range(256)) * (CHUNK_BYTES // 256 + 3)  # two chunks
    writer.add(["cuMemcpyHtoD", [1 << 44, writer.blob(big), len(big)]],
               outcome_of(0, None, [], "", "", full, writer.blob))
    writer.add(["cuMemcpyDtoH", [1 << 44, 4, ["frame"]]],
               outcome_of(0, None, [b"\x01\x02\x03\x04"], "hi\n", "", full, writer.blob))
    writer.finish()
    return folder / f"0003-{'ab' * 16}.trace"


def refusal(path) -> str:
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    return str(caught.value)


def test_a_trace_reads_back_as_written(tmp_path):
    write_trace(tmp_path, full=True)
    trace = read_trace(tmp_path)
    (session,) = trace.sessions
    assert session.session == SESSION and session.full
    ops = [op for op, _, _ in session.calls]
    assert ops == ["cuModuleLoadData", "cuMemcpyHtoD", "cuMemcpyDtoH"]
    assert trace.load(session.calls[0][1][2]) == b"ptx text"
    assert trace.load(session.calls[1][1][1]) == bytes(range(256)) * (CHUNK_BYTES // 256 + 3)
    outcome = session.calls[2][2]
    assert outcome["data"] == [digest(b"\x01\x02\x03\x04")]
    assert outcome["output"] == digest(b"hi\n")
    assert trace.load(outcome["kept"]["data"][0]) == b"\x01\x02\x03\x04"


def test_data_is_stored_once_by_content(tmp_path):
    write_trace(tmp_path, image=bytes(CHUNK_BYTES))
    writer = TraceWriter(str(tmp_path), {**SESSION, "id": 4}, False)
    writer.blob(bytes(CHUNK_BYTES))
    chunks = list((tmp_path / ".vgpu-chunks").rglob("*"))
    # The zeroed chunk, the two of the big copy's, and nothing else.
    assert len([c for c in chunks if c.is_file()]) == 3


def test_sessions_come_in_the_order_they_started(tmp_path):
    for session_id, started in ((1, 9.0), (2, 3.0)):
        writer = TraceWriter(str(tmp_path), {**SESSION, "id": session_id, "started": started},
                             False)
        writer.finish()
    assert [s.session["id"] for s in read_trace(tmp_path).sessions] == [2, 1]


def test_what_is_not_a_trace_is_refused(tmp_path):
    assert refusal(tmp_path / "none") == (
        f"cannot read trace {tmp_path / 'none'}: No such file or directory")
    assert refusal(tmp_path) == f"{tmp_path} is not a vgpu trace (it holds no .trace file)"
    (tmp_path / "file").write_text("x")
    assert refusal(tmp_path / "file") == (
        f"{tmp_path / 'file'} is not a vgpu trace (a trace is a folder)")
    (tmp_path / "x.trace").write_bytes(b"VGPUIMG\0" + bytes(40))
    assert refusal(tmp_path) == f"{tmp_path / 'x.trace'} is not a vgpu trace"


def test_a_truncated_trace_is_refused(tmp_path):
    manifest = write_trace(tmp_path)
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[:-1])
    assert refusal(tmp_path) == (f"{manifest} is truncated ({len(whole) - 1} bytes; its "
                                 f"header says {len(whole)})")
    manifest.write_bytes(whole[:10])
    assert refusal(tmp_path) == f"{manifest} is truncated (10 bytes, shorter than a header)"


def test_a_corrupt_trace_is_refused(tmp_path):
    manifest = write_trace(tmp_path)
    damaged = bytearray(manifest.read_bytes())
    damaged[HEADER.size + 5] ^= 0xFF
    manifest.write_bytes(bytes(damaged))
    assert refusal(tmp_path) == f"{manifest} is corrupt (checksum mismatch)"
    manifest.write_bytes(frame(MAGIC, FORMAT_VERSION, msgpack.packb({"format": 1})))
    assert refusal(tmp_path) == f"{manifest} is corrupt ('vgpu' is missing or of the wrong type)"


def test_a_newer_trace_is_refused(tmp_path):
    manifest = write_trace(tmp_path)
    data = bytearray(manifest.read_bytes())
    struct.pack_into("<I", data, len(MAGIC), FORMAT_VERSION + 1)
    manifest.write_bytes(bytes(data))
    assert refusal(tmp_path) == (f"{manifest} has format version {FORMAT_VERSION + 1}; this "
                                 f"vgpu reads version {FORMAT_VERSION} (upgrade vgpu)")


def test_a_missing_or_damaged_chunk_is_found_before_anything_runs(tmp_path):
    manifest = write_trace(tmp_path)
    chunk = Path(chunk_path(str(tmp_path / ".vgpu-chunks"), digest(b"ptx text")))
    stored = chunk.read_bytes()
    chunk.unlink()
    assert refusal(tmp_path) == (f"{manifest}: call 0: chunk {digest(b'ptx text').hex()} "
                                 f"is missing from {tmp_path / '.vgpu-chunks'}")
    chunk.write_bytes(stored[:-2] + bytes([stored[-2] ^ 1, stored[-1]]))
    assert refusal(tmp_path) == (f"{manifest}: call 0: chunk {digest(b'ptx text').hex()} "
                                 f"is corrupt (checksum mismatch)")
    # Whole and checksummed, but another chunk's contents put in its place.
    chunk.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(b"ptx texT"))
    assert refusal(tmp_path) == (f"{manifest}: call 0: chunk {digest(b'ptx text').hex()} "
                                 f"is corrupt (its contents are not what it is named)")
