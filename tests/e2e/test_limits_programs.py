"""Programs on a server with limits: what they see and get when they pass them."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import printed_checks
from vgpu_processes import emu_server, run_under_vgpu

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def driver_quota(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_quota.c").read_text())


def test_a_program_runs_out_of_its_memory_limit_and_goes_on(driver_quota, tmp_path):
    with emu_server(tmp_path, "--mem-limit", "4M") as address:
        result = run_under_vgpu(address, driver_quota, timeout=120)
    checks = printed_checks(result)
    wrong = {name: got for name, got in checks.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout and result.returncode == 0, result.stderr
    assert len(checks) == 22
