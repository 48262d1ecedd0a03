"""What a program that goes wrong on the device is told, under `vgpu run` on the emu backend:
kernel faults and device asserts on stderr when their error surfaces, the memory checker's
reports of accesses past an allocation's end (VGPU_MEMCHECK), and the printf FIFO limit."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from vgpu_processes import emu_server, run_under_vgpu

PROGRAMS = Path(__file__).resolve().parent / "programs"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An emu server with the default memory checking, logging at -v."""
    work = tmp_path_factory.mktemp("fault-server")
    with open(work / "server.log", "w") as log, emu_server(work, "-v", stderr=log) as address:
        yield address, work / "server.log"


def _build(toolkit, name: str) -> Path:
    return toolkit.executable((PROGRAMS / f"{name}.cu").read_text(),
                              ["-cudart", "shared", f"-I{PROGRAMS}"])


def _run(address: str, program: Path, *args: str, merged: bool = False,
         **env: str) -> subprocess.CompletedProcess:
    return run_under_vgpu(address, program, *args, timeout=TIMEOUT_S, merged=merged, **env)


def _allocation(result) -> int:
    return int(re.search(r"values at (0x[0-9a-f]+)", result.stdout).group(1), 16)


# ----------------------------------------------------------------- out-of-bounds accesses

def check_past_the_end_reports(result: subprocess.CompletedProcess) -> None:
    """out_of_bounds's reads one element past the end: reported once per kernel."""
    end = _allocation(result) + 400
    reports = [line for line in result.stderr.splitlines() if "Invalid __global__" in line]
    assert len(reports) == 2, result.stderr  # two kernels, each launched twice
    assert reports[0].startswith(
        f"vgpu memcheck: Invalid __global__ read of size 4 at 0x{end:x} by thread (99,0,0) "
        f"in block (0,0,0) of kernel 'sum_next' (PTX line ")
    assert reports[1].startswith(
        f"vgpu memcheck: Invalid __global__ read of size 4 at 0x{end:x} by thread (2,0,0) "
        f"in block (0,0,0) of kernel 'read_at' (PTX line ")
    assert all(r.endswith(f"is 0 bytes after the nearest allocation at 0x{end - 400:x} of "
                          f"size 400 bytes") for r in reports)


@pytest.fixture(scope="module")
def out_of_bounds(toolkit) -> Path:
    return _build(toolkit, "out_of_bounds")


@pytest.fixture(scope="module")
def out_of_bounds_ptx(toolkit) -> list[str]:
    return toolkit.ptx((PROGRAMS / "out_of_bounds.cu").read_text()).splitlines()


def test_reads_past_the_end_run_as_on_a_gpu_and_are_reported_once_per_kernel(
        server, out_of_bounds):
    result = _run(server[0], out_of_bounds)
    assert result.returncode == 0, result.stderr
    assert "synchronize returned 0" in result.stdout
    check_past_the_end_reports(result)
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in result.stderr  # the report says how to be strict


def test_strict_memcheck_makes_them_illegal_addresses_said_once(
        server, out_of_bounds, out_of_bounds_ptx):
    result = _run(server[0], out_of_bounds, VGPU_MEMCHECK="strict")
    assert result.returncode == 3
    assert "synchronize returned 700" in result.stdout and "again 700" in result.stdout
    end = _allocation(result) + 400
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # said once, though returned twice
    match = re.fullmatch(
        rf"vgpu: CUDA_ERROR_ILLEGAL_ADDRESS: Invalid __global__ read of size 4 at 0x{end:x} "
        rf"by thread \(99,0,0\) in block \(0,0,0\) of kernel 'sum_next' \(PTX line (\d+)\): "
        rf"address is out of bounds and is 0 bytes after the nearest allocation at "
        rf"0x{end - 400:x} of size 400 bytes", lines[0])
    assert match, lines[0]
    assert out_of_bounds_ptx[int(match.group(1)) - 1].strip().startswith("ld.global")
    log = server[1].read_text()
    assert "kernel failed with 700: Invalid __global__ read of size 4" in log


def test_the_fault_travels_with_the_call_under_trace(server, out_of_bounds):
    result = _run(server[0], out_of_bounds, VGPU_MEMCHECK="strict", VGPU_TRACE="1")
    assert result.returncode == 3
    assert re.search(r"vgpu trace: cudaDeviceSynchronize: Invalid __global__ read of size 4 "
                     r"at 0x[0-9a-f]+ by thread \(99,0,0\)", result.stderr), result.stderr


def test_a_read_far_outside_any_allocation_faults_by_default(server, out_of_bounds):
    result = _run(server[0], out_of_bounds, "far")
    assert result.returncode == 3
    assert "synchronize returned 700" in result.stdout
    far = _allocation(result) + (1 << 20)
    assert (f"vgpu: CUDA_ERROR_ILLEGAL_ADDRESS: Invalid __global__ read of size 4 at "
            f"0x{far:x} by thread (0,0,0) in block (0,0,0) of kernel 'read_at'"
            in result.stderr), result.stderr
    assert "vgpu memcheck" not in result.stderr


def test_the_server_option_is_the_default_the_application_overrides(
        tmp_path, out_of_bounds):
    with emu_server(tmp_path, "--memcheck", "strict") as address:
        strict = _run(address, out_of_bounds)
        assert strict.returncode == 3 and "returned 700" in strict.stdout
        relaxed = _run(address, out_of_bounds, VGPU_MEMCHECK="report")
        assert relaxed.returncode == 0, relaxed.stderr
        assert "vgpu memcheck: Invalid __global__ read" in relaxed.stderr
        typo = _run(address, out_of_bounds, VGPU_MEMCHECK="strcit")
        assert typo.returncode == 3
        assert "VGPU_MEMCHECK='strcit' is not one of report, strict" in typo.stderr


# ----------------------------------------------------------------- device assert and printf

def test_assert_prints_the_launch_printf_then_a_line_per_failing_thread(server, toolkit):
    program = _build(toolkit, "assert_output")
    result = _run(server[0], program)
    assert result.returncode == 0, result.stderr
    values = [1, 2, 3, -4, 5, 6, 7, -8, 9]
    printed = [f"thread {i} checks {v}" for i, v in enumerate(values)]
    assert result.stdout.splitlines() == [*printed, "assert_output: error 710"]
    failed = [f"main.cu:12: void check(const int *, int): block: [0,0,0], thread: [{i},0,0] "
              f"Assertion `values[i] > 0` failed." for i in (3, 7)]
    assert result.stderr.splitlines() == failed
    merged = _run(server[0], program, merged=True)
    assert merged.stdout.splitlines() == [*printed, *failed, "assert_output: error 710"]


def test_printf_fifo_limit_drops_what_does_not_fit_until_reset(server, toolkit):
    """The program also checks CUDA's rule: the size is fixed once a printf kernel ran."""
    result = _run(server[0], _build(toolkit, "printf_fifo"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "printf_fifo: small fifo 4096"
    reset = lines.index("printf_fifo: after reset 1048576")
    small, full = lines[1:reset], lines[reset + 1:-1]
    assert sorted(full) == sorted(f"line {n}" for n in range(1000))
    # 4 KiB holds 170 records of a format address and one int; the first calls are kept:
    # each of the 100 threads keeps its first rounds (which thread's calls came first is
    # the device's choice).
    assert len(small) == len(set(small)) == 170 and set(small) <= set(full)
    kept = [int(line.split()[1]) for line in small]
    for thread in range(100):
        rounds = sorted(n // 100 for n in kept if n % 100 == thread)
        assert rounds == list(range(len(rounds))), (thread, rounds)
