"""Running programs under `vgpu run` as a user would (shared by the end-to-end tests)."""

from __future__ import annotations

import subprocess

from vgpu_processes import VGPU, vgpu_environment

__all__ = ["VGPU", "program_checks", "vgpu_run"]


def vgpu_run(*command, env=None, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """`vgpu run --backend emu -- COMMAND`, as a user types it; `env` adds to
    vgpu_environment()."""
    return subprocess.run([*VGPU, "run", "--backend", "emu", "--", *map(str, command)],
                          capture_output=True, text=True, timeout=timeout,
                          env=vgpu_environment(**(env or {})), **kwargs)


def program_checks(result) -> dict[str, tuple[int, int]]:
    """The "name got expected" lines a checking program prints."""
    checks = {}
    for line in result.stdout.splitlines():
        name, *values = line.split()
        if len(values) == 2:
            checks[name] = (int(values[0]), int(values[1]))
    return checks
