"""scripts/gpu-check's parts that need no GPU: how it compares a program's output under vgpu
with the native one, reads benchmark figures and judges them, and what it does on a machine
without a GPU (this one)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_check  # noqa: E402
from gpu_check import Budget, Run, Step, compare_outputs, parse_figures  # noqa: E402


def test_the_same_output_but_for_addresses_times_and_free_memory_is_the_same():
    native = Run(0, "ptr 0x7f0012340000\nelapsed 1.25 ms\nfree 1234567 of 80000\nok\n")
    vgpu = Run(0, "ptr 0x100000000200\nelapsed 3.5ms\nfree 999 of 80000\nok\n")
    assert compare_outputs(native, vgpu) == []


def test_device_printf_in_another_order_is_the_same_output():
    native = Run(0, "host before\nblock 0 says 1\nblock 1 says 2\nhost after\n")
    vgpu = Run(0, "host before\nblock 1 says 2\nblock 0 says 1\nhost after\n")
    assert compare_outputs(native, vgpu) == []


def test_a_different_result_or_exit_status_is_named():
    native, vgpu = Run(0, "sum 42\nall correct\n"), Run(1, "sum 41\n")
    differences = compare_outputs(native, vgpu)
    assert differences[0] == "exit status 1 under vgpu, 0 natively"
    assert "'sum 42'" in differences[1] and "'sum 41'" in differences[1]
    assert "'all correct'" in differences[1]
    assert compare_outputs(Run(0, "total 10 of 80000"), Run(0, "total 12 of 80000"))


def test_figures_are_read_and_compared_with_the_native_ones():
    native = parse_figures("rss_kib 100\nidle_sync_s 0.000002\nhtod_bytes_per_s 5e10\nnoise\n")
    vgpu = parse_figures("idle_sync_s 0.000004\nhtod_bytes_per_s 4e10\ncopy mismatch\n")
    assert native == {"rss_kib": 100, "idle_sync_s": 2e-6, "htod_bytes_per_s": 5e10}
    rows = gpu_check.ratio_rows(native, vgpu, {"idle_sync_s": "sync", "htod_bytes_per_s":
                                               "htod", "launch_rate_client_per_s": "launch"})
    assert rows == [("sync", 2e-6, 4e-6, pytest.approx(2.0)),
                    ("htod", 5e10, 4e10, pytest.approx(0.8))]
    table = gpu_check.ratio_table(rows)
    assert table[2] == "| sync | 2e-06 | 4e-06 | 2.000 |"


def test_the_kernel_bound_bar_is_three_percent():
    assert gpu_check.kernel_bound_verdict(2.0, 2.05) == (pytest.approx(0.025), True)
    assert gpu_check.kernel_bound_verdict(2.0, 2.1) == (pytest.approx(0.05), False)


def test_a_failing_step_is_reported_and_the_next_ones_still_run():
    steps: list[Step] = []

    def broken(step: Step) -> None:
        raise RuntimeError("the server did not start")

    def fine(step: Step) -> None:
        step.lines.append("all good")
        step.passed = True

    gpu_check.run_step(steps, "first", broken)
    gpu_check.run_step(steps, "second", fine)
    assert [(s.name, s.passed) for s in steps] == [("first", False), ("second", True)]
    text = gpu_check.report(steps, "a GPU")
    assert "| first | FAILED |" in text and "| second | passed |" in text
    assert "stopped: RuntimeError: the server did not start" in text and "all good" in text


def test_the_budget_counts_from_the_installation():
    budget = Budget(time.time() - 7 * 60)  # installing took seven of the eight minutes
    assert 50 < budget.left(300) <= 60
    assert budget.left(10) == 10
    with pytest.raises(TimeoutError):
        Budget(time.time() - 8 * 60).left(60)


def test_without_nvidia_smi_it_says_so_in_one_line(tmp_path):
    out = tmp_path / "figures.md"
    result = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": str(tmp_path)})  # no nvidia-smi, even on a GPU host
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "gpu-check: no NVIDIA GPU with a working driver here (nvidia-smi finds none); "
        "this check needs one"]
    assert "GPU: none" in out.read_text()


def test_the_fault_step_passes_on_a_cuda_server_whose_sessions_have_processes(tmp_path):
    """The step that shows one session's fault leaving another working, run where a GPU's
    cuda server is stood in for by the nested one (whose driver keeps a fault for the whole
    process, as NVIDIA's does)."""
    from types import SimpleNamespace

    from vgpu_processes import VGPU, nested_cuda_server, vgpu_environment

    with nested_cuda_server(tmp_path) as address:
        machine = SimpleNamespace(
            launchers={"vgpu": ([*VGPU, "run", "--server", address, "--"], vgpu_environment())},
            budget=Budget(time.time(), 300))
        step = Step("a fault beside another session")
        gpu_check.fault_beside_another(machine, step)
    assert step.passed, "\n".join(step.lines)
