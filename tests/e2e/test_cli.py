"""The `vgpu` command as a user drives it: named servers, child processes, `vgpu ps`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from e2e_support import VGPU, vgpu_run
from vgpu_processes import start_emu_server, stop_server, vgpu_environment

ROOT = Path(__file__).resolve().parents[2]
# A client that opens a session and waits, so that `vgpu ps` sees it.
WAITING_CLIENT = ("from cuda.bindings import driver as cu; import time\n"
                  "cu.cuInit(0); print('ready', flush=True); time.sleep(30)\n")


def _vgpu(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([*VGPU, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _ps_servers(output: str) -> dict[str, list[str]]:
    """`vgpu ps` output: each server's heading line and the rows of its sessions."""
    servers: dict[str, list[str]] = {}
    for line in output.splitlines():
        if line.startswith("server "):
            rows = servers.setdefault(line.split()[1], [line])
        elif line.strip() and not line.split()[0] == "PID":
            rows.append(line)
    return servers


def _one_clear_line(result: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert result.returncode == code, result
    assert result.stderr.count("\n") == 1 and text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_run_on_a_named_server_and_ps_lists_the_session(tmp_path, driver_app, kernels_ptx):
    address = f"ipc://{tmp_path}/named.sock"
    server = start_emu_server(address)
    try:
        # A client that holds 1 MiB and waits, so that ps sees it.
        code = ("from cuda.bindings import driver as cu; import time\n"
                "cu.cuInit(0); _, d = cu.cuDeviceGet(0); _, c = cu.cuDevicePrimaryCtxRetain(d)\n"
                "cu.cuCtxSetCurrent(c); cu.cuMemAlloc(1 << 20); print('ready', flush=True)\n"
                "time.sleep(30)\n")
        env = {**os.environ}
        env.pop("VGPU_SERVER", None)
        holder = subprocess.Popen([*VGPU, "run", "--server", address, "--", sys.executable, "-c",
                                   code], stdout=subprocess.PIPE, text=True, env=env)
        assert holder.stdout.readline().strip() == "ready"
        ps = subprocess.run([*VGPU, "ps", "--server", address], capture_output=True, text=True,
                            check=True).stdout
        line = next(row for row in _ps_servers(ps)[address] if "time.sleep" in row)
        assert "emu" in line and "1.0 MiB" in line, ps
        os.kill(int(line.split()[0]), signal.SIGKILL)  # the program itself, not `vgpu run`
        assert holder.wait(timeout=10) == 128 + signal.SIGKILL
        holder.stdout.close()
        # The named server outlives its clients and serves the next one.
        result = subprocess.run([*VGPU, "run", "--server", address, "--", str(driver_app),
                                 str(kernels_ptx)], capture_output=True, text=True, env=env,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 5
        while "time.sleep" in subprocess.run([*VGPU, "ps", "--server", address],
                                             capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the killed client's session stayed"
            time.sleep(0.2)
    finally:
        stop_server(server)


def test_child_processes_use_vgpu_too(driver_app, kernels_ptx):
    result = vgpu_run("sh", "-c", f"'{driver_app}' '{kernels_ptx}' && echo child-done")
    assert result.returncode == 0, result.stderr
    assert "all results correct" in result.stdout and "child-done" in result.stdout


def test_missing_command_and_unknown_program_are_clear_errors():
    result = subprocess.run([*VGPU, "run", "--"], capture_output=True, text=True)
    assert result.returncode == 2 and "no command given" in result.stderr
    result = vgpu_run("no-such-program-anywhere")
    assert result.returncode == 127 and "command not found" in result.stderr


def test_a_damaged_executable_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken"
    broken.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9)  # an ELF header cut short
    broken.chmod(0o755)
    result = vgpu_run(broken)
    assert result.returncode == 126
    assert "vgpu run: cannot run" in result.stderr and "Traceback" not in result.stderr


def test_unreachable_server_is_device_unavailable_not_a_hang(tmp_path, driver_app, kernels_ptx):
    env = {**os.environ, "VGPU_TIMEOUT": "2"}
    start = time.monotonic()
    result = subprocess.run([*VGPU, "run", "--server", f"ipc://{tmp_path}/nobody.sock", "--",
                             str(driver_app), str(kernels_ptx)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 1
    assert "no answer from the vgpu server" in result.stderr
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in result.stderr


def test_ps_finds_the_private_server_of_a_vgpu_run():
    holder = subprocess.Popen([*VGPU, "run", "--", sys.executable, "-c", WAITING_CLIENT],
                              stdout=subprocess.PIPE, text=True, env=vgpu_environment())
    try:
        assert holder.stdout.readline().strip() == "ready"
        ps = subprocess.run([*VGPU, "ps"], capture_output=True, text=True, check=True).stdout
        private = [address for address in _ps_servers(ps) if f"/run-{holder.pid}-" in address]
        assert len(private) == 1, ps
        assert any("time.sleep(30)" in row for row in _ps_servers(ps)[private[0]]), ps
    finally:
        holder.terminate()  # forwarded to the program; the private server stops after it
        holder.wait(timeout=30)
        holder.stdout.close()


# ----------------------------------------------------------------- the command itself

def test_version_and_a_missing_verb():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = _vgpu("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"vgpu {version}"
    result = _vgpu()  # no verb: the help, as a usage error
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: vgpu") and "run" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------- addresses

@pytest.mark.parametrize(("args", "env", "message"), [
    (["run", "--server", "bogus", "--", "true"], {},
     "vgpu run: --server bogus: not a server address: use ipc:///path/to/socket or tcp://"),
    (["run", "--", "true"], {"VGPU_SERVER": "tcp://localhost"},
     "vgpu run: VGPU_SERVER=tcp://localhost: a tcp address needs a host and a port"),
    (["ps", "--server", "bogus"], {}, "vgpu ps: --server bogus: not a server address"),
    (["ps", "--server", "tcp://127.0.0.1:99999"], {}, "'99999' is not a port number"),
])
def test_a_bad_server_address_is_one_clear_line(args, env, message):
    _one_clear_line(_vgpu(*args, env=vgpu_environment(**env)), 2, message)


def test_backend_asks_for_a_private_server():
    result = _vgpu("run", "--server", "ipc:///nowhere.sock", "--backend", "emu", "--", "true")
    _one_clear_line(result, 2, "vgpu run: --backend is for a private server; --server names")
    # The command line wins over the environment: VGPU_SERVER is not even looked at.
    show_server = "import os; print(os.environ['VGPU_SERVER'])"
    result = _vgpu("run", "--backend", "emu", "--", sys.executable, "-c", show_server,
                   env={**os.environ, "VGPU_SERVER": "bogus"})
    assert result.returncode == 0 and "/vgpu/run-" in result.stdout, result


def test_a_server_listens_where_it_is_told_or_not_at_all(tmp_path):
    result = _vgpu("server", "--listen", "tcp://127.0.0.1:99999")
    _one_clear_line(result, 1, "cannot listen on tcp://127.0.0.1:99999: '99999' is not a port")
    missing = tmp_path / "no" / "such" / "folder"
    result = _vgpu("server", "--listen", f"ipc://{missing}/server.sock")
    _one_clear_line(result, 1, f"the folder {missing} does not exist")
    assert not (tmp_path / "no").exists()
    long_path = tmp_path / ("x" * 120) / "server.sock"
    result = _vgpu("server", "--listen", f"ipc://{long_path}")
    _one_clear_line(result, 1, "the socket path is longer than 107 bytes")


def test_a_server_offers_as_many_devices_as_it_can(tmp_path):
    address = f"ipc://{tmp_path}/server.sock"
    result = _vgpu("server", "--listen", address, "--backend", "emu", "--devices", "0")
    _one_clear_line(result, 1, "vgpu server: --devices must be between 1 and 16")
    result = _vgpu("server", "--listen", address, "--backend", "emu", "--devices", "17")
    _one_clear_line(result, 1, "vgpu server: --devices must be between 1 and 16")


# ----------------------------------------------------------------- sockets

def test_a_second_server_is_refused_while_the_first_still_answers(tmp_path, driver_app,
                                                                   kernels_ptx):
    address = f"ipc://{tmp_path}/shared.sock"
    first = start_emu_server(address)
    try:
        second = _vgpu("server", "--listen", address, "--backend", "emu")
        _one_clear_line(second, 1, f"cannot listen on {address}: already served by pid "
                                   f"{first.pid}")
        result = _vgpu("run", "--server", address, "--", driver_app, kernels_ptx,
                       env=vgpu_environment(), timeout=120)
        assert result.returncode == 0, result.stderr
        ps = _vgpu("ps", "--server", address)
        assert ps.returncode == 0 and address in _ps_servers(ps.stdout), ps
    finally:
        stop_server(first)
    assert not (tmp_path / "shared.sock").exists()  # a server removes its socket on exit


def test_of_two_servers_started_together_on_one_socket_one_serves(tmp_path):
    address = f"ipc://{tmp_path}/contested.sock"
    servers = [subprocess.Popen([*VGPU, "server", "--listen", address, "--backend", "emu"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        first_lines = [server.stdout.readline() for server in servers]
        serving = [s for s, line in zip(servers, first_lines, strict=True) if line]
        assert len(serving) == 1, first_lines
        (refused,) = [s for s in servers if s is not serving[0]]
        assert refused.wait(timeout=30) == 1
        assert refused.stderr.read() == (f"vgpu server: cannot listen on {address}: already "
                                         f"served by pid {serving[0].pid}\n")
        ps = _vgpu("ps", "--server", address)
        assert ps.returncode == 0 and f"(pid {serving[0].pid})" in ps.stdout, ps
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
            server.stdout.close()
            server.stderr.close()


def test_the_stale_socket_of_a_dead_server_is_replaced(tmp_path):
    address = f"ipc://{tmp_path}/stale.sock"
    dead = start_emu_server(address)
    dead.kill()
    dead.wait(timeout=10)
    assert (tmp_path / "stale.sock").exists()  # left behind by the killed server
    ps = _vgpu("ps", "--server", address)
    _one_clear_line(ps, 1, f"vgpu ps: no vgpu server at {address}")
    second = start_emu_server(address)
    try:
        ps = _vgpu("ps", "--server", address)
        assert ps.returncode == 0, ps
        assert _ps_servers(ps.stdout)[address][0].endswith(f"(pid {second.pid}): no sessions")
    finally:
        stop_server(second)


def _stale_socket(path: Path) -> None:
    """A socket file whose listener is gone, as a killed server leaves it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    sock.close()


def test_vgpu_run_removes_its_private_socket_and_stale_ones(tmp_path):
    folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "vgpu"
    folder.mkdir(exist_ok=True)
    _stale_socket(folder / "run-1-dead00.sock")
    listing = "import os, sys; print(' '.join(sorted(os.listdir(sys.argv[1]))))"
    result = vgpu_run(sys.executable, "-c", listing, folder)
    assert result.returncode == 0, result.stderr
    # While the program ran: its own private socket only, the stale one gone.
    sockets = [name for name in result.stdout.split() if name.endswith(".sock")]
    assert len(sockets) == 1 and sockets[0].startswith("run-"), result.stdout
    assert "run-1-dead00.sock" not in sockets
    assert not list(folder.glob("run-*.sock"))  # and after it: nothing left


def test_a_killed_vgpu_run_leaves_no_server_or_socket_behind():
    folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "vgpu"
    run = subprocess.Popen([*VGPU, "run", "--backend", "emu", "--", "sh", "-c",
                            "echo $$; exec sleep 60"],
                           stdout=subprocess.PIPE, text=True, env=vgpu_environment())
    program = int(run.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while not list(folder.glob(f"run-{run.pid}-*.sock")):
            assert time.monotonic() < deadline, "the private server did not start"
            time.sleep(0.1)
        run.kill()
        run.wait(timeout=10)
        deadline = time.monotonic() + 30  # milliseconds, unless the machine is very busy
        while list(folder.glob(f"run-{run.pid}-*.sock")):
            assert time.monotonic() < deadline, "the private server outlived its vgpu run"
            time.sleep(0.1)
        assert _vgpu("ps").stdout == "no vgpu server is running\n"
    finally:
        os.kill(program, signal.SIGKILL)  # the program, orphaned by the killed `vgpu run`
        run.stdout.close()


# ----------------------------------------------------------------- vgpu ps

def test_ps_fails_when_a_named_server_does_not_answer(tmp_path):
    address = f"ipc://{tmp_path}/stopped.sock"
    server = start_emu_server(address)
    try:
        server.send_signal(signal.SIGSTOP)
        ps = _vgpu("ps", "--server", address)
        _one_clear_line(ps, 1, f"vgpu ps: no answer from {address}")
    finally:
        server.send_signal(signal.SIGCONT)
        stop_server(server)
    nobody = f"ipc://{tmp_path}/nobody.sock"
    _one_clear_line(_vgpu("ps", "--server", nobody), 1, f"vgpu ps: no vgpu server at {nobody}")


def test_ps_lists_idle_servers_with_their_whole_address(tmp_path):
    address = f"ipc://{tmp_path}/idle-server-long-name.sock"  # longer than 30 characters
    server = start_emu_server(address)
    try:
        ps = _vgpu("ps")
        assert ps.returncode == 0, ps
        assert _ps_servers(ps.stdout)[address] == [
            f"server {address} (pid {server.pid}): no sessions"], ps.stdout
    finally:
        stop_server(server)


# ----------------------------------------------------------------- the default server

def test_plain_vgpu_run_shares_the_running_default_server(tmp_path, monkeypatch, driver_app,
                                                          kernels_ptx):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("VGPU_SERVER", raising=False)
    default = f"ipc://{tmp_path}/vgpu/server.sock"
    show_server = "import os; print(os.environ['VGPU_SERVER'])"
    # None running: a private server for this run.
    result = _vgpu("run", "--", sys.executable, "-c", show_server)
    assert result.returncode == 0 and "/vgpu/run-" in result.stdout, result
    server = start_emu_server(None)  # the user's default server
    try:
        result = _vgpu("run", "--", sys.executable, "-c", show_server)
        assert result.returncode == 0 and result.stdout.strip() == default, result
        holder = subprocess.Popen([*VGPU, "run", "--", sys.executable, "-c", WAITING_CLIENT],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            result = _vgpu("run", "--", driver_app, kernels_ptx, timeout=120)
            assert result.returncode == 0, result.stderr
            # Both programs were the default server's clients; no private server started.
            ps = _vgpu("ps")
            assert list(_ps_servers(ps.stdout)) == [default], ps.stdout
            assert any("time.sleep(30)" in row for row in _ps_servers(ps.stdout)[default])
        finally:
            holder.terminate()
            holder.wait(timeout=30)
            holder.stdout.close()
        # --backend asks for a private server of that backend.
        result = _vgpu("run", "--backend", "emu", "--", sys.executable, "-c", show_server)
        assert result.returncode == 0 and "/vgpu/run-" in result.stdout, result
    finally:
        stop_server(server)


def test_vgpu_run_works_from_a_folder_holding_a_vgpu_source_tree(tmp_path, driver_app,
                                                                  kernels_ptx):
    """As from the checkout vgpu was installed from: its `vgpu/` must not shadow the
    installed package in the server vgpu run starts."""
    (tmp_path / "vgpu").mkdir()
    (tmp_path / "vgpu" / "__init__.py").write_text("raise ImportError('the source tree')\n")
    vgpu_script = Path(sys.executable).parent / "vgpu"  # what `pip install` put on PATH
    result = subprocess.run([vgpu_script, "run", "--", driver_app, kernels_ptx], cwd=tmp_path,
                            capture_output=True, text=True, env=vgpu_environment(),
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "all results correct" in result.stdout
