"""vgpu.fatbin against what nvcc 13 really embeds in executables.

Each build's `.nv_fatbin` section is read with vgpu's own ELF reader. The section holds one
container per `__cudaRegisterFatBinary` wrapper, back to back: the device-link image first,
then the translation unit's own.
"""

from __future__ import annotations

import ctypes
import re
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpu.binary_check import ElfFile
from vgpu.fatbin import (
    CONTAINER_MAGIC,
    MAX_ENTRY_BYTES,
    WRAPPER_MAGIC,
    EntryFlags,
    EntryKind,
    FatbinEntry,
    FatbinError,
    parse_fatbin,
    prelinked_ptx,
    read_container_at,
    read_wrapper_at,
    require_ptx,
    select_for_device,
    select_ptx,
)

SOURCE = r"""
#include <cstdio>
__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];  // a comment nvcc -ptx keeps and the fatbin drops
}
int main() {
    float *x, *y;
    cudaMalloc(&x, 64);
    cudaMalloc(&y, 64);
    saxpy<<<1, 16>>>(2.0f, x, y, 16);
    printf("%d\n", (int)cudaDeviceSynchronize());
    return 0;
}
"""
NO_PTX = ["-gencode", "arch=compute_90,code=sm_90"]
TWO_ARCHS = ["-gencode", "arch=compute_75,code=compute_75",
             "-gencode", "arch=compute_86,code=[sm_86,compute_86]"]


def section(path, name=".nv_fatbin") -> bytes:
    with ElfFile.open(path) as elf:
        return elf.section_data(name)


def fatbin(toolkit, flags=None) -> list[FatbinEntry]:
    return parse_fatbin(section(toolkit.executable(SOURCE, flags)))


def ptx_lines(text: str) -> list[str]:
    """PTX without comments and with whitespace runs collapsed: the fatbin stores it
    minified that way, keeping the line structure."""
    return [" ".join(re.sub(r"//.*", "", line).split()) for line in text.rstrip().splitlines()]


def only(entries, kind, arch=None) -> FatbinEntry:
    found = [e for e in entries if e.kind == kind and arch in (None, e.arch)]
    assert len(found) == 1, entries
    return found[0]


def test_default_build_embeds_compute_75_ptx_zstd_compressed(toolkit):
    entries = fatbin(toolkit)
    ptx = only(entries, EntryKind.PTX)
    assert (ptx.arch, ptx.version) == (75, (9, 0))
    assert ptx.flags == EntryFlags.ADDRESS_64BIT | EntryFlags.HOST_LINUX | \
        EntryFlags.COMPRESSED_ZSTD
    assert ptx.compressed and len(ptx.payload()) == ptx.uncompressed_size
    assert ptx_lines(select_ptx(entries)) == ptx_lines(toolkit.ptx(SOURCE, "compute_75"))
    # The cubins (device-link image and sm_75 code) are stored plain, as ELF files.
    cubins = [e for e in entries if e.kind == EntryKind.CUBIN]
    assert [(e.arch, e.version, e.compressed) for e in cubins] == [(75, (1, 8), False)] * 2
    assert all(e.payload().startswith(b"\x7fELF") for e in cubins)


def test_uncompressed_and_lz4_builds_hold_the_same_ptx(toolkit):
    zstd = only(fatbin(toolkit), EntryKind.PTX)
    plain = only(fatbin(toolkit, ["--no-compress"]), EntryKind.PTX)
    lz4 = only(fatbin(toolkit, ["--compress-mode=speed"]), EntryKind.PTX)
    assert not plain.compressed and plain.uncompressed_size == 0
    assert lz4.flags & EntryFlags.COMPRESSED_LZ4 and not lz4.flags & EntryFlags.COMPRESSED_ZSTD
    # Plain payloads keep the NUL terminator plus padding to 8 bytes; ptx_text drops them.
    assert plain.payload().rstrip(b"\0") == zstd.payload().rstrip(b"\0")
    assert plain.payload().endswith(b"\0") and len(plain.payload()) % 8 == 0
    assert plain.ptx_text() == zstd.ptx_text() == lz4.ptx_text()
    assert "\0" not in plain.ptx_text()


