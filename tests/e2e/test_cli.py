"""The `vgpu` command as a user drives it: named servers, child processes, `vgpu ps`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from e2e_support import VGPU, vgpu_run


def _server(address: str) -> subprocess.Popen:
    proc = subprocess.Popen([*VGPU, "server", "--listen", address, "--backend", "emu"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("vgpu server listening")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_run_on_a_named_server_and_ps_lists_the_session(tmp_path, driver_app, kernels_ptx):
    address = f"ipc://{tmp_path}/named.sock"
    server = _server(address)
    try:
        # A client that holds 1 MiB and waits, so that ps sees it.
        code = ("from cuda.bindings import driver as cu; import time\n"
                "cu.cuInit(0); _, d = cu.cuDeviceGet(0); _, c = cu.cuDevicePrimaryCtxRetain(d)\n"
                "cu.cuCtxSetCurrent(c); cu.cuMemAlloc(1 << 20); print('ready', flush=True)\n"
                "time.sleep(30)\n")
        env = {**os.environ}
        env.pop("VGPU_SERVER", None)
        holder = subprocess.Popen([*VGPU, "run", "--server", address, "--", sys.executable, "-c",
                                   code], stdout=subprocess.PIPE, text=True, env=env)
        assert holder.stdout.readline().strip() == "ready"
        ps = subprocess.run([*VGPU, "ps", "--server", address], capture_output=True, text=True,
                            check=True).stdout
        line = next(row for row in ps.splitlines() if "time.sleep" in row)
        assert "emu" in line and "1.0 MiB" in line, ps
        os.kill(int(line.split()[0]), signal.SIGKILL)  # the program itself, not `vgpu run`
        assert holder.wait(timeout=10) == 128 + signal.SIGKILL
        holder.stdout.close()
        # The named server outlives its clients and serves the next one.
        result = subprocess.run([*VGPU, "run", "--server", address, "--", str(driver_app),
                                 str(kernels_ptx)], capture_output=True, text=True, env=env,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 5
        while "time.sleep" in subprocess.run([*VGPU, "ps", "--server", address],
                                             capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the killed client's session stayed"
            time.sleep(0.2)
    finally:
        _stop(server)


def test_child_processes_use_vgpu_too(driver_app, kernels_ptx):
    result = vgpu_run("sh", "-c", f"'{driver_app}' '{kernels_ptx}' && echo child-done")
    assert result.returncode == 0, result.stderr
    assert "all results correct" in result.stdout and "child-done" in result.stdout


def test_missing_command_and_unknown_program_are_clear_errors():
    result = subprocess.run([*VGPU, "run", "--"], capture_output=True, text=True)
    assert result.returncode == 2 and "no command given" in result.stderr
    result = vgpu_run("no-such-program-anywhere")
    assert result.returncode == 127 and "command not found" in result.stderr


def test_a_damaged_executable_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken"
    broken.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9)  # an ELF header cut short
    broken.chmod(0o755)
    result = vgpu_run(broken)
    assert result.returncode == 126
    assert "vgpu run: cannot run" in result.stderr and "Traceback" not in result.stderr


def test_unreachable_server_is_device_unavailable_not_a_hang(tmp_path, driver_app, kernels_ptx):
    env = {**os.environ, "VGPU_TIMEOUT": "2"}
    start = time.monotonic()
    result = subprocess.run([*VGPU, "run", "--server", f"ipc://{tmp_path}/nobody.sock", "--",
                             str(driver_app), str(kernels_ptx)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 1
    assert "no answer from the vgpu server" in result.stderr
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in result.stderr


def test_ps_finds_the_private_server_of_a_vgpu_run():
    code = ("from cuda.bindings import driver as cu; import time\n"
            "cu.cuInit(0); print('ready', flush=True); time.sleep(30)\n")
    env = {**os.environ}
    env.pop("VGPU_SERVER", None)
    holder = subprocess.Popen([*VGPU, "run", "--", sys.executable, "-c", code],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "ready"
        ps = subprocess.run([*VGPU, "ps"], capture_output=True, text=True, check=True).stdout
        rows = [row for row in ps.splitlines() if "time.sleep(30)" in row]
        assert rows and any(f"run-{holder.pid}-" in row for row in rows), ps
    finally:
        holder.terminate()  # forwarded to the program; the private server stops after it
        holder.wait(timeout=30)
        holder.stdout.close()
