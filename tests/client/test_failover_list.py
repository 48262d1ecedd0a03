"""`vgpu run` with a failover list: the addresses go to the program as they are, and no
private server starts for it."""

from __future__ import annotations

import subprocess
import sys

from vgpu_processes import VGPU, vgpu_environment

SHOW_SERVER = "import os; print(os.environ['VGPU_SERVER'])"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*VGPU, "run", *args], capture_output=True, text=True, timeout=60,
                          env=vgpu_environment(**env))


def test_a_failover_list_reaches_the_program_unchanged(tmp_path):
    servers = f"ipc://{tmp_path}/a.sock,ipc://{tmp_path}/b.sock"
    for result in (_run("--server", servers, "--", sys.executable, "-c", SHOW_SERVER),
                   _run("--", sys.executable, "-c", SHOW_SERVER, VGPU_SERVER=servers)):
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == servers  # not a private server's address


def test_a_bad_address_in_a_failover_list_is_one_clear_line(tmp_path):
    servers = f"ipc://{tmp_path}/a.sock,tcp://localhost"
    result = _run("--server", servers, "--", "true")
    assert result.returncode == 2
    assert result.stderr == (f"vgpu run: --server {servers} (tcp://localhost): a tcp address "
                             "needs a host and a port (tcp://host:port)\n")
    result = _run("--", "true", VGPU_SERVER=" , ")
    assert result.returncode == 2
    assert result.stderr == "vgpu run: VGPU_SERVER= , : no server address given\n"
