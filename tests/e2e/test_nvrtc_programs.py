"""NVRTC programs that compile for the device's sm_XY, under `vgpu run` on emu: vgpu's
libnvrtc.so.13 hands back cubins that carry their PTX, so they load and run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_support import vgpu_run

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def nvrtc_cubin(toolkit) -> Path:
    return toolkit.c_program((HERE / "nvrtc_cubin.c").read_text(), flags=["-l:libnvrtc.so.13"])


def test_a_c_program_runs_the_cubins_nvrtc_compiles_and_links(nvrtc_cubin):
    result = vgpu_run(nvrtc_cubin)
    assert result.returncode == 0, result.stderr
    assert "nvrtc_cubin: sm_80 cubin of" in result.stdout
    assert "nvrtc_cubin: all checks passed" in result.stdout
    assert result.stderr == ""  # NVRTC's own cuGetExportTable call is not worth a warning


def test_a_cuda_python_program_runs_the_cubin_nvrtc_compiles():
    result = vgpu_run(sys.executable, HERE / "programs" / "nvrtc_cubin.py")
    assert result.returncode == 0, result.stderr
    assert "sm_80 cubin of" in result.stdout and "results correct" in result.stdout
    assert result.stderr == ""


def test_nvrtc_that_cannot_be_loaded_fails_the_program_with_the_reason(nvrtc_cubin):
    result = vgpu_run(nvrtc_cubin, env={"VGPU_NVRTC_LIBRARY": "/nonexistent/libnvrtc.so.13"})
    assert result.returncode == 1
    assert "vgpu: cannot load NVIDIA's NVRTC from /nonexistent/libnvrtc.so.13" in result.stderr
    assert "all checks passed" not in result.stdout
