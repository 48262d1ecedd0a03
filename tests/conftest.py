"""Shared fixtures: the CUDA toolkit (compiled programs are cached for the whole run), and a
runtime folder of the tests' own. The `slow` marker, which the quick subset
(`pytest -m "not slow"`) leaves out."""

from __future__ import annotations

from pathlib import Path

import pytest
from toolkit import Toolkit, find_toolkit
from vgpu_processes import nested_cuda_server

TESTS = Path(__file__).resolve().parent
# What takes minutes on two cores: the property tests of the emulator's instructions (many
# generated inputs each), every runtime program built twice and run under `vgpu run`, the
# CUDA programs modelled on real code (thrust, cooperative groups and half precision take
# long to compile), NVRTC, CuPy (its tour and a slice of its own tests), the check of the
# committed error texts against NVIDIA's, and tests that wait out timeouts or fill queues
# on purpose. Whole modules, or single tests.
SLOW = {
    "emu/test_properties.py",
    "emu/test_cuda_programs.py",
    "runtime/test_runtime_programs.py",
    "e2e/test_cupy.py",
    "emu/test_conformance.py::test_cub_block_primitives",
    "emu/test_nvrtc.py::test_nvrtc_ptx_runs",
    "runtime/test_error_table.py::test_committed_texts_are_nvidias",
    "e2e/test_cli.py::test_unreachable_server_is_device_unavailable_not_a_hang",
    "e2e/test_cli.py::test_ps_fails_when_a_named_server_does_not_answer",
    "server/test_sessions.py::test_no_server_gives_device_unavailable_quickly",
    "server/test_sessions.py::test_a_kernel_longer_than_the_client_timeout_is_waited_for",
    "server/test_sessions.py::test_a_program_that_queues_faster_than_the_device_runs_waits_for_it",
    "server/test_sessions.py::test_a_client_that_floods_the_queue_without_waiting_is_cut_off",
    "e2e/test_state_moves.py::test_a_standby_takes_over_from_a_killed_server_at_its_last_checkpoint",
    "e2e/test_dropped_connections.py::"
    "test_the_sessions_of_remote_clients_that_vanish_are_freed_within_seconds",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = {}
    for item in items:
        module = item.path.relative_to(TESTS).as_posix()
        modules[module] = getattr(item, "module", None)
        if module in SLOW or f"{module}::{item.originalname}" in SLOW:
            item.add_marker(pytest.mark.slow)
    # A renamed slow test would silently join the quick subset: name it instead.
    missing = []
    for name in SLOW:
        module, _, test = name.partition("::")
        if test and modules.get(module) is not None and not hasattr(modules[module], test):
            missing.append(name)
    if missing:
        raise pytest.UsageError("tests/conftest.py marks as slow tests that do not exist: "
                                + ", ".join(sorted(missing)))


@pytest.fixture(scope="session")
def toolkit(tmp_path_factory: pytest.TempPathFactory) -> Toolkit:
    return find_toolkit(tmp_path_factory.mktemp("cuda-build"))


@pytest.fixture(scope="session", autouse=True)
def runtime_folder(tmp_path_factory: pytest.TempPathFactory):
    """Servers the tests start announce themselves and keep their sockets here, not in the
    user's runtime folder: a plain `vgpu run` in a test never reaches a default server the
    user has running, and `vgpu ps` sees the tests' servers only."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def nested_cuda(tmp_path_factory: pytest.TempPathFactory):
    """The address of a cuda-backend server run under vgpu against an emu server (the
    nested pair, vgpu_processes.py), shared by the tests that run programs on `cuda`."""
    with nested_cuda_server(tmp_path_factory.mktemp("nested-cuda")) as address:
        yield address


@pytest.fixture(scope="session")
def nested_cuda_two_devices(tmp_path_factory: pytest.TempPathFactory):
    """The nested pair with two devices: the emu server offers two, and the cuda-backend
    server drives both as the GPUs its driver offers."""
    with nested_cuda_server(tmp_path_factory.mktemp("nested-cuda-2"), devices=2) as address:
        yield address
