"""Running programs under `vgpu run` as a user would (shared by the end-to-end tests)."""

from __future__ import annotations

import os
import subprocess
import sys

VGPU = [sys.executable, "-m", "vgpu.cli"]


def vgpu_run(*command, env=None, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """`vgpu run --backend emu -- COMMAND`, as a user types it."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("VGPU_SERVER", None)
    return subprocess.run([*VGPU, "run", "--backend", "emu", "--", *map(str, command)],
                          capture_output=True, text=True, timeout=timeout, env=full_env, **kwargs)
