"""CUDA's virtual memory API through vgpu's driver, from an unmodified C program
(driver_vmm.c) under `vgpu run` on an emu server: reservations at fixed addresses, physical
allocations mapped, made accessible and run over by kernels, one allocation at two
addresses (from cuda-python too), unmapping, releasing, misuse with CUDA's errors; memory
touched without the access it needs faulting as on a GPU; a session using the API
checkpointed, suspended, resumed and migrated; recording and replaying such a program; an
exported allocation's file descriptor importing only on its own server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_support import printed_checks
from running_program import RunningProgram
from vgpu_processes import emu_server, run_under_vgpu, run_vgpu

PROGRAMS = Path(__file__).resolve().parent / "programs"
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with emu_server(tmp_path_factory.mktemp("vmm")) as address:
        yield address


def checks(result) -> dict[str, tuple[int, int]]:
    """The program's "name got expected" lines; every one must hold, and it must end."""
    found = printed_checks(result)
    wrong = {name: got for name, got in found.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout, result.stdout + result.stderr
    return found


def test_reserve_map_access_alias_unmap_release_and_misuse(server, driver_vmm, kernels_ptx):
    result = run_under_vgpu(server, driver_vmm, str(kernels_ptx), timeout=TIMEOUT_S)
    found = checks(result)
    assert result.returncode == 0 and len(found) == 129, result.stdout + result.stderr
    assert "not implemented" not in result.stderr, result.stderr


def test_cuda_python_maps_one_allocation_at_two_addresses(server):
    result = run_under_vgpu(server, sys.executable, str(PROGRAMS / "vmm_aliasing.py"),
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "granularity 2097152; one allocation at two addresses: same bytes" in result.stdout


@pytest.mark.parametrize("mode, check, says", [
    ("copy-without-access", "copy_faults", "mapped without access"),
    ("kernel-without-access", "kernel_faults", "mapped without access"),
    ("write-read-only", "kernel_writing_faults", "mapped read-only"),
])
def test_memory_without_the_access_it_needs_faults(server, driver_vmm, kernels_ptx, mode,
                                                   check, says):
    result = run_under_vgpu(server, driver_vmm, str(kernels_ptx), mode, timeout=TIMEOUT_S,
                            VGPU_TRACE="1")
    assert check in checks(result) and result.returncode == 0
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in result.stderr and says in result.stderr, \
        result.stderr


def test_a_session_using_the_api_moves_with_its_mappings_and_contents(
        server, driver_vmm, kernels_ptx, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    program = RunningProgram([driver_vmm, kernels_ptx, "hold", hold], TIMEOUT_S,
                             VGPU_SERVER=server)
    try:
        with emu_server(tmp_path) as other:
            for request in (["checkpoint", program.pid, "-o", tmp_path / "vmm.vgpu"],
                            ["suspend", program.pid], ["resume", program.pid],
                            ["migrate", program.pid, "--to", other]):
                result = run_vgpu(*request, "--server", server, timeout=TIMEOUT_S)
                assert result.returncode == 0, (request, result.stderr)
            hold.unlink()
            assert program.proc.wait(timeout=TIMEOUT_S) == 0, program.transcript()
        assert "failures 0" in program.lines, program.transcript()
        wrong = [line for line in program.lines if len(line.split()) == 3
                 and line.split()[1] != line.split()[2]]
        assert not wrong, program.transcript()
    finally:
        program.stop()


def test_a_recorded_program_using_the_api_replays_with_the_same_results(
        driver_vmm, kernels_ptx, tmp_path):
    trace = tmp_path / "trace"
    recorded = run_vgpu("record", "-o", trace, "--", driver_vmm, kernels_ptx,
                        timeout=TIMEOUT_S)
    assert recorded.returncode == 0 and "failures 0" in recorded.stdout, recorded.stderr
    replayed = run_vgpu("replay", trace, "--check", timeout=TIMEOUT_S)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "every result as recorded" in replayed.stdout


def test_a_descriptor_imports_only_on_the_server_that_exported_it(server, tmp_path):
    """The descriptor of exported memory (reached through /proc here, as another process
    holding it) imports on the exporter's server; on another server, and as a memory file
    that looks like one, it imports nothing: only the server's handle in it counts."""
    hold = tmp_path / "hold"
    hold.touch()
    sharing = PROGRAMS / "vmm_shareable_fd.py"
    program = RunningProgram([sys.executable, sharing, "export", hold], TIMEOUT_S,
                             VGPU_SERVER=server)
    try:
        _, pid, _, fd = program.wait_for("pid ").split()
        imported = run_under_vgpu(server, sys.executable, str(sharing), "import", pid, fd,
                                  timeout=TIMEOUT_S)
        assert imported.stdout.split("\n")[:2] == [
            "import CUDA_SUCCESS", "holds the exporter's bytes True"], imported.stderr
        with emu_server(tmp_path) as other:
            elsewhere = run_under_vgpu(other, sys.executable, str(sharing), "import", pid, fd,
                                       timeout=TIMEOUT_S)
        forged = run_under_vgpu(server, sys.executable, str(sharing), "forge",
                                timeout=TIMEOUT_S)
        for refused in (elsewhere, forged):
            assert refused.stdout == "import CUDA_ERROR_INVALID_VALUE\n", refused.stderr
        hold.unlink()
        assert program.proc.wait(timeout=TIMEOUT_S) == 0, program.transcript()
    finally:
        program.stop()
