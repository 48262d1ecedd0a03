"""CuPy under `vgpu run` on emu: its wheel links NVIDIA's runtime statically, compiles its
kernels with NVRTC for the device's sm_XY (vgpu's libnvrtc hands the cubins back with their
PTX) and loads CUB's and curand's big modules (20-30 MB of PTX, loaded lazily).

examples/cupy_tour.py checks each feature a user starts with against numpy: elementwise and
reduction kernels, ElementwiseKernel, ReductionKernel, RawKernel and RawModule, indexing,
sorting, cupy.random, streams and events, pinned memory, the memory pool; matrix multiply
needs cuBLAS, which vgpu does not serve, and must be refused naming it; so must the legacy
RandomState, whose cuRAND host library hands the driver cubins only. A slice of CuPy's
own tests (fetched from its sdist for the installed version: cupy_sources.py) must pass
under vgpu as on a GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from cupy_sources import cupy_test_sources, installed_cupy_version
from e2e_support import vgpu_run

HERE = Path(__file__).resolve().parent
TOUR = HERE.parents[1] / "examples" / "cupy_tour.py"
# CuPy's tests of core elementwise and reduction kernels, indexing, creation (arange),
# manipulation (transpose, reshape) and random; run with CuPy's own pytest settings (its
# pyproject.toml: strict xfails, warnings as errors).
RANDOM = "tests/cupy_tests/random_tests/"
SLICE = ["tests/cupy_tests/core_tests/test_elementwise.py",
         "tests/cupy_tests/core_tests/test_reduction.py",
         "tests/cupy_tests/core_tests/test_ndarray_indexing.py",
         "tests/cupy_tests/creation_tests/test_ranges.py",
         "tests/cupy_tests/manipulation_tests/test_transpose.py",
         "tests/cupy_tests/manipulation_tests/test_shape.py",
         # Of the random tests, those that need no cuRAND host library: CuPy's test harness
         # seeds the legacy RandomState (cuRAND's, whose cubin-only kernels vgpu refuses)
         # before almost every random test.
         f"{RANDOM}test_generator_api.py::TestRandomStateThreadSafe",
         f"{RANDOM}test_generator_api.py::TestHypergeometricValidation",
         f"{RANDOM}test_generator.py::TestCheckAndGetDtype",
         f"{RANDOM}test_generator.py::TestResetStates",
         f"{RANDOM}test_sample.py::TestChoice",
         f"{RANDOM}test_sample.py::TestRandomIntegers",
         f"{RANDOM}test_sample.py::TestRandomSample",
         f"{RANDOM}test_init.py"]
# What the slice leaves out of those files (a pytest -k expression), and why.
SELECTION = ("not multigpu"                  # two devices; vgpu's emu server has one
             " and not test_shape1"          # reductions compiled for 27 shapes each: a
             " and not test_shape3"          #   minute of NVRTC with CUB's headers;
             " and not test_shape4"          # reductions over 33M and 8G elements: tens of
             " and not test_shape5"          #   seconds each on the emulator
             " and not test_ravel3"          # asfortranarray transposes with cuBLAS
             " and not test_nocopy_reshape"  # tens of seconds of reshapes on the emulator
             " and not (test_ranges and not arange)")  # test_ranges.py: its arange tests
# What the slice passes, for the CuPy it was counted with: all it runs. Another CuPy version
# has other tests; none may fail there either.
COUNTED = ("14.2.0", 263)
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
    legacy = next(line for line in result.stdout.splitlines()
                  if line.startswith("cupy: legacy random"))
    assert legacy.startswith("cupy: legacy random refused: CURANDError"), legacy
    # cuRAND's host library hands vgpu a cubin of its own, which vgpu names
    refusal = [line for line in result.stderr.splitlines() if "of libcurand.so.10" in line]
    assert refusal and "NO_BINARY_FOR_GPU" in refusal[0], result.stderr



def test_a_slice_of_cupys_own_tests_passes_on_emu(cupy_cache):
    version = installed_cupy_version()
    sources = cupy_test_sources(version)
    result = vgpu_run(sys.executable, "-m", "pytest", "-c", "pyproject.toml", "-p",
                      "no:cacheprovider", "-q", "-k", SELECTION, *SLICE, env=cupy_cache,
                      timeout=600, cwd=sources)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed, summary
    if version == COUNTED[0]:
        assert int(passed.group(1)) == COUNTED[1], summary