def test_cubin_only_build_has_no_ptx_and_says_how_to_rebuild(toolkit):
    entries = fatbin(toolkit, NO_PTX)
    assert {(e.kind, e.arch) for e in entries} == {(EntryKind.CUBIN, 90)}
    assert select_ptx(entries) is None
    with pytest.raises(FatbinError, match=r"no PTX \(only cubin sm_90\).*emu backend needs "
                                          r"PTX.*arch=compute_90,code=compute_90"):
        require_ptx(entries)
    assert select_for_device(entries, 90).kind == EntryKind.CUBIN
    with pytest.raises(FatbinError, match="no code in this binary runs on sm_75"):
        select_for_device(entries, 75)


def test_several_gencodes_share_one_container_and_the_highest_ptx_wins(toolkit):
    data = section(toolkit.executable(SOURCE, TWO_ARCHS))
    entries = parse_fatbin(data)
    own = parse_fatbin(data[container_offsets(data)[-1]:])
    assert len(container_offsets(data)) == 2  # the device-link image, then this unit's
    assert sorted((e.kind, e.arch) for e in own) == [
        (EntryKind.PTX, 75), (EntryKind.PTX, 86), (EntryKind.CUBIN, 86)]
    assert ptx_lines(select_ptx(entries)) == ptx_lines(toolkit.ptx(SOURCE, "compute_86"))
    assert select_ptx(entries) == only(entries, EntryKind.PTX, 86).ptx_text()
    # a compute capability 8.0 device (the emulator's) runs the compute_75 PTX, as a GPU
    assert select_ptx(entries, 80) == only(entries, EntryKind.PTX, 75).ptx_text()
    assert select_ptx(entries, 70) is None
    with pytest.raises(FatbinError, match=r"newer than the device's \(compute_70\)"):
        require_ptx(entries, 70)
    chosen = {sm: select_for_device(own, sm) for sm in (75, 80, 86, 89, 90)}
    assert {sm: (e.kind, e.arch) for sm, e in chosen.items()} == {
        75: (EntryKind.PTX, 75),
        80: (EntryKind.PTX, 75),
        86: (EntryKind.CUBIN, 86),
        89: (EntryKind.CUBIN, 86),  # cubins run on later minors of their major
        90: (EntryKind.PTX, 86),
    }


def container_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        _, _, header_size, size = struct.unpack_from("<IHHQ", data, pos)
        pos += header_size + size
    return offsets


def test_each_wrapper_points_at_one_container_of_the_section(toolkit):
    """The `.nvFatBinSegment` wrappers' data pointers (link-time addresses, which the linker
    also writes in place for PIE relocations) start the section's containers, in order."""
    with ElfFile.open(toolkit.executable(SOURCE)) as elf:
        segment = elf.section_data(".nvFatBinSegment")
        data, base = elf.section_data(".nv_fatbin"), elf.section(".nv_fatbin").address
    wrappers = [struct.unpack_from("<IIQQ", segment, pos) for pos in range(0, len(segment), 24)]
    assert [(magic, version) for magic, version, _, _ in wrappers] == [
        (WRAPPER_MAGIC, 2), (WRAPPER_MAGIC, 1)]  # device-link image, translation unit
    assert [ptr - base for _, _, ptr, _ in wrappers] == container_offsets(data)


def test_rdc_build_registers_a_linked_cubin_and_keeps_ptx_per_object(toolkit):
    path = toolkit.executable(SOURCE, ["-rdc=true"])
    linked = parse_fatbin(section(path))
    assert {e.kind for e in linked} == {EntryKind.CUBIN}
    relocatable = parse_fatbin(section(path, "__nv_relfatbin"))
    assert ".entry _Z5saxpyfPKfPfi(" in require_ptx(relocatable)


def test_read_wrapper_and_container_from_memory(toolkit):
    data = section(toolkit.executable(SOURCE))
    first, second = container_offsets(data)
    buffer = ctypes.create_string_buffer(data, len(data))
    base = ctypes.addressof(buffer)
    # One container only: the next one in memory belongs to another wrapper.
    assert read_container_at(base) == data[:second]
    wrapper = struct.pack("<IIQQ", WRAPPER_MAGIC, 1, base + second, 0)
    wrapper_buffer = ctypes.create_string_buffer(wrapper, len(wrapper))
    read = read_wrapper_at(ctypes.addressof(wrapper_buffer))
    assert (read.version, read.data_address, read.container) == (1, base + second, data[second:])
    assert select_ptx(parse_fatbin(read.container)) == select_ptx(parse_fatbin(data))


