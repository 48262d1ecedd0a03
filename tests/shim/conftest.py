"""Fixtures for the driver shim's tests: C programs linked against our libcuda, and running
them the way `vgpu run` does (our directory first on LD_LIBRARY_PATH)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu.shim.loader import shim_library_dir


@pytest.fixture(scope="session")
def shim_dir() -> Path:
    return shim_library_dir()


@pytest.fixture(scope="session")
def shim_program(toolkit) -> Callable[[str], Path]:
    """C source -> executable linked against our libcuda (needing libcuda.so.1)."""

    def build(source: str) -> Path:
        return toolkit.c_program(source, flags=["-ldl", "-pthread"])

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
