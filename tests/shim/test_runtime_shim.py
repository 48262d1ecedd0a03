"""The runtime shim (libcudart.so.13) as programs built with `nvcc -cudart shared` see it."""

from __future__ import annotations

import re
import subprocess

import pytest

from vgpu.api.generated import runtime_table
from vgpu.api.runtime_headers import read_exported_symbols, read_runtime_headers

# A kernel (so nvcc emits the registration calls), and a call no one will implement.
PROGRAM = r"""
#include <cstdio>

extern "C" cudaError_t cudaGLSetGLDevice(int device);  // cuda_gl_interop.h needs GL headers

__global__ void kernel() {}

int main()
{
    int first = cudaGLSetGLDevice(0);
    int second = cudaGLSetGLDevice(0);
    std::printf("%d %d\n", first, second);
    return 0;
}
"""


@pytest.fixture(scope="module")
def runtime_program(toolkit):
    return toolkit.executable(PROGRAM, flags=["-cudart", "shared"])


def test_exports_nvidias_symbols_with_their_versions(shim_dir):
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(shim_dir / "libcudart.so.13")],
                         capture_output=True, text=True, check=True).stdout
    exported = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[3] == "FUNC" and fields[6] != "UND":
            name, _, version = fields[7].partition("@@")
            exported[name] = version
    assert exported == {**runtime_table.SYMBOL_VERSIONS, "PyInit__libcudart": "libcudart.so.13"}
    dynamic = subprocess.run(["readelf", "-d", str(shim_dir / "libcudart.so.13")],
                             capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcudart.so.13]" in dynamic


def test_table_matches_the_toolkit(toolkit):
    """A parity check: NVIDIA's library and headers, read again, give the committed table."""
    library = toolkit.include.parent / "lib" / "libcudart.so.13"
    headers = read_runtime_headers(toolkit.include, read_exported_symbols(library))
    assert headers.symbol_versions == runtime_table.SYMBOL_VERSIONS
    committed = {symbol: (restype, tuple((ctype, name) for ctype, name, _ in params))
                 for symbol, _, restype, params in runtime_table.FUNCTIONS}
    assert committed == {proto.name: (proto.restype,
                                      tuple((p.ctype, p.name) for p in proto.params))
                         for proto in headers.prototypes.values()}


def test_program_runs_on_our_runtime(runtime_program, run_program):
    result = run_program(runtime_program, env={"VGPU_TRACE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["801", "801"]  # cudaErrorNotSupported
    lines = result.stderr.splitlines()
    assert lines.count("vgpu: cudaGLSetGLDevice is not implemented (cudaErrorNotSupported)") == 1
    trace = [line.removeprefix("vgpu trace: ") for line in lines
             if line.startswith("vgpu trace: ")]
    # Registration returns a handle (`void **`) and nothing (`void`) through the dispatch.
    assert re.fullmatch(r"__cudaRegisterFatBinary\(fatCubin=0x[0-9a-f]+\) -> 0x[0-9a-f]+",
                        next(t for t in trace if t.startswith("__cudaRegisterFatBinary(")))
    registered = next(t for t in trace if t.startswith("__cudaRegisterFunction("))
    assert "deviceName=0x" in registered and "'_Z6kernelv'" in registered
    assert registered.endswith(" -> void")
    assert trace.count("cudaGLSetGLDevice(device=0) -> cudaErrorNotSupported") == 2


def test_runtime_that_cannot_start(runtime_program, run_program):
    result = run_program(runtime_program, env={"PYTHONHOME": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3"]  # cudaErrorInitializationError
    line, = result.stderr.splitlines()  # the driver shim's, once for both libraries
    assert line.startswith("vgpu: cannot start the shim's Python runtime (")
    assert line.endswith("): every CUDA call will fail")
