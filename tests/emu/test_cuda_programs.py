"""CUDA programs that real code resembles, under `vgpu run` on the emu backend.

Each program in programs/ checks its results against values computed on the host and exits
0 only when all are right. The CUDA C++ ones are built with nvcc `-cudart shared` (once per
test run); they and the numba-cuda ones run through vgpu's libcudart and libcuda against one
emu server shared by the module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from vgpu_processes import emu_server, run_under_vgpu

PROGRAMS = Path(__file__).resolve().parent / "programs"
CHECKS = Path(__file__).resolve().parents[1] / "runtime" / "programs"  # check.cuh
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with emu_server(tmp_path_factory.mktemp("emu-programs")) as address:
        yield address


def run_program(toolkit, server: str, name: str, *flags: str) -> subprocess.CompletedProcess:
    program = toolkit.executable((PROGRAMS / f"{name}.cu").read_text(),
                                 ["-cudart", "shared", f"-I{CHECKS}", *flags])
    return run_under_vgpu(server, program, timeout=TIMEOUT_S)


def assert_passed(result: subprocess.CompletedProcess, *lines: str) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    for line in lines:
        assert line in result.stdout, f"{line!r} missing from\n{result.stdout}\n{result.stderr}"


def test_cooperative_groups_tiles_and_cta_barriers(toolkit, server):
    assert_passed(run_program(toolkit, server, "cooperative_groups"),
                  "cooperative_groups: 64 tile sums, 4 block sums, cta barriers correct")


@pytest.mark.parametrize("arch", ["compute_75", "compute_80"])  # the device is 8.0
def test_function_attributes_report_ptx_and_binary_architectures(toolkit, server, arch):
    assert_passed(run_program(toolkit, server, "function_attributes",
                              f"-gencode=arch={arch},code={arch}"),
                  f"ptxVersion {arch[-2:]}, binaryVersion ")


def test_thrust_and_cub_algorithms(toolkit, server):
    assert_passed(run_program(toolkit, server, "thrust_cub"),
                  "thrust_cub: reduce, cub sum, inclusive scan and sort of 3000 values correct")


def test_half_and_bfloat16_arithmetic_from_cuda_headers(toolkit, server):
    # bfloat16 fma and the .relu forms need compute_80 (the emulated device's architecture).
    assert_passed(run_program(toolkit, server, "half_precision",
                              "-gencode=arch=compute_80,code=compute_80"),
                  "half_precision: 4866 half and bfloat16 results correct")


def test_an_unsupported_instruction_fails_only_the_kernels_that_reach_it(toolkit, server):
    assert_passed(run_program(toolkit, server, "unsupported_instruction"),
                  "unsupported_instruction: launch failed with cudaErrorNotSupported",
                  "unsupported_instruction: indirect calls work, the function table is readable",
                  "unsupported_instruction: other kernels and __device__ variables work")


def test_waiting_on_the_clock_takes_real_time_at_the_reported_rate(toolkit, server):
    assert_passed(run_program(toolkit, server, "clock_wait"),
                  "clock_wait: waited as long as the clock rate says")


def test_register_counts_are_plausible_and_limited(toolkit, server):
    from vgpu.shim.loader import shim_library_dir

    assert_passed(run_program(toolkit, server, "register_count",
                              f"-L{shim_library_dir()}", "-lcuda"),
                  "register_count: counts plausible and limited")


def test_calls_with_register_and_constant_arguments(toolkit, server):
    assert_passed(run_program(toolkit, server, "register_call_arguments"),
                  "register_call_arguments: 64 calls with register arguments correct")


def test_numba_half_precision_kernels(server):
    result = run_under_vgpu(server, sys.executable, str(PROGRAMS / "numba_half.py"),
                            timeout=TIMEOUT_S)
    assert_passed(result, "numba_half: 400 fp16 results correct, twice")


def test_numba_grid_sync_links_libcudadevrt_and_launches_cooperatively(server):
    result = run_under_vgpu(server, sys.executable, str(PROGRAMS / "numba_grid_sync.py"),
                            timeout=TIMEOUT_S)
    assert_passed(result, "numba_grid_sync: 6 blocks met at grid.sync(), total 249983 correct")


def test_numba_managed_arrays(server):
    result = run_under_vgpu(server, sys.executable, str(PROGRAMS / "numba_managed.py"),
                            timeout=TIMEOUT_S)
    assert_passed(result, "numba_managed: 1000 values right after two rounds")


def test_cuda_barrier_and_memcpy_async(toolkit, server):
    # mbarrier objects and cp.async exist from compute_80 on.
    assert_passed(run_program(toolkit, server, "async_barriers",
                              "-gencode=arch=compute_80,code=compute_80"),
                  "async_barriers: 6 tiles staged through cuda::barrier, phases correct",
                  "async_barriers: arrivals counting several complete a phase once, not before")


def test_tensor_core_gemm_with_cp_async_tiles(toolkit, server):
    # bf16 wmma and cp.async need compute_80, the emulated device's compute capability.
    assert_passed(run_program(toolkit, server, "tensor_cores",
                              "-gencode=arch=compute_80,code=compute_80"),
                  "tensor_cores: compute capability 8.0",
                  "tensor_cores: 64x64x96 bf16 wmma GEMM through cp.async tiles correct")
