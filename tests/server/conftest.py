"""Fixtures: a vgpu server in its own process, on a private ipc address."""

from __future__ import annotations

import os

import pytest
from vgpu_processes import ServerProcess


@pytest.fixture
def server(tmp_path):
    # Kernels run on the interpreter: tests here make long kernels by counting (the spin
    # kernel of programs/spin.ptx), which compiled code does a thousand times faster.
    srv = ServerProcess(f"ipc://{tmp_path}/server.sock", "--no-compile")
    yield srv
    srv.stop()


@pytest.fixture
def client_env(server):
    return {**os.environ, "VGPU_SERVER": server.address}
