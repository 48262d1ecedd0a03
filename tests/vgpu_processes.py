"""vgpu's own processes as the tests start them: the `vgpu` command, an environment that no
vgpu setting of the outer shell leaks into, emu servers on private ipc sockets, and the nested
pair that tests the cuda backend without a GPU (a cuda-backend server run under vgpu against
an emu server)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["VGPU", "vgpu_environment", "start_emu_server", "stop_server", "emu_server",
           "run_under_vgpu", "TcpForwarder", "zmtp_greeting", "free_tcp_address", "keygen",
           "curve_homes",
           "start_nested_cuda_server", "nested_cuda_server", "start_cuda_server"]

VGPU = [sys.executable, "-m", "vgpu.cli"]
# What a user's shell may set that would change what a test sees.
_USER_SETTINGS = ("VGPU_SERVER", "VGPU_TRACE", "VGPU_MEMCHECK", "VGPU_HOME", "VGPU_INSECURE",
                  "VGPU_CLIENT_KEY", "VGPU_NVRTC_LIBRARY", "CUDA_MODULE_LOADING")


def vgpu_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _USER_SETTINGS}
    return {**env, **extra}


def run_vgpu(*args, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`vgpu ARGS...` as a user types it, its output captured; `env` adds to
    vgpu_environment()."""
    return subprocess.run([*VGPU, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=vgpu_environment(**env))


def keygen(home: Path, *options: str) -> Path:
    """`vgpu keygen [OPTIONS]` for the user whose VGPU_HOME is `home`: the public key file
    it wrote (server.pub with --server, else client.pub)."""
    result = run_vgpu("keygen", *options, timeout=60, VGPU_HOME=str(home))
    assert result.returncode == 0, result.stderr
    return home / ("server.pub" if "--server" in options else "client.pub")


def curve_homes(root: Path) -> tuple[Path, Path]:
    """VGPU_HOME folders under `root` for a tcp server's user (its key pair, and an
    authorized-keys folder admitting the client as an admin) and for a client (its key
    pair): (server home, client home)."""
    server, client = root / "server-home", root / "client-home"
    keygen(server, "--server")
    public = keygen(client).read_text().strip()
    (server / "authorized-keys").mkdir()
    (server / "authorized-keys" / "client.key").write_text(f"{public} admin\n")
    return server, client


def start_emu_server(address: str | None, *options: str, stderr=None,
                     env: dict | None = None, prefix: tuple[str, ...] = ()
                     ) -> subprocess.Popen:
    """`vgpu server --backend emu` on `address` (None: the user's default address), returned
    once it listens; its `endpoint` is the address it says it listens on (with the port it
    got for `tcp://host:*`, and a tcp server's key). `prefix` runs it through a command
    (`ip netns exec NAME`)."""
    listen = ["--listen", address] if address is not None else []
    return _started([*prefix, *VGPU, "server", *listen, "--backend", "emu", *options],
                    stderr, env)


def start_nested_cuda_server(inner: str, address: str, *options: str, stderr=None
                             ) -> subprocess.Popen:
    """`vgpu run --server INNER -- vgpu server --backend cuda --listen ADDRESS`: a cuda
    backend server, itself an unmodified CUDA program whose every driver call goes to the
    (emu) server at `inner`; returned once it listens, as start_emu_server's. Stopping it
    (stop_server) stops the server through `vgpu run`, which forwards the signal."""
    return _started([*VGPU, "run", "--server", inner, "--", sys.executable, "-m", "vgpu.cli",
                     "server", "--listen", address, "--backend", "cuda", *options],
                    stderr, None)


def start_cuda_server(address: str, *options: str, stderr=None) -> subprocess.Popen:
    """`vgpu server --backend cuda` on `address`, on the machine's own GPU (scripts/gpu-check),
    returned once it listens."""
    return _started([*VGPU, "server", "--listen", address, "--backend", "cuda", *options],
                    stderr, None)


@contextlib.contextmanager
def nested_cuda_server(folder: Path, *options: str, stderr=None, devices: int = 1):
    """The nested pair for the `with` block, in `folder`: an emu server (the device, or
    `devices` of them) and a cuda-backend server run under vgpu against it, which drives
    every device the emu server offers; yields the cuda server's address. Both are stopped
    at the end, the cuda server first."""
    with emu_server(folder, "--devices", str(devices), stderr=stderr) as inner:
        address = f"ipc://{folder}/cuda-server.sock"
        proc = start_nested_cuda_server(inner, address, *options, stderr=stderr)
        try:
            yield address
        finally:
            stop_server(proc)


def _started(command: list[str], stderr, env: dict | None) -> subprocess.Popen:
    """A server started with `command`, once it says it listens (its `endpoint`)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
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


def free_tcp_address() -> str:
    """A loopback TCP address nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def zmtp_greeting(mechanism: str) -> bytes:
    """A ZMTP 3.0 server's greeting: signature, version, mechanism ("NULL", "CURVE"),
    as-server, filler."""
    return b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + mechanism.encode().ljust(20, b"\0") \
        + b"\x01" + bytes(31)


class TcpForwarder:
    """A TCP proxy between clients and a server (a network path that can fail): listens on
    127.0.0.1:`port` and forwards each connection to `target` (host, port). `drop()` cuts
    every connection open now, as a network blip does; `silence()` stops forwarding without
    closing anything, as a path that loses every packet does; `cut_next(n)` cuts the next n
    connections as soon as they come, in their handshake; `greet_as(mechanism)` answers every
    later connection itself, greeting as a ZMTP server of that security mechanism and
    holding it open, as a server restarted with another mechanism does."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.accepted = 0  # connections so far
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._silent = threading.Event()
        self._to_cut = 0
        self._greeting: bytes | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                cut, self._to_cut = self._to_cut > 0, max(0, self._to_cut - 1)
                self.accepted += cut
                greeting = self._greeting
            if cut:
                client.close()
                continue
            if greeting is not None:
                with contextlib.suppress(OSError):
                    client.sendall(greeting)
                with self._lock:
                    self.accepted += 1
                    self._open.append(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                if not self._silent.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        with self._lock:
            cut, self._open = self._open, []
        for end in cut:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def cut_next(self, n: int) -> None:
        with self._lock:
            self._to_cut = n

    def greet_as(self, mechanism: str) -> None:
        with self._lock:
            self._greeting = zmtp_greeting(mechanism)

    def silence(self) -> None:
        self._silent.set()

    def close(self) -> None:
        self._listener.close()
        self.drop()
