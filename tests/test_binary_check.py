"""vgpu.binary_check on real programs: nvcc's default and shared-runtime builds, C, /bin/sh."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpu.binary_check import BinaryCheckError, ElfFile, check_executable

SOURCE = r"""
#include <cstdio>
__global__ void fill(int *out) { out[threadIdx.x] = threadIdx.x; }
int main() {
    int *out;
    cudaMalloc(&out, 64);
    fill<<<1, 16>>>(out);
    printf("%d\n", (int)cudaDeviceSynchronize());
    return 0;
}
"""


@pytest.fixture(scope="module")
def static_build(toolkit):
    return toolkit.executable(SOURCE)


@pytest.fixture(scope="module")
def shared_build(toolkit):
    return toolkit.executable(SOURCE, ["-cudart", "shared"])


def test_default_nvcc_build_carries_the_static_runtime(static_build):
    report = check_executable(static_build)
    assert report.is_elf and report.has_fatbin and report.has_static_cudart
    assert not report.uses_cudart_shared
    assert "libc.so.6" in report.needed
    assert not any("cudart" in lib for lib in report.needed)


def test_stripped_default_build_is_still_recognised(static_build, tmp_path):
    """Without a symbol table only the runtime's private strings are left to find."""
    stripped = tmp_path / "stripped"
    shutil.copy(static_build, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    with ElfFile.open(stripped) as elf:
        assert elf.symbols() == []
    assert check_executable(stripped).has_static_cudart


def test_shared_runtime_build_passes(shared_build):
    report = check_executable(shared_build)
    assert report.is_elf and report.has_fatbin and report.uses_cudart_shared
    assert not report.has_static_cudart
    assert report.needed[0] == "libcudart.so.13"


def test_shared_build_imports_runtime_symbols_versioned_by_library(shared_build):
    with ElfFile.open(shared_build) as elf:
        imports = {s.name: s for s in elf.dynamic_symbols() if not s.defined}
    for name in ("__cudaRegisterFatBinary", "__cudaLaunchKernel", "cudaMalloc"):
        assert imports[name].version == "libcudart.so.13"
        assert imports[name].binding == 1 and imports[name].type == 2  # global function
    assert imports["printf"].version.startswith("GLIBC_")


def test_symbol_table_shows_the_static_runtime_bound_locally(static_build):
    with ElfFile.open(static_build) as elf:
        defined = {s.name: s for s in elf.symbols() if s.defined}
        exported = {s.name for s in elf.dynamic_symbols() if s.defined}
    assert defined["__cudaRegisterFatBinary"].binding == 0  # local: never exported
    assert "cudaMalloc" in defined and "cudaMalloc" not in exported


def test_plain_c_program_and_shell(tmp_path):
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    program = tmp_path / "hello"
    subprocess.run(["gcc", "-o", str(program), str(source)], check=True)
    for path in (program, shutil.which("sh")):
        report = check_executable(path)
        assert report.is_elf and "libc.so.6" in report.needed
        assert not (report.has_static_cudart or report.uses_cudart_shared or report.has_fatbin)


def test_a_program_defining_the_runtime_entry_point_is_flagged(tmp_path):
    """The symbol signal: nvcc's registration code would bind to the program's own
    __cudaRegisterFatBinary, never reaching vgpu's runtime."""
    source = tmp_path / "own_runtime.c"
    source.write_text("void **__cudaRegisterFatBinary(void *w) { return 0; }\n"
                      "int main(void) { return __cudaRegisterFatBinary(0) != 0; }\n")
    program = tmp_path / "own_runtime"
    subprocess.run(["gcc", "-o", str(program), str(source)], check=True)
    assert check_executable(program).has_static_cudart


def test_scripts_and_text_files_are_not_elf(tmp_path):
    script = tmp_path / "run.py"
    script.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for path in (script, empty):
        report = check_executable(path)
        assert not report.is_elf and report.needed == [] and not report.has_static_cudart


@pytest.mark.parametrize("keep", [3, 20, 64, 1000, "sections"])
def test_truncated_elf_is_a_clear_error(static_build, tmp_path, keep):
    data = static_build.read_bytes()
    if keep == "sections":  # everything but the section table at the end of the file
        with ElfFile.open(static_build) as elf:
            keep = max(s.offset + s.size for s in elf.sections if s.type != 8)
    damaged = tmp_path / "damaged"
    damaged.write_bytes(data[:keep])
    if keep < 4:
        assert not check_executable(damaged).is_elf
        return
    with pytest.raises(BinaryCheckError, match=f"{damaged}: (not an ELF file|damaged ELF file)"):
        check_executable(damaged)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_tables_only_raise_binary_check_error(shared_build, data):
    """Bytes changed in the headers and the tables the checks read (sections, symbols,
    versions, dynamic entries) give a report or BinaryCheckError, never anything else."""
    damaged = bytearray(shared_build.read_bytes())
    with ElfFile(bytes(damaged)) as elf:
        targets = [(0, 64)] + [(s.offset, s.size) for s in elf.sections if s.name in (
            ".dynamic", ".dynsym", ".dynstr", ".gnu.version", ".gnu.version_r", ".shstrtab",
            ".symtab")]
    for _ in range(data.draw(st.integers(1, 6))):
        offset, size = data.draw(st.sampled_from(targets))
        damaged[offset + data.draw(st.integers(0, size - 1))] = data.draw(st.integers(0, 255))
    try:
        with ElfFile(bytes(damaged)) as elf:
            elf.needed()
            elf.symbols()
            elf.dynamic_symbols()
    except BinaryCheckError:
        pass


def test_unreadable_path_is_a_clear_error(tmp_path):
    with pytest.raises(BinaryCheckError, match="cannot read .*missing"):
        check_executable(tmp_path / "missing")


def test_section_access(shared_build):
    with ElfFile.open(shared_build) as elf:
        assert elf.section_data(".interp").rstrip(b"\0").endswith(b"ld-linux-x86-64.so.2")
        assert elf.section_data(".bss") == b""
        with pytest.raises(BinaryCheckError, match="no section .nosuch"):
            elf.section_data(".nosuch")
