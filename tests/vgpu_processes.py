"""vgpu's own processes as the tests start them: the `vgpu` command, an environment that no
vgpu setting of the outer shell leaks into, and emu servers on private ipc sockets."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["VGPU", "vgpu_environment", "start_emu_server", "stop_server", "emu_server",
           "run_under_vgpu"]

VGPU = [sys.executable, "-m", "vgpu.cli"]
# What a user's shell may set that would change what a test sees.
_USER_SETTINGS = ("VGPU_SERVER", "VGPU_TRACE", "VGPU_MEMCHECK", "VGPU_HOME", "VGPU_INSECURE",
                  "VGPU_CLIENT_KEY")


def vgpu_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _USER_SETTINGS}
    return {**env, **extra}


def run_vgpu(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """`vgpu ARGS...` as a user types it, its output captured."""
    return subprocess.run([*VGPU, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=vgpu_environment())


def start_emu_server(address: str | None, *options: str, stderr=None,
                     env: dict | None = None, prefix: tuple[str, ...] = ()
                     ) -> subprocess.Popen:
    """`vgpu server --backend emu` on `address` (None: the user's default address), returned
    once it listens; its `endpoint` is the address it says it listens on (with the port it
    got for `tcp://host:*`, and a tcp server's key). `prefix` runs it through a command
    (`ip netns exec NAME`)."""
    listen = ["--listen", address] if address is not None else []
    proc = subprocess.Popen([*prefix, *VGPU, "server", *listen, "--backend", "emu", *options],
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=env or vgpu_environment())
    line = proc.stdout.readline()
    proc.stdout.close()
    if not line.startswith("vgpu server listening"):
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""  # stdout is closed: no communicate()
        proc.wait(timeout=10)
        raise AssertionError(f"the server did not start: {line!r}\n{err}")
    proc.endpoint = line.split()[4]
    return proc


@contextlib.contextmanager
def emu_server(folder: Path, *options: str, stderr=None):
    """An emu server listening in `folder` for the `with` block; yields its address."""
    address = f"ipc://{folder}/server.sock"
    proc = start_emu_server(address, *options, stderr=stderr)
    try:
        yield address
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server as a user does (SIGTERM). One that does not exit within 10 s is a
    failure, and is killed: never leave a hung server to later tests."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def run_under_vgpu(server: str | None, program, *args: str, timeout: float,
                   merged: bool = False, prefix: tuple[str, ...] = (),
                   **env: str) -> subprocess.CompletedProcess:
    """`vgpu run --server SERVER -- PROGRAM ARGS...` (server None: `--backend emu`, a private
    server for the run), its output captured as text (stderr into stdout with `merged`);
    `env` adds to vgpu_environment(); `prefix` runs it through a command."""
    where = ["--server", server] if server is not None else ["--backend", "emu"]
    return subprocess.run([*prefix, *VGPU, "run", *where, "--", str(program), *args],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                          text=True, timeout=timeout, env=vgpu_environment(**env))


class ServerProcess:
    def __init__(self, address: str, *options: str, env: dict | None = None,
                 prefix: tuple[str, ...] = ()):
        self.proc = start_emu_server(address, *options, stderr=subprocess.PIPE, env=env,
                                     prefix=prefix)
        self.address = self.proc.endpoint

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """Stop it as a user does (SIGTERM). One that does not exit within 10 s is a failure,
        and is killed: left running, it would take CPU and sockets from the tests after it."""
        if self.alive():
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        return err
