"""Sessions that move while their programs run: checkpoints and failover to a standby server,
live migration, suspend and resume, incremental checkpoints, damaged and unwritable images.

Every program runs unmodified under `vgpu run` against real servers (emu ones; one migration
goes to the nested cuda backend and back), and pauses where a test asks (a pause file, see
programs/state_loop.c), so that each step happens at a known iteration. A moved program
must end as an uninterrupted run does: the same checksum (state_model computes it on the
host), its allocations at the same addresses, and its module's __device__ counter, 1000 at
the start, at 1000 plus the iterations run.
"""

from __future__ import annotations

import hashlib
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from running_program import RunningProgram, pause_at
from state_model import expected_checksum, managed_loop_checksum
from vgpu_processes import run_vgpu, start_emu_server, start_nested_cuda_server, stop_server

PROGRAMS = Path(__file__).resolve().parent / "programs"
TIMEOUT_S = 60  # for any one wait: a program's line, a command, a server's stop
MIB = 1 << 20


# ----------------------------------------------------------------- servers and commands

class Server:
    def __init__(self, address: str, proc: subprocess.Popen, log: Path):
        self.address, self.proc, self.log = address, proc, log

    def __str__(self) -> str:
        return self.address

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed machine does, telling nobody."""
        self.proc.kill()
        self.proc.wait(timeout=TIMEOUT_S)


@pytest.fixture
def servers(tmp_path):
    """start(name, *options, backend="emu", devices=1): a server listening in tmp_path,
    offering `devices`, stopped at the test's end (its stderr in tmp_path/NAME.log). A `cuda`
    one is the nested pair: a cuda-backend server run under vgpu against an emu server of
    its own, which offers the devices."""
    started: list[Server] = []
    inner: list[subprocess.Popen] = []  # the emu servers under cuda-backend ones

    def start(name: str, *options, backend: str = "emu", devices: int = 1) -> Server:
        log = tmp_path / f"{name}.log"
        address = f"ipc://{tmp_path}/{name}.sock"
        try:
            with log.open("w") as stderr:
                if backend == "cuda":
                    inner.append(start_emu_server(f"ipc://{tmp_path}/{name}-device.sock",
                                                  "--devices", str(devices), stderr=stderr))
                    proc = start_nested_cuda_server(inner[-1].endpoint, address,
                                                    *map(str, options), stderr=stderr)
                else:
                    proc = start_emu_server(address, *map(str, options), "--devices",
                                            str(devices), stderr=stderr)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{log.read_text()}") from None
        started.append(Server(address, proc, log))
        return started[-1]

    yield start
    hung = []
    for proc in [server.proc for server in started] + inner:  # every one, even after a hung one
        try:
            stop_server(proc)
        except subprocess.TimeoutExpired:
            hung.append(proc.args)
    assert not hung, f"servers that did not stop on SIGTERM within 10 s: {hung}"


@pytest.fixture
def programs():
    """run(command, **env): a RunningProgram, stopped at the test's end if still running."""
    running: list[RunningProgram] = []

    def run(command: list, **env: str) -> RunningProgram:
        running.append(RunningProgram(command, TIMEOUT_S, **env))
        return running[-1]

    yield run
    for program in running:
        program.stop()


def vgpu(*args) -> subprocess.CompletedProcess:
    return run_vgpu(*args, timeout=TIMEOUT_S)


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args[2:]}: exit {result.returncode}\n" \
        f"{result.stdout}{result.stderr}"
    return result


def ps_row(server: Server, pid: int) -> str | None:
    """The row of `vgpu ps --server` for the session of program `pid`, None if it has none."""
    output = succeeded(vgpu("ps", "--server", server)).stdout
    return next((line for line in output.splitlines() if line.split()[:1] == [str(pid)]), None)


def checkpoint_figures(output: str) -> tuple[int, float, int]:
    """What `vgpu checkpoint` says it did: chunks in the image, bytes it wrote, and chunks
    it found already written."""
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    match = re.search(r"in (\d+) chunks?, wrote ([\d.]+) (B|KiB|MiB|GiB) \((\d+) shared\)",
                      output)
    assert match, f"no figures in {output!r}"
    return (int(match.group(1)), float(match.group(2)) * units[match.group(3)],
            int(match.group(4)))


