"""Fixtures for the driver shim's tests: C programs linked against our libcuda, and running
them the way `vgpu run` does (our directory first on LD_LIBRARY_PATH)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu.shim.loader import shim_library_dir


@pytest.fixture(scope="session")
def shim_dir() -> Path:
    return shim_library_dir()


@pytest.fixture(scope="session")
def cuda_include(toolkit) -> Path:
    """The dir with cuda.h. `toolkit.include` is derived from nvcc's path, which misses when
    nvcc is a wrapper script (/usr/local/bin/nvcc here); nvcc itself knows."""
    if (toolkit.include / "cuda.h").exists():
        return toolkit.include
    dry_run = subprocess.run([str(toolkit.nvcc), "--dryrun", "-c", "-x", "cu", os.devnull,
                              "-o", os.devnull], capture_output=True, text=True).stderr
    match = re.search(r'INCLUDES="-I([^"]+)"', dry_run)
    assert match, f"cannot find cuda.h from {toolkit.nvcc}:\n{dry_run}"
    return Path(match.group(1)).resolve()


@pytest.fixture(scope="session")
def shim_program(toolkit, cuda_include, shim_dir) -> Callable[[str], Path]:
    """C source -> executable linked against our libcuda.so (recorded as libcuda.so.1).

    Linked against the shim itself, as a real build links against a real libcuda: linking
    against an empty stub with unresolved symbols allowed leaves R_X86_64_NONE PLT entries
    that the loader rejects ("unexpected PLT reloc type 0x00")."""

    def build(source: str) -> Path:
        return toolkit.c_program(source, flags=[f"-I{cuda_include}", f"-L{shim_dir}", "-lcuda",
                                                "-ldl", "-pthread"])

    return build


@pytest.fixture
def run_program(shim_dir) -> Callable[..., subprocess.CompletedProcess]:
    """Runs a program against the shim, with a timeout: a hang is a failure, not a stall."""

    def run(program: Path, *args: str, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("VGPU_TRACE", "PYTHONHOME", "PYTHONPATH")}
        clean["LD_LIBRARY_PATH"] = str(shim_dir)
        return subprocess.run([str(program), *args], env={**clean, **(env or {})}, input=stdin,
                              capture_output=True, text=True, timeout=60)

    return run
