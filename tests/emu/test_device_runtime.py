"""The emulator's device runtime at the edges: the heap running out and misused frees, calls
through a register (with register arguments and a .calltargets list; through an address that
is no function), device-side launches nested past CUDA's depth, and a grid barrier outside
a cooperative launch and in a device graph's kernel nodes. (What works end to end is in the
runtime and driver programs: tests/runtime/programs/device_side.cu,
tests/e2e/driver_device_side.c.)"""

from __future__ import annotations

import numpy as np
import pytest

from vgpu.server.emu import LaunchError, prepare
from vgpu.server.emu.device_runtime import DeviceRuntime, GraphEnvironment, GraphLaunch
from vgpu.server.emu.executor import run_graphs

HEAP_PTX = """
.version 7.5
.target sm_75
.address_size 64
.extern .func (.param .b64 ret) malloc (.param .b64 size);
.extern .func free (.param .b64 ptr);

.visible .entry grab(.param .u64 out, .param .u64 size)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<6>;
    mov.u32 %r1, %tid.x;
    ld.param.u64 %rd5, [size];
    {
        .param .b64 bytes;
        .param .b64 block;
        st.param.b64 [bytes], %rd5;
        call.uni (block), malloc, (bytes);
        ld.param.b64 %rd1, [block];
    }
    ld.param.u64 %rd2, [out];
    mul.wide.u32 %rd3, %r1, 8;
    add.u64 %rd4, %rd2, %rd3;
    st.global.u64 [%rd4], %rd1;
    ret;
}

.visible .entry release(.param .u64 pointer)
{
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [pointer];
    {
        .param .b64 p;
        st.param.b64 [p], %rd1;
        call.uni free, (p);
    }
    ret;
}

.visible .entry call_through(.param .u64 target)
{
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [target];
    {
        .param .b32 result;
        prototype_0 : .callprototype (.param .b32 _) _ ();
        call (result), %rd1, (), prototype_0;
    }
    ret;
}
"""

CALLTARGETS_PTX = """
.version 7.5
.target sm_75
.address_size 64
.func (.param .b32 r) twice(.param .b32 x)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [x];
    add.s32 %r2, %r1, %r1;
    st.param.b32 [r], %r2;
    ret;
}
.visible .entry k(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;
    mov.u64 %rd1, twice;
    mov.u32 %r1, %tid.x;
    Ftable: .calltargets twice;
    call (%r2), %rd1, (%r1), Ftable;
    ld.param.u64 %rd2, [out];
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd2, %rd2, %rd3;
    st.global.u32 [%rd2], %r2;
    ret;
}
"""

NESTING = r"""
#include <cooperative_groups.h>
__global__ void nest(int *depth_reached, int *launch_error, int depth)
{
    *depth_reached = depth;
    nest<<<1, 1>>>(depth_reached, launch_error, depth + 1);
    cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) *launch_error = error;
}

__global__ void syncs(int *out)
{
    cooperative_groups::this_grid().sync();
    out[0] = 1;
}
"""


def _runtime(device, heap_bytes: int = 4096) -> DeviceRuntime:
    places = {"heap": (device.alloc(heap_bytes), heap_bytes),
              "launch_buffers": (device.alloc(64 * 4096), 64 * 4096)}
    return DeviceRuntime(device.memory, places.__getitem__)


def _run(device, module, kernel, grid, block, *args, runtime=None):
    prepared = prepare(module, kernel, grid, block, 0, device.symbols.get(id(module), {}))
    return prepared.run(device.pack(module, kernel, args), device.memory) if runtime is None \
        else prepared.execute(device.pack(module, kernel, args), device.memory,
                              runtime=runtime)


def test_malloc_returns_null_once_the_heap_is_full_and_reuses_freed_blocks(device):
    module = device.load(HEAP_PTX)
    runtime = _runtime(device, heap_bytes=4096)
    out = device.zeros(16, np.uint64)
    _run(device, module, "grab", 1, 16, out, 496, runtime=runtime)  # 512 with its header
    pointers = device.download(out, 16, np.uint64)
    granted = pointers[pointers != 0]
    assert len(granted) == 7 and list(pointers[:7]) == list(granted)  # lane order
    assert all(p % 16 == 0 for p in granted) and len(set(granted)) == 7
    _run(device, module, "release", 1, 1, int(granted[2]), runtime=runtime)
    _run(device, module, "grab", 1, 2, out, 100, runtime=runtime)
    assert device.download(out, 1, np.uint64)[0] == granted[2]  # the freed block first