def wait_for_image(folder: Path) -> Path:
    """The first checkpoint image a server's policy wrote into `folder` (written whole, then
    renamed: one that is there is complete)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        images = list(folder.glob("*.vgpu"))
        if images:
            return images[0]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint image in {folder} within {TIMEOUT_S} s: "
                         f"{sorted(p.name for p in folder.iterdir())}")


# ----------------------------------------------------------------- the programs' results

def assert_finished_like_an_uninterrupted_run(program: RunningProgram, count: int,
                                              total_kib: int, iterations: int, stride: int = 1,
                                              only: int | None = None) -> None:
    code = program.finish()
    assert code == 0, program.transcript()
    checksums = [line.split()[1] for line in program.lines if line.startswith("checksum ")]
    assert checksums == [expected_checksum(count, total_kib, iterations, stride, only)], \
        program.transcript()
    pointers = [line for line in program.lines if line.startswith("pointers ")]
    assert len(pointers) == 2 and pointers[0] == pointers[1], program.transcript()
    counters = [line.split()[1:] for line in program.lines if line.startswith("counter ")]
    assert counters == [[counters[0][0], "1000"], [counters[0][0], str(1000 + iterations)]], \
        program.transcript()


def state_loop_command(state_loop, ptx, count, total_kib, iterations, stride, pause_file,
                       *options) -> list:
    return [state_loop, ptx, count, total_kib, iterations, stride, "--pause-file", pause_file,
            *options]


# ----------------------------------------------------------------- unmoved

@pytest.mark.parametrize("kind", ["driver", "runtime", "cuda-python"])
def test_the_programs_compute_what_the_host_model_says_when_nothing_moves(
        tmp_path, servers, programs, state_loop, rt_state_loop, state_kernels_ptx, kind):
    """The reference the other tests hold moved programs to, paused and resumed once."""
    server = servers("server")
    pause = tmp_path / "pause"
    pause_at(pause, 2)
    commands = {
        "driver": state_loop_command(state_loop, state_kernels_ptx, 3, 3072, 5, 2, pause),
        "runtime": [rt_state_loop, 3072, 5, "--pause-file", pause],
        "cuda-python": [sys.executable, PROGRAMS / "state_loop.py", state_kernels_ptx, 3, 3072,
                        5, 2, "--pause-file", pause],
    }
    program = programs(commands[kind], VGPU_SERVER=str(server))
    program.wait_for("paused 2")
    pause.unlink()
    if kind == "runtime":
        assert_finished_like_an_uninterrupted_run(program, 2, 3072, 5)
    else:
        assert_finished_like_an_uninterrupted_run(program, 3, 3072, 5, 2)


# ----------------------------------------------------------------- failover

def test_a_standby_takes_over_from_a_killed_server_at_its_last_checkpoint(
        tmp_path, servers, programs, state_loop, state_kernels_ptx):
    """256 MiB in four allocations: the primary checkpoints by policy, dies, and the standby
    restores its image; the client resends what it sent since."""
    images = tmp_path / "checkpoints"
    images.mkdir()
    primary = servers("primary", "--checkpoint-dir", images, "--checkpoint-every", 1)
    standby = servers("standby", "--checkpoint-dir", images)
    shape = (4, 256 * 1024, 40, 1024)  # count, KiB, iterations, stride
    pause = tmp_path / "pause"
    pause_at(pause, 10)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=f"{primary},{standby}")
    program.wait_for("paused 10")
    wait_for_image(images)
    pause_at(pause, 15)  # work that no image covers: the client holds it for the standby
    program.wait_for("paused 15")
    primary.kill()
    pause_at(pause, 40)
    program.wait_for("paused 40")
    row = ps_row(standby, program.pid)
    assert row is not None and "256.0 MiB" in row, row
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


def test_a_standby_takes_over_while_kernels_run(tmp_path, servers, programs, state_loop,
                                               state_kernels_ptx):
    """The primary dies in the middle of the loop, with launches queued and running."""
    images = tmp_path / "checkpoints"
    images.mkdir()
    # The primary interprets its kernels, so that it is still running them when it dies.
    primary = servers("primary", "--checkpoint-dir", images, "--checkpoint-every", 0.3,
                      "--no-compile")
    standby = servers("standby", "--checkpoint-dir", images)
    shape = (4, 4096, 40, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 40)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=f"{primary},{standby}")
    program.wait_for("iteration 2")
    wait_for_image(images)
    primary.kill()
    assert not any(line.startswith("paused") for line in program.lines), "killed too late"
    program.wait_for("paused 40")
    assert ps_row(standby, program.pid) is not None
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


# ----------------------------------------------------------------- live migration

@pytest.mark.parametrize("there", ["emu", "cuda"])
def test_a_session_migrates_there_and_back_while_its_program_runs(
        tmp_path, servers, programs, state_loop, state_kernels_ptx, there):
    """From an emu server to another server (emu, or the nested cuda backend) and back:
    the program ends as if nothing had moved."""
    first, second = servers("first"), servers("second", backend=there)
    shape = (4, 4096, 20, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 3)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=str(first))
    program.wait_for("paused 3")
    succeeded(vgpu("migrate", program.pid, "--to", second, "--server", first))
    assert ps_row(first, program.pid) is None
    pause_at(pause, 6)  # its client follows at its next call
    program.wait_for("paused 6")
    assert ps_row(second, program.pid) is not None
    pause_at(pause, 20)
    program.wait_for("iteration 8")
    # Back while it runs: kernels queued and executing, the program waiting on them.
    succeeded(vgpu("migrate", program.pid, "--to", first, "--server", second))
    program.wait_for("paused 20")
    assert ps_row(second, program.pid) is None
    assert ps_row(first, program.pid) is not None
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


def test_a_session_on_two_devices_migrates_to_cuda_and_back(tmp_path, servers, programs,
                                                            managed_kernels_ptx):
    """A program using two devices (memory, modules, contexts and a stream on each, peer
    copies) moves from an emu server offering two to the nested cuda backend driving two
    GPUs, and back: its results are the host's, its memory stays at its addresses and on
    its devices."""
    first, second = servers("first", devices=2), servers("second", backend="cuda", devices=2)
    pause = tmp_path / "pause"
    pause_at(pause, 2)
    program = programs([sys.executable, PROGRAMS / "two_device_loop.py", managed_kernels_ptx,
                        3000, 6, "--pause-file", pause], VGPU_SERVER=str(first))
    program.wait_for("paused 2")
    succeeded(vgpu("migrate", program.pid, "--to", second, "--server", first))
    pause_at(pause, 4)
    program.wait_for("paused 4")
    assert ps_row(first, program.pid) is None and ps_row(second, program.pid) is not None
    succeeded(vgpu("migrate", program.pid, "--to", first, "--server", second))
    pause.unlink()
    assert program.finish() == 0, program.transcript()
    assert ps_row(second, program.pid) is None
    assert [line for line in program.lines if line.startswith("device ")] == [
        "device 0 matches the host: True", "device 1 matches the host: True"]
    pointers = [line for line in program.lines if line.startswith("pointers ")]
    assert len(pointers) == 2 and pointers[0] == pointers[1], program.transcript()
    assert pointers[0].endswith("on devices 0 1"), program.transcript()


@pytest.mark.parametrize("how", [(), ("--stop-and-copy",)], ids=["pre-copy", "stop-and-copy"])
def test_a_runtime_api_program_survives_a_migration(tmp_path, servers, programs,
                                                    rt_state_loop, how):
    """Two streams, events, __constant__ data and stream-ordered copies, moved while kernels
    run."""
    first, second = servers("first"), servers("second")
    pause = tmp_path / "pause"
    pause_at(pause, 12)
    program = programs([rt_state_loop, 2048, 12, "--pause-file", pause],
                       VGPU_SERVER=str(first))
    program.wait_for("iteration 3")
    succeeded(vgpu("migrate", program.pid, "--to", second, "--server", first, *how))
    program.wait_for("paused 12")
    assert ps_row(second, program.pid) is not None
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, 2, 2048, 12)


def test_managed_memory_survives_a_migration(tmp_path, servers, programs, managed_loop):
    """Managed memory and a __managed__ variable, moved between iterations: the host's view
    stays at the same addresses, and what the host and the kernels write afterwards meets
    the moved contents as if nothing had moved."""
    first, second = servers("first"), servers("second")
    words, iterations = 3000, 8
    pause = tmp_path / "pause"
    pause_at(pause, 4)
    program = programs([managed_loop, words, iterations, "--pause-file", pause],
                       VGPU_SERVER=str(first))
    program.wait_for("paused 4")
    succeeded(vgpu("migrate", program.pid, "--to", second, "--server", first))
    pause.unlink()
    assert program.finish() == 0, program.transcript()
    assert ps_row(first, program.pid) is None
    checksums = [line.split()[1] for line in program.lines if line.startswith("checksum ")]
    assert checksums == [managed_loop_checksum(words, iterations)], program.transcript()
    pointers = [line for line in program.lines if line.startswith("pointers ")]
    assert len(pointers) == 2 and pointers[0] == pointers[1], program.transcript()


def test_a_cuda_python_program_survives_a_migration(tmp_path, servers, programs,
                                                    state_kernels_ptx):
    first, second = servers("first"), servers("second")
    shape = (4, 4096, 12, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 12)
    program = programs([sys.executable, PROGRAMS / "state_loop.py", state_kernels_ptx, *shape,
                        "--pause-file", pause], VGPU_SERVER=str(first))
    program.wait_for("iteration 3")
    succeeded(vgpu("migrate", program.pid, "--to", second, "--server", first))
    program.wait_for("paused 12")
    assert ps_row(second, program.pid) is not None
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


def test_a_migration_to_a_server_that_is_not_there_fails_and_the_program_runs_on(
        tmp_path, servers, programs, state_loop, state_kernels_ptx):
    server = servers("server")
    shape = (2, 1024, 4, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 2)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=str(server))
    program.wait_for("paused 2")
    nobody = f"ipc://{tmp_path}/nobody.sock"
    result = vgpu("migrate", program.pid, "--to", nobody, "--server", server)
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and nobody in result.stderr, result.stderr
    row = ps_row(server, program.pid)
    assert row is not None and "running" in row, row
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


def test_a_session_with_pinned_memory_is_refused_clearly_and_runs_on(
        tmp_path, servers, programs, rt_state_loop):
    """Pinned host memory lives in shared memory the server maps: it cannot move yet."""
    first, second = servers("first"), servers("second")
    pause = tmp_path / "pause"
    pause_at(pause, 2)
    program = programs([rt_state_loop, 2048, 4, "--pause-file", pause, "--pinned"],
                       VGPU_SERVER=str(first))
    program.wait_for("paused 2")
    for request in (["migrate", program.pid, "--to", second], ["suspend", program.pid],
                    ["checkpoint", program.pid, "-o", tmp_path / "pinned.vgpu"]):
        result = vgpu(*request, "--server", first)
        assert result.returncode == 1, result
        assert result.stderr.count("\n") == 1 and "pinned host memory" in result.stderr, \
            result.stderr
    assert "running" in ps_row(first, program.pid)
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, 2, 2048, 4)


# ----------------------------------------------------------------- suspend and resume

@pytest.mark.parametrize("where", ["elsewhere", "here"])
def test_a_suspended_session_frees_its_memory_and_resumes(
        tmp_path, servers, programs, state_loop, state_kernels_ptx, where):
    first = servers("first")
    second = servers("second") if where == "elsewhere" else first
    shape = (4, 4096, 10, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 4)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=str(first))
    program.wait_for("paused 4")
    assert "4.0 MiB" in ps_row(first, program.pid)
    succeeded(vgpu("suspend", program.pid, "--server", first))
    row = ps_row(first, program.pid)
    assert row is not None and "suspended" in row and " 0 B " in row, row
    pause_at(pause, 10)  # the program calls on: its calls wait for the session's return
    time.sleep(0.5)
    assert program.proc.poll() is None and "iteration 4" not in program.lines, \
        program.transcript()
    to = ["--to", second] if where == "elsewhere" else []
    succeeded(vgpu("resume", program.pid, *to, "--server", first))
    program.wait_for("paused 10")
    row = ps_row(second, program.pid)
    assert row is not None and "4.0 MiB" in row and "running" in row, row
    if where == "elsewhere":
        assert ps_row(first, program.pid) is None
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


# ----------------------------------------------------------------- checkpoints on demand

def test_an_incremental_checkpoint_writes_only_the_changed_allocation(
        tmp_path, servers, programs, state_loop, state_kernels_ptx):
    """Eight 2 MiB allocations; between two checkpoints to one image, one iteration changes
    allocation 5 alone (and the module's counter). The contents do not compress: an image
    holds about their size."""
    server = servers("server")
    shape = (8, 16 * 1024, 1, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 0)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause,
                                          "--only", 5), VGPU_SERVER=str(server))
    program.wait_for("paused 0")
    image = tmp_path / "images" / "loop.vgpu"
    image.parent.mkdir()
    first = succeeded(vgpu("checkpoint", program.pid, "-o", image, "--server", server)).stdout
    chunks, written, shared = checkpoint_figures(first)
    assert written >= 16 * MIB and shared == 0, first
    pause_at(pause, 1)
    program.wait_for("paused 1")
    second = succeeded(vgpu("checkpoint", program.pid, "-o", image, "--server", server)).stdout
    # Allocation 5 and the counter's chunk are new; every other chunk is the first image's.
    assert checkpoint_figures(second) == (chunks, pytest.approx(2 * MIB, rel=0.05),
                                          chunks - 2), second
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape, only=5)


def folder_contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def test_a_checkpoint_into_a_full_location_fails_and_keeps_the_previous_image(
        tmp_path, servers, programs, state_loop, state_kernels_ptx):
    """The server may write no file larger than 1 MiB (as a full disk, for root too): the
    next checkpoint fails in one line, and the previous image stays whole. (A read-only
    folder, which root writes into regardless, is tested in tests/replay.)"""
    server = servers("server")
    shape = (4, 4096, 4, 1)
    pause = tmp_path / "pause"
    pause_at(pause, 1)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, *shape, pause),
                       VGPU_SERVER=str(server))
    program.wait_for("paused 1")
    image = tmp_path / "images" / "loop.vgpu"
    image.parent.mkdir()
    succeeded(vgpu("checkpoint", program.pid, "-o", image, "--server", server))
    before = folder_contents(image.parent)
    pause_at(pause, 3)
    program.wait_for("paused 3")  # memory changed: the next image needs new chunks
    resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    result = vgpu("checkpoint", program.pid, "-o", image, "--server", server)
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert "File too large" in result.stderr and "the previous checkpoint is intact" in \
        result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert folder_contents(image.parent) == before  # the image and every chunk it needs
    pause.unlink()
    assert_finished_like_an_uninterrupted_run(program, *shape)


def truncate(image: Path) -> None:
    with image.open("r+b") as f:
        f.truncate(image.stat().st_size // 2)


def damage_a_chunk(image: Path) -> None:
    """Flip bytes in the largest chunk of allocation contents the image references."""
    chunk = max((p for p in (image.parent / ".vgpu-chunks").rglob("*") if p.is_file()),
                key=lambda p: p.stat().st_size)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2:len(data) // 2 + 16] = bytes(b ^ 0xFF for b in
                                                     data[len(data) // 2:len(data) // 2 + 16])
    chunk.write_bytes(bytes(data))


def from_a_future_vgpu(image: Path) -> None:
    """Format version 7 where the header says 1 (after the 8-byte magic)."""
    with image.open("r+b") as f:
        f.seek(8)
        f.write((7).to_bytes(4, "little"))


@pytest.mark.parametrize(("damage", "complaint"), [(truncate, "is truncated"),
                                                   (damage_a_chunk, "is corrupt"),
                                                   (from_a_future_vgpu, "format version 7")])
def test_a_standby_refuses_a_damaged_image_and_the_program_gets_one_clear_error(
        tmp_path, servers, programs, state_loop, state_kernels_ptx, damage, complaint):
    images = tmp_path / "checkpoints"
    images.mkdir()
    primary = servers("primary", "--checkpoint-dir", images, "--checkpoint-every", 0.5)
    standby = servers("standby", "--checkpoint-dir", images)
    pause = tmp_path / "pause"
    pause_at(pause, 2)
    program = programs(state_loop_command(state_loop, state_kernels_ptx, 4, 4096, 4, 1, pause),
                       VGPU_SERVER=f"{primary},{standby}")
    program.wait_for("paused 2")
    image = wait_for_image(images)
    primary.kill()
    damage(image)
    pause.unlink()
    assert program.finish() != 0, program.transcript()
    assert not any(line.startswith("checksum") for line in program.lines)
    # vgpu's one line says why; then the program reports the failed call, as on a lost GPU.
    said = [line for line in program.stderr.splitlines() if line.startswith("vgpu")]
    assert len(said) == 1 and complaint in said[0] and str(image) in said[0], \
        program.transcript()
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in program.stderr, program.transcript()
    assert "Traceback" not in program.stderr, program.transcript()
    log = standby.log.read_text()
    assert complaint in log and "Traceback" not in log, log
    assert ps_row(standby, program.pid) is None  # and the standby serves on
