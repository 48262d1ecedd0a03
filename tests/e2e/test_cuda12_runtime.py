"""Programs built with a CUDA 12 toolkit carry NVIDIA's CUDA 12 runtime (linked statically, or
libcudart.so.12): it reaches vgpu's libcuda through the same private tables as the CUDA 13
runtime does. A C program opens the `nvidia-cuda-runtime-cu12` wheel's libcudart.so.12 and
runs device queries, memory, copies, a stream, an event and a library kernel through it,
checking the results on the host. Programs linked with the CUDA 12 static runtime are
tests/runtime/test_runtime_programs.py's."""

from __future__ import annotations

from pathlib import Path

from e2e_support import vgpu_run
from toolkit import cuda12_runtime

HERE = Path(__file__).resolve().parent


def test_nvidias_cuda_12_runtime_runs_on_vgpus_driver(toolkit):
    program = toolkit.c_program((HERE / "cuda12_runtime.c").read_text(), ["-ldl"])
    result = vgpu_run(program, cuda12_runtime("libcudart.so.12"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("cuda12_runtime: runtime 12"), result.stdout
    assert "64 sums of a library kernel on a stream correct" in result.stdout
    assert "private table" not in result.stderr, result.stderr  # no table or slot refused
