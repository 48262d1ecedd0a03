"""Programs of the end-to-end tests, compiled once per test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
VGPU = [sys.executable, "-m", "vgpu.cli"]


@pytest.fixture(scope="session")
def kernels_ptx(toolkit, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ptx") / "kernels.ptx"
    path.write_text(toolkit.ptx((HERE / "kernels.cu").read_text()))
    return path


@pytest.fixture(scope="session")
def driver_app(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_app.c").read_text())


@pytest.fixture(scope="session")
def driver_errors(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_errors.c").read_text())


def vgpu_run(*command, env=None, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """`vgpu run --backend emu -- COMMAND`, as a user types it."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("VGPU_SERVER", None)
    return subprocess.run([*VGPU, "run", "--backend", "emu", "--", *map(str, command)],
                          capture_output=True, text=True, timeout=timeout, env=full_env, **kwargs)