def test_a_device_link_image_leads_to_its_objects_ptx(toolkit):
    """A version-2 wrapper's list of prelinked containers (what an -rdc program's stubs
    fill) gives each object's PTX; any other wrapper, or no wrapper, gives none; an object
    without PTX is an error saying how to rebuild."""
    relocatable = section(toolkit.executable(SOURCE, ["-rdc=true"]), "__nv_relfatbin")
    sass_only = section(toolkit.executable(SOURCE, ["-rdc=true", *NO_PTX]), "__nv_relfatbin")
    keep = []

    def wrapper(version: int, *containers: bytes) -> int:
        buffers = [ctypes.create_string_buffer(c, len(c)) for c in containers]
        array = (ctypes.c_uint64 * (len(buffers) + 1))(*map(ctypes.addressof, buffers), 0)
        packed = struct.pack("<IIQQ", WRAPPER_MAGIC, version, 0, ctypes.addressof(array))
        keep.extend([buffers, array, ctypes.create_string_buffer(packed, len(packed))])
        return ctypes.addressof(keep[-1])

    ptx = prelinked_ptx(wrapper(2, relocatable, relocatable), 80)
    assert len(ptx) == 2 and all(".entry _Z5saxpyfPKfPfi(" in text for text in ptx)
    assert prelinked_ptx(wrapper(1, relocatable)) == []
    assert prelinked_ptx(ctypes.addressof(ctypes.create_string_buffer(b".version 9.0"))) == []
    with pytest.raises(FatbinError, match="no PTX"):
        prelinked_ptx(wrapper(2, relocatable, sass_only))


def test_bad_memory_images_are_refused():
    with pytest.raises(FatbinError, match="NULL"):
        read_wrapper_at(0)
    with pytest.raises(FatbinError, match="NULL"):
        read_container_at(0)
    junk = ctypes.create_string_buffer(b"\x01" * 32)
    with pytest.raises(FatbinError, match="no fatbin wrapper"):
        read_wrapper_at(ctypes.addressof(junk))
    with pytest.raises(FatbinError, match="no fatbin container"):
        read_container_at(ctypes.addressof(junk))


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(body)) + body


def entry(kind: int, payload: bytes, flags: int = 0x11, compressed_size: int = 0,
          uncompressed: int = 0, arch: int = 75) -> bytes:
    header = bytearray(0x40)
    struct.pack_into("<HHIQIIHHI", header, 0, kind, 0x0101, 0x40, len(payload),
                     compressed_size, 0, 0, 9, arch)
    struct.pack_into("<Q", header, 0x28, flags)
    struct.pack_into("<Q", header, 0x38, uncompressed)
    return bytes(header) + payload


@pytest.mark.parametrize(("data", "message"), [
    (b"", "truncated header"),
    (b"\x00" * 16, "bad magic"),
    (struct.pack("<IIQQ", WRAPPER_MAGIC, 1, 0x1000, 0), "wrapper.*read_wrapper_at"),
    (struct.pack("<IHHQ", CONTAINER_MAGIC, 2, 16, 0), "unsupported container version 2"),
    (struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, 64), "truncated: it declares 80 bytes, 16"),
    (container(b"\x01" * 8), "truncated entry header"),
    (container(entry(1, b"x" * 8)) + b"\x07", "container at offset 88: truncated header"),
    (container(entry(1, b"x" * 8)[:-1]), "runs past the container end"),
    (container(entry(1, b"x" * 8, compressed_size=9)), "compressed size 9 exceeds"),
    (container(entry(1, b"x" * 8, compressed_size=8)), "scheme vgpu does not know"),
])
def test_malformed_containers_get_clear_errors(data, message):
    with pytest.raises(FatbinError, match=message):
        parse_fatbin(data)


def test_trailing_padding_and_unknown_kinds_are_accepted():
    entries = parse_fatbin(container(entry(1, b".version 9.0\0\0\0\0"), entry(16, b"?" * 8))
                           + b"\0" * 8)
    assert [e.kind for e in entries] == [EntryKind.PTX, 16]
    assert entries[0].ptx_text() == ".version 9.0"
    assert "kind 16 sm_75" in entries[1].describe()
    with pytest.raises(FatbinError, match="kind 16 sm_75 is not PTX"):
        entries[1].ptx_text()


