"""vgpu's own processes as the tests start them: the `vgpu` command, an environment that no
vgpu setting of the outer shell leaks into, and emu servers on private ipc sockets."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["VGPU", "vgpu_environment", "start_emu_server", "emu_server"]

VGPU = [sys.executable, "-m", "vgpu.cli"]
# What a user's shell may set that would change what a test sees.
_USER_SETTINGS = ("VGPU_SERVER", "VGPU_TRACE", "VGPU_MEMCHECK")


def vgpu_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _USER_SETTINGS}
    return {**env, **extra}


def start_emu_server(address: str, *options: str, stderr=None) -> subprocess.Popen:
    """`vgpu server --backend emu` on `address`, returned once it listens."""
    proc = subprocess.Popen([*VGPU, "server", "--listen", address, "--backend", "emu",
                             *options], stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=vgpu_environment())
    line = proc.stdout.readline()
    proc.stdout.close()
    assert line.startswith("vgpu server listening"), f"the server did not start: {line!r}"
    return proc


@contextlib.contextmanager
def emu_server(folder: Path, *options: str, stderr=None):
    """An emu server listening in `folder` for the `with` block; yields its address."""
    address = f"ipc://{folder}/server.sock"
    proc = start_emu_server(address, *options, stderr=stderr)
    try:
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # never leave a hung server to later tests
            proc.kill()
            proc.wait()
            raise
