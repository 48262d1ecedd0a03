"""Programs on a server with limits: what they see and get when they pass them."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import printed_checks
from vgpu_processes import (
    ServerProcess,
    curve_homes,
    emu_server,
    run_under_vgpu,
    vgpu_environment,
)

from vgpu.client import Connection
from vgpu.errors import CudaError

CUDA_ERROR_DEVICE_UNAVAILABLE = 46

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


def test_a_keys_limits_bound_its_sessions_over_tcp(driver_quota, tmp_path, monkeypatch):
    """A client key's authorized-keys entry says how much device memory its sessions may
    hold together, and how many it may have: its program sees a device that size and runs
    out there; a session past the count is refused while the first one lives."""
    server_home, client_home = curve_homes(tmp_path)
    entry = server_home / "authorized-keys" / "client.key"
    public = (client_home / "client.pub").read_text().strip()
    entry.write_text(f"{public} mem-limit=4M sessions=1\n")
    server = ServerProcess("tcp://127.0.0.1:*", env=vgpu_environment(VGPU_HOME=str(server_home)))
    try:
        result = run_under_vgpu(server.address, driver_quota, timeout=120,
                                VGPU_HOME=str(client_home))
        checks = printed_checks(result)
        wrong = {name: got for name, got in checks.items() if got[0] != got[1]}
        assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
        assert "failures 0" in result.stdout and result.returncode == 0, result.stderr
        monkeypatch.setenv("VGPU_HOME", str(client_home))
        first = Connection(server.address)
        try:
            with pytest.raises(CudaError) as refused:
                Connection(server.address)
            assert refused.value.code == CUDA_ERROR_DEVICE_UNAVAILABLE
            assert "session" in refused.value.message, refused.value.message
        finally:
            first.close()
        Connection(server.address).close()  # the first one gone, there is room again
    finally:
        server.stop()
