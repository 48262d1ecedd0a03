"""CuPy under `vgpu run` on emu: its wheel links NVIDIA's runtime statically, compiles its
kernels with NVRTC for the device's sm_XY (vgpu's libnvrtc hands the cubins back with their
PTX) and loads CUB's and curand's big modules (20-30 MB of PTX, loaded lazily).

examples/cupy_tour.py checks each feature a user starts with against numpy: elementwise and
reduction kernels, ElementwiseKernel, ReductionKernel, RawKernel and RawModule, indexing,
sorting, cupy.random, streams and events, pinned memory, the memory pool; matrix multiply
needs cuBLAS, which vgpu does not serve, and must be refused naming it. A slice of CuPy's
own tests (cupy_suite/, see its README) must pass under vgpu as it does on a GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from e2e_support import vgpu_run

HERE = Path(__file__).resolve().parent
TOUR = HERE.parents[1] / "examples" / "cupy_tour.py"
SUITE = HERE / "cupy_suite"
SLICE = ["cupy_tests/core_tests/test_elementwise.py",
         "cupy_tests/core_tests/test_ndarray_indexing.py",
         "cupy_tests/creation_tests/test_ranges.py",
         "cupy_tests/manipulation_tests/test_shape.py",
         "cupy_tests/manipulation_tests/test_transpose.py"]
# What the slice leaves out of those files (a pytest -k expression), and why.
SELECTION = ("not multigpu"                  # two devices; vgpu's emu server has one
             " and not test_ravel3"          # asfortranarray transposes with cuBLAS
             " and not test_nocopy_reshape"  # tens of seconds of reshapes on the emulator
             " and not (test_ranges and not arange)")  # test_ranges.py: its arange tests
PASSING = 206  # what the slice passes: all of it (CuPy 14.2.0)
FEATURES = ("elementwise", "reductions", "user kernels", "indexing", "sorting", "random",
            "streams, events and pinned memory", "memory pool")


@pytest.fixture(scope="session")
def cupy_cache(tmp_path_factory) -> dict[str, str]:
    """CuPy's kernel cache for this run: each kernel is compiled once per run, from
    nothing (a user's warm cache would hide NVRTC's part)."""
    return {"CUPY_CACHE_DIR": str(tmp_path_factory.mktemp("cupy-kernel-cache"))}


def test_cupy_tour_runs_on_emu(cupy_cache):
    result = vgpu_run(sys.executable, TOUR, env=cupy_cache, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for feature in FEATURES:
        assert f"cupy: {feature} correct" in result.stdout, result.stdout
    matmul = next(line for line in result.stdout.splitlines()
                  if line.startswith("cupy: matrix multiply"))
    assert matmul.startswith("cupy: matrix multiply refused") and "libcublas" in matmul, matmul


def test_a_slice_of_cupys_own_tests_passes_on_emu(cupy_cache):
    result = vgpu_run(sys.executable, "-m", "pytest", "-c", "pytest.ini", "-p",
                      "no:cacheprovider", "-q", "-k", SELECTION, *SLICE, env=cupy_cache,
                      timeout=600, cwd=SUITE)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) == PASSING, summary
