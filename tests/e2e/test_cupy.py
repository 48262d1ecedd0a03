"""CuPy under `vgpu run` on emu: its wheel links NVIDIA's runtime statically, compiles its
kernels with NVRTC for the device's sm_XY (vgpu's libnvrtc hands the cubins back with their
PTX) and loads CUB's and curand's big modules (20-30 MB of PTX, loaded lazily).

examples/cupy_tour.py checks each feature a user starts with against numpy: elementwise and
reduction kernels, ElementwiseKernel, ReductionKernel, RawKernel and RawModule, indexing,
sorting, cupy.random, streams and events, pinned memory, the memory pool; matrix multiply
needs cuBLAS, which vgpu does not serve, and must be refused naming it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_support import vgpu_run

HERE = Path(__file__).resolve().parent
TOUR = HERE.parents[1] / "examples" / "cupy_tour.py"
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

