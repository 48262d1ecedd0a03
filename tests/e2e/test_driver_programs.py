"""Unmodified driver-API programs under `vgpu run`."""

from __future__ import annotations

import sys
from pathlib import Path

from e2e_support import vgpu_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_c_driver_program_runs_with_correct_results(driver_app, kernels_ptx):
    result = vgpu_run(driver_app, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_app: all results correct" in result.stdout


def test_the_rest_of_the_driver_api(driver_api_tour, kernels_ptx):
    result = vgpu_run(driver_api_tour, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_api_tour: all checks passed" in result.stdout


def test_bad_input_gets_cuda_error_codes(driver_errors, kernels_ptx):
    result = vgpu_run(driver_errors, kernels_ptx)
    checks = {}
    for line in result.stdout.splitlines():
        name, *values = line.split()
        if len(values) == 2:
            checks[name] = (int(values[0]), int(values[1]))
    wrong = {name: got for name, got in checks.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout  # the program ran to its end
    assert len(checks) == 33 and result.returncode == 0


def test_cuda_python_program_runs_unmodified():
    result = vgpu_run(sys.executable, EXAMPLES / "vector_add.py")
    assert result.returncode == 0, result.stderr
    assert "vector_add of 1048576 floats" in result.stdout and "correct" in result.stdout


def test_exit_code_passes_through(tmp_path):
    assert vgpu_run(sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_trace_prints_decoded_calls(driver_app, kernels_ptx):
    result = vgpu_run(driver_app, kernels_ptx, env={"VGPU_TRACE": "1"})
    assert result.returncode == 0, result.stderr
    assert "cuMemAlloc_v2(" in result.stderr
    assert "cuLaunchKernel(" in result.stderr


def test_numba_cuda_program_runs_unmodified():
    result = vgpu_run(sys.executable, EXAMPLES / "numba_axpy.py")
    assert result.returncode == 0, result.stderr
    assert "numba axpy ok on vgpu emulated GPU" in result.stdout
