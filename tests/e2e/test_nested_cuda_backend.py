"""The cuda backend without a GPU: a `vgpu server --backend cuda` run as an unmodified CUDA
program under vgpu, against an emu server (tests/vgpu_processes.nested_cuda_server), serves
unmodified programs. Every call the backend makes goes through vgpu's own driver, which checks
it. The e2e programs run on the nested backend too (the `run_on` fixture, and the runtime
programs' backends); here: what only the cuda backend does (kernels and their parameters
enumerated from the driver, a program's own linked module, allocations sharing granules,
sessions side by side in their own ranges, the program's own virtual memory), and without a
driver, `--backend cuda` failing in one line and `auto` picking emu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import printed_checks
from vgpu_processes import (
    VGPU,
    emu_server,
    nested_cuda_server,
    run_under_vgpu,
    vgpu_environment,
)

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cuda_server(tmp_path_factory):
    with nested_cuda_server(tmp_path_factory.mktemp("nested-cuda")) as address:
        yield address


# ----------------------------------------------------------------- without a driver

def _without_a_driver(tmp_path: Path) -> dict[str, str]:
    """An environment whose libcuda.so.1 cannot load (as where no NVIDIA driver is), ahead of
    any the system has."""
    (tmp_path / "libcuda.so.1").write_bytes(b"not a library")
    return vgpu_environment(LD_LIBRARY_PATH=str(tmp_path))


def test_without_a_driver_the_cuda_backend_fails_in_one_line(tmp_path):
    result = subprocess.run([*VGPU, "server", "--listen", f"ipc://{tmp_path}/s.sock",
                             "--backend", "cuda"], capture_output=True, text=True,
                            timeout=60, env=_without_a_driver(tmp_path))
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "cuda backend needs NVIDIA's driver (libcuda.so.1)" in result.stderr


def test_without_a_driver_auto_picks_emu(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c",
         "from vgpu.server.backends import open_backend; print(open_backend('auto').name)"],
        capture_output=True, text=True, timeout=60, env=_without_a_driver(tmp_path))
    assert result.returncode == 0 and result.stdout == "emu\n", result.stderr


def test_a_cuda_server_offers_no_more_devices_than_its_driver(tmp_path):
    """Under vgpu's driver offering one device, `--devices 2` fails in one line."""
    with emu_server(tmp_path) as inner:
        result = run_under_vgpu(inner, *VGPU, "server", "--listen",
                                f"ipc://{tmp_path}/cuda.sock", "--backend", "cuda",
                                "--devices", "2", timeout=TIMEOUT_S)
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr == "vgpu server: --devices 2: the cuda backend has 1 device\n"


# ----------------------------------------------------------------- programs on nested cuda

def test_the_programs_own_virtual_memory(cuda_server, driver_vmm, kernels_ptx):
    """All of driver_vmm but one check: a fixed address far outside the session's range is
    a hint on a device that sessions share (CUDA lets the driver place it elsewhere)."""
    result = run_under_vgpu(cuda_server, driver_vmm, str(kernels_ptx), timeout=TIMEOUT_S)
    found = printed_checks(result)
    assert found.pop("reserve_fixed_far_honoured") == (0, 1)
    wrong = {name: got for name, got in found.items() if got[0] != got[1]}
    assert not wrong and len(found) == 128, f"{wrong}\n{result.stdout}\n{result.stderr}"


# A cuda-python program's start: the PTX file named by its argument, and a current context.
PREAMBLE = """
import sys
from cuda.bindings import driver as cu
ptx = open(sys.argv[1], "rb").read() + b"\\0"
cu.cuInit(0)
_, device = cu.cuDeviceGet(0)
_, context = cu.cuDevicePrimaryCtxRetain(device)
cu.cuCtxSetCurrent(context)
"""

ENUMERATE = PREAMBLE + """
_, module = cu.cuModuleLoadData(ptx)
_, count = cu.cuModuleGetFunctionCount(module)
_, functions = cu.cuModuleEnumerateFunctions(count, module)
for f in functions:
    loaded = cu.cuFuncIsLoaded(f)[1].name
    assert cu.cuFuncLoad(f)[0] == cu.CUresult.CUDA_SUCCESS
    params, i = [], 0
    while True:
        err, offset, size = cu.cuFuncGetParamInfo(f, i)
        if err != cu.CUresult.CUDA_SUCCESS:
            break
        params.append((offset, size))
        i += 1
    print(cu.cuFuncGetName(f)[1].decode(), params, err.name, loaded)
"""


