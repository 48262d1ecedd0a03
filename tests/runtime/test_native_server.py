"""Runtime-API programs under `vgpu run` on an emu server that compiles kernels to native code
(`vgpu server --compile --threads 2`): the results and memory-checker reports the
interpreter gives, with the kernels these programs launch compiled, not interpreted."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fault_reports import check_past_the_end_reports
from vgpu_processes import run_under_vgpu, start_emu_server, stop_server, vgpu_environment

PROGRAMS = Path(__file__).resolve().parent / "programs"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("native-server")
    env = vgpu_environment(VGPU_CACHE_DIR=str(work / "cache"))
    with open(work / "server.log", "w") as log:
        proc = start_emu_server(f"ipc://{work}/server.sock", "--compile", "--threads", "2", "-v",
                                stderr=log, env=env)
        try:
            yield f"ipc://{work}/server.sock", work / "server.log"
        finally:
            stop_server(proc)


def build(toolkit, name: str) -> Path:
    return toolkit.executable((PROGRAMS / f"{name}.cu").read_text(),
                              ["-cudart", "shared", f"-I{PROGRAMS}"])


@pytest.mark.parametrize("name,line", [
    ("vector_add", "vector_add: 1000 sums correct"),
    ("matmul_tiled", "matmul_tiled: 40x36 product correct"),
])
def test_programs_run_compiled(toolkit, server, name, line):
    result = run_under_vgpu(server[0], build(toolkit, name), timeout=TIMEOUT_S)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert line in result.stdout
    assert "runs on the interpreter" not in server[1].read_text()


def test_reads_past_the_end_are_reported_as_the_interpreter_reports_them(toolkit, server):
    result = run_under_vgpu(server[0], build(toolkit, "out_of_bounds"), timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    check_past_the_end_reports(result)
    assert "runs on the interpreter" not in server[1].read_text()