def test_freeing_what_malloc_did_not_return_or_twice_faults(device):
    module = device.load(HEAP_PTX)
    runtime = _runtime(device)
    out = device.zeros(1, np.uint64)
    _run(device, module, "grab", 1, 1, out, 64, runtime=runtime)
    block = int(device.download(out, 1, np.uint64)[0])
    with pytest.raises(LaunchError) as info:
        _run(device, module, "release", 1, 1, block + 16, runtime=runtime)
    assert info.value.code == 700 and "not a pointer that device malloc returned" in str(info.value)
    _run(device, module, "release", 1, 1, block, runtime=runtime)
    with pytest.raises(LaunchError) as info:
        _run(device, module, "release", 1, 1, block, runtime=runtime)
    assert info.value.code == 700 and "already freed" in str(info.value)


def test_a_call_through_a_register_with_register_arguments_and_a_target_list(device):
    module = device.load(CALLTARGETS_PTX)
    out = device.zeros(8, np.int32)
    device.launch(module, "k", 1, 8, out)
    assert list(device.download(out, 8, np.int32)) == [2 * t for t in range(8)]


def test_a_call_through_an_address_that_is_no_function_faults(device):
    module = device.load(HEAP_PTX)
    with pytest.raises(LaunchError) as info:
        _run(device, module, "call_through", 1, 1, 0x1234)
    assert info.value.code == 718  # CUDA_ERROR_INVALID_PC
    assert "not a device function" in str(info.value)


@pytest.fixture(scope="module")
def nesting_module(toolkit):
    from vgpu.server.emu import PtxModule

    return PtxModule.parse(toolkit.ptx(NESTING, flags=["-rdc=true"]))


def test_device_side_launches_stop_at_cudas_nesting_depth(device, nesting_module):
    device.map_variables(nesting_module)
    depth, error = device.zeros(1, np.int32), device.zeros(1, np.int32)
    kernel = next(k for k in nesting_module.kernels if "nest" in k)
    _run(device, nesting_module, kernel, 1, 1, depth, error, 0, runtime=_runtime(device))
    assert device.download(depth, 1, np.int32)[0] == 23  # 24 generations of grids
    assert device.download(error, 1, np.int32)[0] == 65  # cudaErrorLaunchMaxDepthExceeded


def test_grid_sync_outside_a_cooperative_launch_traps(device, nesting_module):
    device.map_variables(nesting_module)
    out = device.zeros(1, np.int32)
    kernel = next(k for k in nesting_module.kernels if "syncs" in k)
    with pytest.raises(LaunchError) as info:
        _run(device, nesting_module, kernel, 2, 32, out)
    assert info.value.code == 719
    prepared = prepare(nesting_module, kernel, 2, 32, 0, device.symbols[id(nesting_module)],
                       cooperative=True)
    workspace = device.alloc(16)
    prepared.execute(device.pack(nesting_module, kernel, [out]), device.memory,
                     runtime=DeviceRuntime(device.memory, {}.__getitem__, workspace))
    assert device.download(out, 1, np.int32)[0] == 1


def test_a_cooperative_kernel_node_of_a_graph_a_kernel_launched_has_a_grid_barrier(
        device, nesting_module):
    """A graph launched from the device runs its cooperative kernel nodes with the
    session's grid barrier (its other kernels have none: grid.sync() traps there)."""
    device.map_variables(nesting_module)
    out = device.zeros(1, np.int32)
    kernel = next(k for k in nesting_module.kernels if "syncs" in k)
    runtime = DeviceRuntime(device.memory, {"grid_workspace": (device.alloc(16), 16)}.__getitem__)
    params = device.pack(nesting_module, kernel, [out])

    def run_node(cooperative: bool) -> None:
        node = prepare(nesting_module, kernel, 2, 32, 0, device.symbols[id(nesting_module)],
                       cooperative=cooperative)
        run_graphs([GraphLaunch(GraphEnvironment(), [(node, params)], runtime)],
                   device.memory, None, 1 << 20, None, 1)

    with pytest.raises(LaunchError) as info:
        run_node(cooperative=False)
    assert info.value.code == 719 and device.download(out, 1, np.int32)[0] == 0
    run_node(cooperative=True)
    assert device.download(out, 1, np.int32)[0] == 1
