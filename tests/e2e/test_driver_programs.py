"""Unmodified driver-API programs under `vgpu run`; those taking `run_on` run on the emu
backend and on the nested cuda backend (a cuda-backend server under vgpu, conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NESTED_TIMEOUT_S
from e2e_support import printed_checks, vgpu_run
from vgpu_processes import emu_server, run_under_vgpu, start_emu_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_c_driver_program_runs_with_correct_results(run_on, driver_app, kernels_ptx):
    result = run_on(driver_app, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_app: all results correct" in result.stdout


def test_the_rest_of_the_driver_api(run_on, driver_api_tour, kernels_ptx):
    result = run_on(driver_api_tour, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_api_tour: all checks passed" in result.stdout


def test_a_kernel_uses_mapped_host_memory(run_on, driver_zero_copy, kernels_ptx):
    result = run_on(driver_zero_copy, kernels_ptx)
    assert result.returncode == 0, result.stderr
    assert "driver_zero_copy: a kernel scaled mapped host memory in place" in result.stdout


def test_bad_input_gets_cuda_error_codes(run_on, driver_errors, kernels_ptx):
    result = run_on(driver_errors, kernels_ptx)
    checks = printed_checks(result)
    wrong = {name: got for name, got in checks.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout  # the program ran to its end
    assert len(checks) == 33 and result.returncode == 0


def test_memory_and_context_semantics(run_on, driver_memory_semantics):
    result = run_on(driver_memory_semantics)
    checks = printed_checks(result)
    wrong = {name: got for name, got in checks.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0 and len(checks) == 104
    assert "not implemented" not in result.stderr, result.stderr


def test_cuda_graphs_and_stream_capture(driver_graphs, kernels_ptx, graph_kernels_ptx):
    result = vgpu_run(driver_graphs, kernels_ptx, graph_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("structure queried", "built graph ran twice", "kernel node parameters updated",
                 "captured graph ran", "memory nodes ran", "conditional nodes ran",
                 "host-to-host copy node ran", "edge data kept", "graph launched by a kernel",
                 "a device graph found its own handle",
                 "user object destroyed after its graph's launch", "misuse refused",
                 "all checks passed"):
        assert f"driver_graphs: {line}" in result.stdout, result.stdout + result.stderr


def test_arrays_textures_and_surfaces(driver_textures, texture_kernels_ptx):
    result = vgpu_run(driver_textures, texture_kernels_ptx)
    assert result.returncode == 0, result.stderr
    for line in ("half-float linear sampling with a border correct", "pitched 2D texture "
                 "correct", "layered integer reads correct", "3D surface updated in place",
                 "all checks passed"):
        assert f"driver_textures: {line}" in result.stdout, result.stdout + result.stderr


def test_tensor_cores(driver_tensor_cores, tensor_kernels_ptx):
    result = vgpu_run(driver_tensor_cores, tensor_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("compute capability 8.0", "wmma f16 GEMM correct",
                 "mma.sync s8 product correct"):
        assert f"driver_tensor_cores: {line}" in result.stdout, result.stdout + result.stderr


def test_device_side_launches_heap_and_cooperative_grids(run_on, driver_device_side,
                                                         device_side_kernels_ptx, libcudadevrt):
    result = run_on(driver_device_side, device_side_kernels_ptx, libcudadevrt)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("children launched by 4 blocks computed 256 squares",
                 "malloc and free on a 64 KiB heap",
                 "recursive Collatz through function pointers correct",
                 "cooperative grids of 4 and 8 blocks met at grid.sync()", "all checks passed"):
        assert f"driver_device_side: {line}" in result.stdout, result.stdout + result.stderr


def test_managed_memory(driver_managed, managed_kernels_ptx):
    """On emu (the nested cuda backend runs the runtime API's managed memory program)."""
    result = vgpu_run(driver_managed, managed_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("host and kernel writes seen after each synchronization",
                 "a list linked by the host walked by the device",
                 "the module's __managed__ variable shared",
                 "copies and memsets agree with the host view",
                 "misuse refused with CUDA's errors"):
        assert f"driver_managed: {line}" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("backend", ["emu", "cuda"])
def test_several_devices(request, tmp_path, driver_devices, managed_kernels_ptx, backend):
    """On emu (`--devices 2`) and on the nested cuda backend driving the two GPUs its
    driver offers (contexts, memory, modules and launches on each)."""
    if backend == "cuda":
        address = request.getfixturevalue("nested_cuda_two_devices")
        result = run_under_vgpu(address, driver_devices, str(managed_kernels_ptx),
                                timeout=NESTED_TIMEOUT_S)
    else:
        with emu_server(tmp_path, "--devices", "2") as address:
            result = run_under_vgpu(address, driver_devices, str(managed_kernels_ptx),
                                    timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("2 devices with a context each",
                 "a kernel updated the peer's memory, peer copies correct",
                 "misuse refused with CUDA's errors"):
        assert f"driver_devices: {line}" in result.stdout, result.stdout + result.stderr


def test_streams_run_concurrently(run_on, driver_streams, stream_kernels_ptx):
    """Streams run beside each other (on emu each has a thread of its own on the server, on
    cuda a device stream): a kernel waiting for one launched after it on another stream
    finishes (it would hang with streams run in arrival order), and host functions run on
    vgpu's thread in stream order. First, on the NULL stream alone, each query of running
    work says not ready."""
    result = run_on(driver_streams, stream_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver_streams: all checks passed" in result.stdout


def test_ipc_between_processes(run_on, driver_ipc, stream_kernels_ptx):
    """Two processes of one server share device memory and an event: the parent's kernel
    waits on the device for the child's flag, and the child's stream for the parent's
    event (on cuda, the exporter's CUDA event waited for by the importer's stream)."""
    result = run_on(driver_ipc, stream_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver_ipc: all checks passed" in result.stdout


def test_exportable_pools_between_processes(run_on, driver_pool_ipc, stream_kernels_ptx):
    """Two processes of one server share two exportable stream-ordered pools: the child
    imports both and a pointer of each, adds one into the other in place, and misuse (the
    wrong handle type, a pool not exportable, a pointer of no exportable pool or of another
    pool) gets CUDA's errors."""
    result = run_on(driver_pool_ipc, stream_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver_pool_ipc: the child added pool B's 2500 ints into pool A's" in result.stdout


def test_virtual_memory_shared_through_a_file_descriptor(run_on, driver_vmm_ipc,
                                                         stream_kernels_ptx):
    """Two processes share physical memory of the virtual memory API, as memMapIPCDrv does:
    the parent exports it as a file descriptor and sends it over a socket, the child imports
    and maps it, both read and write it, and the child's hold keeps it after the parent
    released it; misuse of either call gets CUDA's errors."""
    result = run_on(driver_vmm_ipc, stream_kernels_ptx)
    found = printed_checks(result)
    wrong = {name: got for name, got in found.items() if got[0] != got[1]}
    assert not wrong, f"(got, expected) per check: {wrong}\n{result.stderr}"
    assert "failures 0" in result.stdout, result.stdout + result.stderr
    assert len(found) == 48 and result.returncode == 0, result.stdout + result.stderr


def test_ipc_in_order_between_processes_on_cuda(nested_cuda, driver_ipc_ordered,
                                                stream_kernels_ptx):
    """Two processes of the nested cuda server share device memory (not at the start of a
    device page) and an event, each waiting only for what the other has done already."""
    result = run_under_vgpu(nested_cuda, driver_ipc_ordered, str(stream_kernels_ptx),
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver_ipc_ordered: the child doubled the parent's memory after its event" in \
        result.stdout


def test_occupancy_and_hints(driver_hints, stream_kernels_ptx):
    """The occupancy calculator's answer is the best block size; stream attributes and the
    persisting-L2 limit are accepted as hints, with CUDA's checks."""
    result = vgpu_run(driver_hints, stream_kernels_ptx)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "driver_hints: all checks passed" in result.stdout


def test_cuda_python_program_runs_unmodified(run_on):
    result = run_on(sys.executable, EXAMPLES / "vector_add.py")
    assert result.returncode == 0, result.stderr
    assert "vector_add of 1048576 floats" in result.stdout and "correct" in result.stdout


NVRTC_PROGRAM = """
from cuda.bindings import driver, nvrtc

source = b'extern "C" __global__ void one(int *x) { x[0] = 1; }'
err, program = nvrtc.nvrtcCreateProgram(source, b"one.cu", 0, [], [])
assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
err, = nvrtc.nvrtcCompileProgram(program, 1, [b"-arch=compute_75"])
assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
err, size = nvrtc.nvrtcGetPTXSize(program)
ptx = b" " * size
err, = nvrtc.nvrtcGetPTX(program, ptx)
assert driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
err, device = driver.cuDeviceGet(0)
err, context = driver.cuDevicePrimaryCtxRetain(device)
driver.cuCtxSetCurrent(context)
err, module = driver.cuModuleLoadData(ptx)
assert err == driver.CUresult.CUDA_SUCCESS, err
print("nvrtc program compiled and loaded")
"""


def test_nvrtc_users_are_not_told_they_carry_a_static_runtime():
    """NVRTC asks the driver for NVIDIA's private tables itself; its users carry no runtime."""
    result = vgpu_run(sys.executable, "-c", NVRTC_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert "nvrtc program compiled and loaded" in result.stdout
    assert "vgpu:" not in result.stderr, result.stderr


EXIT_HOOK_PROGRAM = """
import atexit
from cuda.bindings import driver as cu

allocation = []


def at_exit():
    freed, = cu.cuMemFree(allocation[0])
    synchronized, = cu.cuCtxSynchronize()
    print("hook", int(freed), int(synchronized), flush=True)


atexit.register(at_exit)  # before CUDA starts, as a library imported first would
cu.cuInit(0)
err, device = cu.cuDeviceGet(0)
err, context = cu.cuDevicePrimaryCtxRetain(device)
cu.cuCtxSetCurrent(context)
err, pointer = cu.cuMemAlloc(1 << 20)
assert err == cu.CUresult.CUDA_SUCCESS, err
allocation.append(pointer)
print("allocated", flush=True)
"""


@pytest.fixture
def logging_server(tmp_path):
    """A server of its own whose log says how each session ended."""
    address = f"ipc://{tmp_path}/server.sock"
    proc = start_emu_server(address, "-v", stderr=subprocess.PIPE)

    def run_and_stop(program, *args) -> tuple[subprocess.CompletedProcess, str]:
        result = run_under_vgpu(address, program, *map(str, args), timeout=120)
        time.sleep(1.5)  # a session the goodbye missed is closed by now, its pid gone
        proc.terminate()
        _, log = proc.communicate(timeout=10)
        return result, log

    yield run_and_stop
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("language", ["python", "c"])
def test_cuda_works_in_exit_hooks_and_the_server_hears_goodbye(language, logging_server,
                                                               driver_exit_hooks):
    command = [sys.executable, "-c", EXIT_HOOK_PROGRAM] if language == "python" \
        else [driver_exit_hooks]
    result, log = logging_server(*command)
    assert result.returncode == 0, result.stderr
    expected = ["allocated", "hook 0 0"] if language == "python" else \
        ["allocated", "child exited 0", "after the child 0", "hook 0 0"]
    assert result.stdout.splitlines() == expected, result.stderr
    assert log.count("closing (client said goodbye)") == 1, log


# An object the program's finalization destroys (as CuPy's modules and memory are) calls
# CUDA once Python is going away, when vgpu cannot run Python any more: a release succeeds
# (the session's end frees everything, as NVIDIA's driver would have freed it), anything
# else gets CUDA_ERROR_DEINITIALIZED (4), the driver shutting down.
FINALIZATION_PROGRAM = """
import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1")
pointer, context = ctypes.c_uint64(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), 1 << 20) == 0
print("allocated", flush=True)


class Allocation:
    def __del__(self, free=cuda.cuMemFree_v2, alloc=cuda.cuMemAlloc_v2, write=os.write,
                byref=ctypes.byref, other=ctypes.c_uint64()):
        freed, allocated = free(pointer), alloc(byref(other), 1 << 20)
        write(1, f"at finalization {freed} {allocated}\\n".encode())


kept = Allocation()  # destroyed as the interpreter finalizes its modules
"""


def test_objects_destroyed_as_python_finalizes_release_cleanly(logging_server):
    result, log = logging_server(sys.executable, "-c", FINALIZATION_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["allocated", "at finalization 0 4"], \
        result.stdout + result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    assert log.count("closing (client said goodbye)") == 1, log


def test_exit_code_passes_through(tmp_path):
    assert vgpu_run(sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_trace_prints_decoded_calls(driver_app, kernels_ptx):
    result = vgpu_run(driver_app, kernels_ptx, env={"VGPU_TRACE": "1"})
    assert result.returncode == 0, result.stderr
    assert "cuMemAlloc_v2(" in result.stderr
    assert "cuLaunchKernel(" in result.stderr


def test_numba_cuda_program_runs_unmodified(run_on):
    result = run_on(sys.executable, EXAMPLES / "numba_axpy.py")
    assert result.returncode == 0, result.stderr
    assert "numba axpy ok on vgpu emulated GPU" in result.stdout
