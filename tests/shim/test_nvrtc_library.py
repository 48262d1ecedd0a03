"""vgpu's libnvrtc.so.13 over NVIDIA's: what nvrtcGetCUBIN hands back, checked against NVIDIA's
own fatbin writer, and what a program is told when NVIDIA's NVRTC cannot be had.

The library is loaded by its path in a child process (tests/shim/programs/nvrtc_images.py),
so this process never holds a libnvrtc.so.13 that another test's cuda-python would find."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu.fatbin import EntryFlags, EntryKind, parse_fatbin
from vgpu.shim.loader import NVRTC, nvidia_nvrtc

IMAGES = Path(__file__).resolve().parent / "programs" / "nvrtc_images.py"
ELF_MAGIC = b"\x7fELF"
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")  # kind, (0x0101), header size, stored size


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VGPU_NVRTC_LIBRARY", "LD_LIBRARY_PATH")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def nvidia_library() -> Path:
    found = nvidia_nvrtc()
    assert found is not None, "the test extra installs nvidia-cuda-nvrtc"
    return found


def compiled(arch: str, folder: Path, nvidia_library: Path) -> dict[str, bytes]:
    result = subprocess.run([sys.executable, str(IMAGES), arch, str(folder)],
                            capture_output=True, text=True, timeout=120,
                            env=_environment(VGPU_NVRTC_LIBRARY=str(nvidia_library)))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return {name: (folder / name).read_bytes() for name in ("image", "cubin", "ptx")}


def entries_with_headers(fatbin: bytes) -> list[tuple[int, bytes, bytes]]:
    """(kind, header with its stored-size field zeroed, stored payload) per entry."""
    _, _, header_size, size = _CONTAINER.unpack_from(fatbin)
    out, pos = [], header_size
    while pos < header_size + size:
        kind, _, entry_header, stored = _ENTRY.unpack_from(fatbin, pos)
        header = bytearray(fatbin[pos:pos + entry_header])
        header[8:16] = bytes(8)
        out.append((kind, bytes(header), fatbin[pos + entry_header:pos + entry_header + stored]))
        pos += entry_header + stored
    return out


@pytest.mark.parametrize("arch", ["sm_75", "sm_90a"])
def test_a_cubin_comes_back_in_the_fatbin_nvidias_fatbinary_writes_with_its_ptx(
        arch, tmp_path, toolkit, nvidia_library):
    out = compiled(arch, tmp_path, nvidia_library)
    assert out["cubin"][:4] == ELF_MAGIC and out["image"][:4] != ELF_MAGIC
    number = arch.removeprefix("sm_")
    (tmp_path / "nvidia.ptx").write_bytes(out["ptx"].rstrip(b"\0"))
    reference = tmp_path / "reference.fatbin"
    subprocess.run([str(toolkit.nvcc.parent / "fatbinary"), f"--create={reference}", "-64",
                    "--compress-mode=none",
                    f"--image3=kind=elf,sm={number},file={tmp_path / 'cubin'}",
                    f"--image3=kind=ptx,sm={number},file={tmp_path / 'nvidia.ptx'}"],
                   check=True, capture_output=True)
    ours, theirs = entries_with_headers(out["image"]), entries_with_headers(
        reference.read_bytes())
    # Entry by entry the same headers; the cubin is NVRTC's, the PTX NVRTC's whole text
    # (fatbinary drops its comments and indentation, which is why the sizes differ).
    assert [(kind, header) for kind, header, _ in ours] == \
        [(kind, header) for kind, header, _ in theirs]
    assert [kind for kind, _, _ in ours] == [EntryKind.CUBIN, EntryKind.PTX]
    assert ours[0][2] == out["cubin"]
    assert ours[1][2].rstrip(b"\0") == out["ptx"].rstrip(b"\0")
    entries = parse_fatbin(out["image"])
    assert {e.arch for e in entries} == {int(number.rstrip("a"))}
    assert all(bool(e.flags & EntryFlags.ARCH_SPECIFIC) == arch.endswith("a") for e in entries)


def test_what_is_not_an_sm_cubin_is_nvidias_answer(tmp_path, nvidia_library):
    """PTX-only compilations have no cubin; a family target's (sm_XYf) cubin entry carries a
    table vgpu does not write, so NVIDIA's cubin comes back as it is."""
    assert compiled("compute_75", tmp_path, nvidia_library)["image"] == b""
    family = compiled("sm_100f", tmp_path, nvidia_library)
    assert family["image"] == family["cubin"] and family["image"][:4] == ELF_MAGIC


VERSION_PROGRAM = f"""
import ctypes
from vgpu.shim.loader import NVRTC, shim_library_dir
ours = ctypes.CDLL(str(shim_library_dir() / {NVRTC!r}))
major, minor = ctypes.c_int(), ctypes.c_int()
for _ in range(2):
    print(ours.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), major.value)
ours.nvrtcGetErrorString.restype = ctypes.c_char_p
print(ours.nvrtcGetErrorString(11).decode())
"""


def _version_with(library: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", VERSION_PROGRAM], capture_output=True,
                          text=True, timeout=60,
                          env=_environment(VGPU_NVRTC_LIBRARY=library, **env))


def test_nvidias_library_answers_through_vgpus(nvidia_library):
    result = _version_with(str(nvidia_library))
    assert result.stdout.splitlines() == ["0 13", "0 13", "NVRTC_ERROR_INTERNAL_ERROR"]
    assert result.stderr == ""


def test_without_vgpu_run_nvidias_library_is_the_one_behind_on_the_library_path(
        shim_dir, nvidia_library):
    path = f"{shim_dir}:{nvidia_library.parent}"
    result = _version_with("", LD_LIBRARY_PATH=path)
    assert result.stdout.splitlines()[:2] == ["0 13", "0 13"]
    assert result.stderr == ""


@pytest.mark.parametrize("library, said", [
    ("", "NVIDIA's NVRTC (libnvrtc.so.13) was not found"),
    ("/nonexistent/libnvrtc.so.13", "cannot load NVIDIA's NVRTC from /nonexistent"),
    ("OWN", "it is vgpu's own libnvrtc.so.13"),
])
def test_without_nvidias_library_every_call_fails_and_one_line_says_why(shim_dir, library,
                                                                         said):
    result = _version_with(str(shim_dir / NVRTC) if library == "OWN" else library)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["11 0", "11 0"]  # NVRTC_ERROR_INTERNAL_ERROR, nothing written
    assert "NVIDIA's NVRTC library is not available" in lines[2]
    assert result.returncode == 0
    assert result.stderr.count("vgpu:") == 1 and said in result.stderr, result.stderr