@pytest.mark.parametrize(("flags", "message"), [
    (0x8011, "corrupt zstd"),
    (0x2011, "corrupt LZ4"),
    (0x18011, r"stored encoded \(flag 0x10000\)"),
])
def test_corrupt_or_encoded_payloads_fail_when_unpacked(flags, message):
    (bad,) = parse_fatbin(container(entry(8, b"\xff" * 16, flags, 16, 100)))
    with pytest.raises(FatbinError, match=message):
        bad.payload()


def test_declared_size_must_match_the_decompressed_size(toolkit):
    (real,) = [e for e in fatbin(toolkit) if e.kind == EntryKind.PTX]
    stored = real.stored.ljust((len(real.stored) + 7) // 8 * 8, b"\0")
    size = real.uncompressed_size
    (lying,) = parse_fatbin(container(entry(1, stored, 0x8011, len(real.stored), size + 1)))
    with pytest.raises(FatbinError, match=f"decompressed to {size} bytes, the entry header "
                                          f"says {size + 1}"):
        lying.payload()
    (huge,) = parse_fatbin(container(entry(1, b"\0" * 8, 0x2011, 8, 8 * 255 + 100)))
    with pytest.raises(FatbinError, match="cannot expand"):
        huge.payload()


@pytest.mark.parametrize("flags", [0x8011, 0x2011])
def test_an_entry_unpacks_to_at_most_a_bounded_size(flags):
    (huge,) = parse_fatbin(container(entry(1, b"\0" * 8, flags, 8, 1 << 40)))
    with pytest.raises(FatbinError, match=f"holds {1 << 40} bytes; vgpu unpacks at most "
                                          f"{MAX_ENTRY_BYTES}"):
        huge.payload()


def test_a_zstd_entry_that_unpacks_past_its_declared_size_is_refused_as_it_unpacks():
    """A zstd frame of a few KiB can hold gigabytes of zeros: unpacking stops one byte past
    what the entry declares, whatever the frame says."""
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    assert len(bomb) < 64 << 10
    padded = bomb.ljust((len(bomb) + 7) // 8 * 8, b"\0")
    (entry_,) = parse_fatbin(container(entry(1, padded, 0x8011, len(bomb), 4096)))
    with pytest.raises(FatbinError, match="unpacks to more than the 4096 bytes"):
        entry_.payload()


def unpack_all(data: bytes) -> None:
    """Everything a caller may do with a container; only FatbinError may come out."""
    try:
        entries = parse_fatbin(data)
        select_ptx(entries)
        for e in entries:
            e.payload()
            e.describe()
    except FatbinError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_fatbin_error(data):
    unpack_all(data)
    unpack_all(struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(data)) + data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_real_fatbins_only_raise_fatbin_error(toolkit, data):
    real = section(toolkit.executable(SOURCE, ["--compress-mode=speed"]))
    cut = data.draw(st.integers(0, len(real)) | st.just(len(real)))
    damaged = bytearray(real[:cut])
    for _ in range(data.draw(st.integers(0, 8))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    unpack_all(bytes(damaged))


# The server reads fatbins too (the emu backend takes their PTX) but must never need the shim.
SERVER_WITHOUT_SHIM = r"""
import importlib, pkgutil, sys
class NoShim:
    def find_spec(self, name, path=None, target=None):
        if name == "vgpu.shim" or name.startswith("vgpu.shim."):
            raise ImportError(f"the server imported {name}")
sys.meta_path.insert(0, NoShim())
import vgpu.server
for module in pkgutil.walk_packages(vgpu.server.__path__, "vgpu.server."):
    importlib.import_module(module.name)
from vgpu.server.backends.images import decode_image
image = decode_image(open(sys.argv[1], "rb").read())
assert not image.why_no_ptx, image.why_no_ptx
print(image.ptx[0])
"""


def test_the_server_reads_fatbins_without_the_shim(toolkit, tmp_path):
    data = section(toolkit.executable(SOURCE))
    translation_unit = container_offsets(data)[-1]  # the first is the device-link image
    image = tmp_path / "module.fatbin"
    image.write_bytes(data[translation_unit:])
    result = subprocess.run([sys.executable, "-c", SERVER_WITHOUT_SHIM, str(image)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ".entry _Z5saxpyfPKfPfi(" in result.stdout
