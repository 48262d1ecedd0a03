"""cuda-python's cuda.bindings.runtime under `vgpu run`: the bindings carry NVIDIA's runtime,
which reaches vgpu's libcuda through the driver's private tables."""

from __future__ import annotations

import sys
from pathlib import Path

from vgpu_processes import run_under_vgpu

PROGRAM = Path(__file__).resolve().parent / "programs" / "bindings_runtime.py"


def test_runtime_bindings_program():
    result = run_under_vgpu(None, sys.executable, str(PROGRAM), timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "bindings_runtime: queries, memory, streams, events and a library kernel correct" \
        in result.stdout
    assert "vgpu:" not in result.stderr, result.stderr  # no table or slot refused
