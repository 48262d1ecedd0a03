"""Fixtures: a vgpu server in its own process, on a private ipc address."""

from __future__ import annotations

import os
import subprocess

import pytest
from vgpu_processes import start_emu_server


class ServerProcess:
    def __init__(self, address: str, *options: str):
        self.address = address
        self.proc = start_emu_server(address, *options, stderr=subprocess.PIPE)

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


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock")
    yield srv
    srv.stop()


@pytest.fixture
def client_env(server):
    return {**os.environ, "VGPU_SERVER": server.address}