def test_vgpu_driver_enumerates_kernels_and_their_parameters(cuda_server, kernels_ptx):
    """What the backend asks of a driver about a module it loaded, on vgpu's own driver
    (which loads a module's functions with it: NVIDIA's loads them lazily, at cuFuncLoad)."""
    result = run_under_vgpu(cuda_server, sys.executable, "-c", ENUMERATE, str(kernels_ptx),
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    kernels = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # kernels.cu's scale(float *data, float factor, int n)
    assert kernels["scale"] == ("[(0, 8), (8, 4), (12, 4)] CUDA_ERROR_INVALID_VALUE "
                                "CU_FUNCTION_LOADING_STATE_LOADED"), kernels


LINK = PREAMBLE + """
import ctypes
_, state = cu.cuLinkCreate(0, [], [])
cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, ptx, len(ptx), b"k.ptx", 0, [], [])
_, image, size = cu.cuLinkComplete(state)
err, module = cu.cuModuleLoadData(ctypes.string_at(int(image), int(size)))
print("load", err.name)
print("function", cu.cuModuleGetFunction(module, b"scale")[0].name)
"""


def test_a_programs_linked_module_is_linked_by_the_driver(cuda_server, kernels_ptx):
    """cuLink* output from vgpu's driver (the PTX modules added) reaches the backend, which
    links them with the device's driver."""
    result = run_under_vgpu(cuda_server, sys.executable, "-c", LINK, str(kernels_ptx),
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "load CUDA_SUCCESS\nfunction CUDA_SUCCESS\n", result.stdout


GRANULES = PREAMBLE + """
import numpy as np

def alloc(n, value):
    err, p = cu.cuMemAlloc(n)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    assert cu.cuMemsetD8(p, value, n)[0] == cu.CUresult.CUDA_SUCCESS
    return p, n, value

def holds(block):
    p, n, value = block
    out = np.zeros(n, np.uint8)
    assert cu.cuMemcpyDtoH(out, p, n)[0] == cu.CUresult.CUDA_SUCCESS
    return bool((out == value).all())

small = [alloc(1000, v) for v in (1, 2, 3)]       # three allocations in one granule
big = alloc(5 << 20, 4)                             # across granules, the first shared
cu.cuMemFree(small[1][0])
again = alloc(700, 5)                               # in the freed space of a live granule
cu.cuMemFree(small[0][0])
cu.cuMemFree(small[2][0])
later = alloc(3 << 20, 6)                           # granules of their own, after the others
cu.cuMemFree(big[0])
print([holds(b) for b in (again, later)], hex(int(again[0]) - int(small[0][0])))
"""


def test_small_allocations_share_granules_and_keep_their_bytes(cuda_server, kernels_ptx):
    """Arena addresses are 512-byte aligned, device memory is mapped in 2 MiB granules:
    allocations sharing granules, freed and made in between, each keep their contents."""
    result = run_under_vgpu(cuda_server, sys.executable, "-c", GRANULES, str(kernels_ptx),
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[True, True] 0x400\n", result.stdout


HOLD = PREAMBLE + """
err, pointer = cu.cuMemAlloc(1 << 20)
print(err.name, hex(int(pointer)), flush=True)
sys.stdin.read()  # holds its session until the test closes its input
"""


def test_sessions_at_once_each_in_its_own_address_range(cuda_server, kernels_ptx):
    """Two programs served at once: each session's range reserved on the one device."""
    command = [*VGPU, "run", "--server", cuda_server, "--", sys.executable, "-c", HOLD,
               str(kernels_ptx)]
    first, second = (subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=vgpu_environment()) for _ in range(2))
    try:
        said = sorted([first.stdout.readline().split(), second.stdout.readline().split()])
    finally:
        for program in (first, second):
            program.communicate(timeout=TIMEOUT_S)  # its input closed: it ends
            assert program.returncode == 0
    assert said == [["CUDA_SUCCESS", "0x100000000000"], ["CUDA_SUCCESS", "0x110000000000"]]
