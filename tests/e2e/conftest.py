"""Programs of the end-to-end tests, compiled once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import vgpu_run
from vgpu_processes import run_under_vgpu

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
# A program's calls cross two servers on the nested cuda backend: give it longer.
NESTED_TIMEOUT_S = 300


@pytest.fixture(params=["emu", "cuda"])
def run_on(request):
    """run(*command, env=None): the command under `vgpu run`, on a private emu server, or on
    the shared nested cuda server; its output captured. `run.backend` says which."""
    if request.param == "emu":
        def run(*command, env=None):
            return vgpu_run(*command, env=env)
    else:
        address = request.getfixturevalue("nested_cuda")

        def run(*command, env=None):
            return run_under_vgpu(address, *map(str, command), timeout=NESTED_TIMEOUT_S,
                                  **(env or {}))
    run.backend = request.param
    return run


def _ptx_file(toolkit, tmp_path_factory, source: Path, arch: str = "compute_75") -> Path:
    """`source` (CUDA C++) compiled to a PTX file, as programs read their kernels."""
    path = tmp_path_factory.mktemp("ptx") / f"{source.stem}.ptx"
    path.write_text(toolkit.ptx(source.read_text(), arch=arch))
    return path


@pytest.fixture(scope="session")
def kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, HERE / "kernels.cu")


@pytest.fixture(scope="session")
def graph_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, HERE / "graph_kernels.cu")


@pytest.fixture(scope="session")
def driver_app(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_app.c").read_text())


@pytest.fixture(scope="session")
def driver_graphs(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_graphs.c").read_text())


@pytest.fixture(scope="session")
def driver_errors(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_errors.c").read_text())


@pytest.fixture(scope="session")
def driver_api_tour(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_api_tour.c").read_text())


@pytest.fixture(scope="session")
def driver_zero_copy(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_zero_copy.c").read_text())


@pytest.fixture(scope="session")
def driver_memory_semantics(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_memory_semantics.c").read_text())


@pytest.fixture(scope="session")
def driver_textures(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_textures.c").read_text(), flags=["-lm"])


@pytest.fixture(scope="session")
def texture_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, HERE / "texture_kernels.cu")


@pytest.fixture(scope="session")
def driver_tensor_cores(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_tensor_cores.c").read_text())


@pytest.fixture(scope="session")
def tensor_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    # mma.sync.m16n8k32 needs compute_80, the emulated device's architecture.
    return _ptx_file(toolkit, tmp_path_factory, HERE / "tensor_kernels.cu", "compute_80")


@pytest.fixture(scope="session")
def driver_device_side(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_device_side.c").read_text())


@pytest.fixture(scope="session")
def device_side_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    """The kernels with device-side launches, compiled for linking (-rdc=true)."""
    path = tmp_path_factory.mktemp("ptx") / "device_side_kernels.ptx"
    path.write_text(toolkit.ptx((HERE / "device_side_kernels.cu").read_text(),
                                flags=["-rdc=true"]))
    return path


@pytest.fixture(scope="session")
def libcudadevrt(toolkit) -> Path:
    """CUDA's device runtime library, from the test extra's wheels (or the toolkit)."""
    return toolkit.cudart_library.parent / "libcudadevrt.a"


@pytest.fixture(scope="session")
def driver_streams(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_streams.c").read_text())


@pytest.fixture(scope="session")
def driver_ipc(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_ipc.c").read_text())


@pytest.fixture(scope="session")
def driver_pool_ipc(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_pool_ipc.c").read_text())


@pytest.fixture(scope="session")
def driver_vmm_ipc(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_vmm_ipc.c").read_text())


@pytest.fixture(scope="session")
def driver_ipc_ordered(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_ipc_ordered.c").read_text())


@pytest.fixture(scope="session")
def driver_hints(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_hints.c").read_text())


@pytest.fixture(scope="session")
def stream_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, HERE / "stream_kernels.cu")


@pytest.fixture(scope="session")
def driver_vmm(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_vmm.c").read_text())


@pytest.fixture(scope="session")
def driver_exit_hooks(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_exit_hooks.c").read_text())


@pytest.fixture(scope="session")
def state_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, PROGRAMS / "state_kernels.cu")


@pytest.fixture(scope="session")
def state_loop(toolkit) -> Path:
    return toolkit.c_program((PROGRAMS / "state_loop.c").read_text())


@pytest.fixture(scope="session")
def managed_loop(toolkit) -> Path:
    return toolkit.executable((PROGRAMS / "managed_loop.cu").read_text(), ["-cudart", "shared"])


@pytest.fixture(scope="session")
def driver_managed(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_managed.c").read_text())


@pytest.fixture(scope="session")
def driver_devices(toolkit) -> Path:
    return toolkit.c_program((HERE / "driver_devices.c").read_text())


@pytest.fixture(scope="session")
def managed_kernels_ptx(toolkit, tmp_path_factory) -> Path:
    return _ptx_file(toolkit, tmp_path_factory, HERE / "managed_kernels.cu")


@pytest.fixture(scope="session")
def rt_state_loop(toolkit) -> Path:
    return toolkit.executable((PROGRAMS / "rt_state_loop.cu").read_text(), ["-cudart", "shared"])
