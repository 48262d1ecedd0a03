"""Running programs under `vgpu run` as a user would (shared by the end-to-end tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgpack
from vgpu_processes import VGPU, vgpu_environment

from vgpu.replay.store import frame, read_framed
from vgpu.replay.trace import FORMAT_VERSION, MAGIC, TraceWriter, read_trace

__all__ = ["VGPU", "vgpu_run", "printed_checks", "edit_recorded_module"]


def vgpu_run(*command, env=None, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """`vgpu run --backend emu -- COMMAND`, as a user types it; `env` adds to
    vgpu_environment()."""
    return subprocess.run([*VGPU, "run", "--backend", "emu", "--", *map(str, command)],
                          capture_output=True, text=True, timeout=timeout,
                          env=vgpu_environment(**(env or {})), **kwargs)


def printed_checks(result: subprocess.CompletedProcess) -> dict[str, tuple[int, int]]:
    """The "name got expected" lines a checking program prints, as name -> (got, expected)."""
    checks = {}
    for line in result.stdout.splitlines():
        name, *values = line.split()
        if len(values) == 2:
            checks[name] = (int(values[0]), int(values[1]))
    return checks


def edit_recorded_module(trace: Path, edit) -> dict:
    """Change the module the trace's session loads (its PTX through `edit`): the manifest's
    body, as written back."""
    manifest = next(trace.glob("*.trace"))
    body = msgpack.unpackb(read_framed(str(manifest), MAGIC, FORMAT_VERSION, ValueError,
                                       "trace", "trace")[0], raw=False)
    load = next(i for i, c in enumerate(body["calls"]) if c[0] == "cuModuleLoadData")
    ptx = read_trace(trace).load(body["calls"][load][1][2]).decode()
    writer = TraceWriter(str(trace), body["session"], True)
    body["calls"][load][1][2] = writer.blob(edit(ptx).encode())
    manifest.write_bytes(frame(MAGIC, FORMAT_VERSION, msgpack.packb(body)))
    return body
