"""Large pageable copies (a megabyte and more), which a local client makes itself into the
device allocations it maps: right bytes, right order against kernels, no stale mappings."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from vgpu_processes import run_under_vgpu

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def large_copies(toolkit) -> Path:
    return toolkit.c_program((HERE / "programs" / "large_copies.c").read_text())


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_large_copies_are_right_on_a_named_server(server, large_copies):
    files_before = _open_files(server.proc.pid)
    for _ in range(2):  # a second program finds the server as the first left it
        result = run_under_vgpu(server.address, large_copies, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "all large copies correct\n"
    # Every session's device memory files are closed with it.
    deadline = time.monotonic() + 5
    while _open_files(server.proc.pid) != files_before:
        assert time.monotonic() < deadline, "the server kept files of finished sessions"
        time.sleep(0.1)


def test_large_copies_are_right_with_a_private_server(large_copies):
    result = run_under_vgpu(None, large_copies, timeout=120)  # a private server
    assert result.returncode == 0, result.stderr
    assert result.stdout == "all large copies correct\n"
