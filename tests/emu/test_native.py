"""The native compiler (server/emu/native) against the interpreter, bit for bit.

A DifferentialDevice runs every launch twice from the same memory, on the interpreter and
compiled, and requires the same outcome: the same bytes in every allocation, or the same
error (code, message, output). The instruction, conformance, printf/assert and program
tests (CUB, cooperative groups, a spin lock between lanes) run on it with their own inputs
and assertions; each must have run at least one kernel compiled, so the comparison is never
between two interpreter runs. native_control.ptx adds what those do not reach (calls
through registers, jump tables, traps, bar.red, __syncwarp, warp reductions and matches),
each checked against host values too. The rest: fallback with one log line, the disk
cache, faults, cancelling, blocks on several threads, `vgpu server --threads`.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
import time

import numpy as np
import pytest
import test_conformance as conformance
import test_device_runtime as device_runtime
import test_instructions as instructions
import test_printf_assert as printf_assert
import test_properties as properties
import test_textures as textures
from conftest import Device
from hypothesis import settings

from vgpu.server.emu import LaunchError, native, prepare
from vgpu.server.emu.executor import LaunchCancelled
from vgpu.server.emu.memcheck import MemoryChecker
from vgpu.texture_objects import (
    ADDRESS_BORDER,
    ADDRESS_CLAMP,
    ADDRESS_MIRROR,
    ADDRESS_WRAP,
    SURFACE_MAGIC,
    TEXTURE_MAGIC,
    ChannelKind,
)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    """A cache of the run's own; blocks on one thread (bit for bit with float atomics) unless
    a test says otherwise; the compiler's settings as they were after each test (the other
    emulator tests run with the defaults)."""
    monkeypatch.setenv("VGPU_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native"))
    settings = native.enabled(), native.threads()
    native.configure(threads=1)
    yield
    native.configure(*settings)


class DifferentialDevice(Device):
    def __init__(self) -> None:
        super().__init__()
        self.compiled: list[str] = []   # kernels that ran compiled

    def launch(self, module, kernel, grid, block, *args, shared: int = 0):
        params = self.pack(module, kernel, args)
        symbols = self.symbols.get(id(module), {})
        before = self._snapshot()
        expected, raised = self._outcome(False, module, kernel, grid, block, shared, params,
                                         symbols)
        interpreted = self._snapshot()
        self._restore(before)
        got, _ = self._outcome(True, module, kernel, grid, block, shared, params, symbols)
        assert got == expected, f"{kernel}: compiled and interpreted outcomes differ"
        if isinstance(raised, LaunchError):
            raise raised   # what ran before the fault differs: threads run in another order
        compiled = self._snapshot()
        for (address, want), (_, have) in zip(interpreted, compiled, strict=True):
            if want != have:
                first = next(k for k in range(len(want)) if want[k] != have[k])
                raise AssertionError(f"{kernel}: memory at 0x{address:x} differs from byte "
                                     f"{first}")
        return raised

    def _outcome(self, compiled: bool, module, kernel, grid, block, shared, params, symbols):
        was = native.enabled()
        native.configure(enabled=compiled)
        try:
            prepared = prepare(module, kernel, grid, block, shared, symbols)
            if compiled and prepared.native is not None:
                self.compiled.append(kernel)
            result = prepared.run(params, self.memory)
            return ("done", result.printf, result.report), result
        except LaunchError as exc:
            return ("failed", exc.code, exc.message, exc.output, exc.diagnostics), exc
        finally:
            native.configure(enabled=was)

    def _snapshot(self) -> list[tuple[int, bytes]]:
        return [(base, self.memory.read(base, size)) for base, size in self.memory.allocations()]

    def _restore(self, snapshot) -> None:
        for base, data in snapshot:
            self.memory.write(base, data)


@pytest.fixture
def differential() -> DifferentialDevice:
    return DifferentialDevice()


# The instruction tests whose kernels the compiler translates whole (the others use
# instructions it leaves to the interpreter, such as isspacep; and test_special_registers
# reads %globaltimer, which differs between two runs).
INSTRUCTION_TESTS = [
    "test_integer_arithmetic", "test_packed_16bit_pairs",
    "test_carry_chains_and_64bit_high_multiply", "test_bit_manipulation",
    "test_float_arithmetic_and_rounding", "test_float_approximate_functions",
    "test_double_fma_and_directed_rounding", "test_comparisons", "test_integer_comparisons",
    "test_float_to_int_conversions", "test_int_to_float_conversions",
    "test_half_conversions", "test_bit_masks_and_extensions", "test_warp_operations",
    "test_votes_count_only_lanes_executing_together", "test_calls_jump_tables_exit_and_loops",
]


@pytest.mark.parametrize("name", INSTRUCTION_TESTS)
def test_instruction_tests_agree(differential, name):
    getattr(instructions, name)(differential)
    assert differential.compiled, "no kernel of the test ran compiled"


def _parametrizations(test) -> list[dict]:
    """Every combination of a test's @pytest.mark.parametrize arguments."""
    axes = []
    for mark in getattr(test, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(
            mark.args[0], str) else list(mark.args[0])
        axes.append([dict(zip(names, v if len(names) > 1 else (v,), strict=True))
                     for v in mark.args[1]])
    return [dict(itertools.chain.from_iterable(d.items() for d in combo))
            for combo in itertools.product(*axes)]


PROPERTY_TESTS = [name for name, fn in inspect.getmembers(properties, inspect.isfunction)
                  if name.startswith("test_")]


@pytest.mark.parametrize("name", PROPERTY_TESTS)
def test_property_tests_agree(monkeypatch, name):
    """Every property, in every parametrization, on both (a few examples each: the
    interpreter runs them in full in test_properties.py)."""
    test = getattr(properties, name)
    device = DifferentialDevice()
    if hasattr(test, "hypothesis"):
        # the test's own settings, with fewer examples (hypothesis reads them at call time)
        current = test._hypothesis_internal_use_settings
        monkeypatch.setattr(test, "_hypothesis_internal_use_settings",
                            settings(current, max_examples=3, derandomize=True))
    for arguments in _parametrizations(test):
        test(module_device=device, **arguments)
    assert device.compiled, "no kernel of the test ran compiled"


CONFORMANCE_TESTS = [
    ("test_vector_add", ()), ("test_saxpy_grid_stride", ()),
    ("test_tiled_matmul", (37, 21, 50)), ("test_block_reduction", ()),
    ("test_data_dependent_loops_and_early_return", ()), ("test_nested_branches", ()),
    ("test_3d_indices", ()), ("test_constant_and_global_variables", ()),
    ("test_local_array_dynamic_index", ()), ("test_struct_by_value", ()),
    ("test_exited_threads_do_not_block_barriers", ()), ("test_many_blocks_run_in_chunks", ()),
    ("test_warp_reduction", ()), ("test_shuffles", ()), ("test_votes_and_ballot", ()),
    ("test_block_wide_votes", ()), ("test_histogram_shared_and_global_atomics", ()),
    ("test_prefix_scan", ()),
    ("test_templated_kernels", ("scale_shift<float>", np.float32, 1.5, -0.25)),
    ("test_templated_kernels", ("scale_shift<long long>", np.int64, 1 << 35, 11)),
]


@pytest.mark.parametrize("name,arguments", CONFORMANCE_TESTS)
def test_conformance_kernels_agree(differential, toolkit, name, arguments):
    mod = differential.load(toolkit.ptx(conformance.SOURCE))
    getattr(conformance, name)(differential, mod, *arguments)
    assert differential.compiled, "no kernel of the test ran compiled"


def test_special_registers_compiled():
    """Lane masks, shared sizes, fixed registers and the clocks (real time: they cannot agree
    bit for bit with another run), compiled, against the instruction test's host values."""
    native.configure(enabled=True)
    device = Device()
    instructions.test_special_registers(device)
    module = device.load((instructions.PTX / "special.ptx").read_text())
    assert prepare(module, "special", (2,), (4, 3), 96).native is not None


# The head of the inline kernels' PTX
PTX_HEADER = ".version 7.8\n.target sm_80\n.address_size 64\n"

CURRENT_GRAPH_PTX = PTX_HEADER + """.visible .entry current_graph(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r1, %r2, %r3, %r1;
    mul.wide.u32 %rd2, %r1, 8;
    add.s64 %rd3, %rd1, %rd2;
    mov.u64 %rd4, %current_graph_exec;
    st.global.u64 [%rd3], %rd4;
    ret;
}
"""


@pytest.mark.parametrize("graph", [None, 0x5EED_0042])
def test_current_graph_exec_compiled(graph):
    """%current_graph_exec (cudaGetCurrentGraphExec) compiled: the device graph whose run
    the kernel is a node of, for every thread, else 0; frames reused by the next launch
    keep no graph of the last."""
    from vgpu.server.emu.device_runtime import GraphEnvironment
    native.configure(enabled=True)
    device = Device()
    module = device.load(CURRENT_GRAPH_PTX)
    out = device.zeros(64, np.uint64)
    prepared = prepare(module, "current_graph", (2,), (32,))
    assert prepared.native is not None
    for environment in (GraphEnvironment(0x7777), None if graph is None
                        else GraphEnvironment(graph)):
        prepared.execute(device.pack(module, "current_graph", [out]), device.memory,
                         environment=environment)
    np.testing.assert_array_equal(device.download(out, 64, np.uint64), graph or 0)


GRID_AND_VALUE_PTX = PTX_HEADER + """
.visible .entry grid_and_value(.param .u64 out, .param .u32 value)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r5, [value];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r1, %r2, %r3, %r1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r4, %nctaid.x;
    mad.lo.u32 %r4, %r4, 1000, %r5;
    st.global.u32 [%rd3], %r4;
    ret;
}
"""


def test_launches_of_one_block_shape_each_see_their_own_grid_and_parameters():
    """Launches of one kernel and block shape share what a launch keeps between launches
    (its record, its copy of the parameters): each sees its own grid and parameters,
    whichever ran before it."""
    native.configure(enabled=True)
    device = Device()
    module = device.load(GRID_AND_VALUE_PTX)
    out = device.zeros(96, np.uint32)
    narrow, wide = (prepare(module, "grid_and_value", (grid,), (32,)) for grid in (2, 3))
    assert narrow.native is not None
    for prepared, value in ((narrow, 1), (wide, 2), (narrow, 3), (narrow, 4), (wide, 5)):
        prepared.execute(device.pack(module, "grid_and_value", [out, np.uint32(value)]),
                         device.memory)
        threads = 32 * prepared.grid[0]
        got = device.download(out, 96, np.uint32)
        np.testing.assert_array_equal(got[:threads], prepared.grid[0] * 1000 + value)


# The texture tests whose kernels fetch with `tex` or access surfaces (the others use tld4,
# txq or suq, which leave their kernels to the interpreter).
TEXTURE_TESTS = [
    ("test_2d_point_and_linear_sampling_of_float4_texels", {}),
    *[("test_normalized_coordinates_address_modes_and_normalized_unsigned_bytes",
       {"mode": mode}) for mode in range(4)],
    ("test_integer_fetch_of_a_one_channel_texture_fills_the_missing_channels", {}),
    ("test_3d_element_reads_and_layered_2d", {}),
    ("test_a_handle_that_is_no_texture_object_faults", {}),
    ("test_surface_reads_and_writes", {}),
]


@pytest.mark.parametrize("name, arguments", TEXTURE_TESTS)
def test_texture_fetches_agree(differential, toolkit, name, arguments):
    getattr(textures, name)(differential, toolkit.ptx(textures.SOURCE), **arguments)
    assert differential.compiled, "no kernel of the test ran compiled"


FETCHES = r"""
extern "C" __global__ void fetch123(cudaTextureObject_t t1, cudaTextureObject_t t2,
                                    cudaTextureObject_t t3, const float *c, float4 *out,
                                    int n) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) {
        out[3 * i] = tex1D<float4>(t1, c[3 * i]);
        out[3 * i + 1] = tex2D<float4>(t2, c[3 * i], c[3 * i + 1]);
        out[3 * i + 2] = tex3D<float4>(t3, c[3 * i], c[3 * i + 1], c[3 * i + 2]);
    }
}
extern "C" __global__ void fetch123_int(cudaTextureObject_t t1, cudaTextureObject_t t2,
                                        cudaTextureObject_t t3, const float *c, int4 *out,
                                        int n) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) {
        out[3 * i] = tex1D<int4>(t1, c[3 * i]);
        uint4 u = tex2D<uint4>(t2, c[3 * i], c[3 * i + 1]);
        out[3 * i + 1] = make_int4(u.x, u.y, u.z, u.w);
        out[3 * i + 2] = tex3D<int4>(t3, c[3 * i], c[3 * i + 1], c[3 * i + 2]);
    }
}
extern "C" __global__ void fetch_elements_and_layers(cudaTextureObject_t t1,
                                                     cudaTextureObject_t layered,
                                                     const float *c, float4 *out, int n) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) {
        out[3 * i] = tex1Dfetch<float4>(t1, (int)c[3 * i]);
        out[3 * i + 1] = tex2DLayered<float4>(layered, c[3 * i], c[3 * i + 1],
                                              (int)c[3 * i + 2]);
        int4 v = tex1DLayered<int4>(layered, c[3 * i], (int)c[3 * i + 2]);
        out[3 * i + 2] = make_float4(__int_as_float(v.x), __int_as_float(v.y),
                                     __int_as_float(v.z), __int_as_float(v.w));
    }
}
"""


# (texel type, channel kind, read as integer, channels): every format the interpreter reads
TEXEL_FORMATS = [
    (np.float32, ChannelKind.FLOAT, False, 1), (np.float32, ChannelKind.FLOAT, False, 2),
    (np.float32, ChannelKind.FLOAT, False, 4), (np.float16, ChannelKind.FLOAT, False, 2),
    (np.uint8, ChannelKind.UNSIGNED, False, 4), (np.int8, ChannelKind.SIGNED, False, 1),
    (np.uint16, ChannelKind.UNSIGNED, False, 2), (np.int16, ChannelKind.SIGNED, False, 4),
    (np.uint32, ChannelKind.UNSIGNED, False, 1), (np.int32, ChannelKind.SIGNED, False, 2),
    (np.uint8, ChannelKind.UNSIGNED, True, 4), (np.int16, ChannelKind.SIGNED, True, 1),
]


@pytest.mark.parametrize("texel, kind, as_integer, channels", TEXEL_FORMATS)
@pytest.mark.parametrize("mode", [ADDRESS_WRAP, ADDRESS_CLAMP, ADDRESS_MIRROR, ADDRESS_BORDER])
def test_texture_fetches_sampled_in_compiled_code_agree(differential, toolkit, texel, kind,
                                                        as_integer, channels, mode):
    """1D, 2D and 3D fetches into floats and integers, element fetches and layered ones (the
    compiled sampler's forms) of every texel format, point and linear, normalized or not,
    at coordinates inside, outside and between texel centres, and at NaN and huge ones."""
    module = differential.load(toolkit.ptx(FETCHES))
    rng = np.random.default_rng(channels * 10 + mode)
    n = 96
    for normalized, linear in itertools.product((False, True), repeat=2):
        span = 1.6 if normalized else 9.0
        points = rng.uniform(-span / 2, span, 3 * n).astype(np.float32)
        points[:6] = [np.nan, 0.5, np.inf, -np.inf, 3e38, -3e38]
        points[6:12] = np.round(points[6:12] * 4) / 4 + 0.5   # ties of the weights
        handles = []
        for dims, shape in ((1, (1, 1, 5)), (2, (1, 4, 5)), (3, (3, 4, 5))):
            if kind == ChannelKind.FLOAT:
                data = rng.standard_normal((*shape, channels)).astype(texel)
            else:
                info = np.iinfo(texel)
                data = rng.integers(info.min, info.max, (*shape, channels), texel,
                                    endpoint=True)
            data = data[0] if dims < 3 else data
            handles.append(textures._object(
                differential, TEXTURE_MAGIC, data, dims, channels, kind,
                read_as_integer=as_integer, normalized_coords=normalized,
                linear_filter=linear, address_modes=(mode,) * 3,
                border=(0.5, -0.25, 2.0, 7.0)))
        layers = rng.standard_normal((3, 4, 5, channels)) * 100
        handles.append(textures._object(
            differential, TEXTURE_MAGIC, layers.astype(texel), 2, channels, kind, layers=3,
            read_as_integer=as_integer, normalized_coords=normalized, linear_filter=linear,
            address_modes=(mode,) * 3, border=(0.5, -0.25, 2.0, 7.0)))
        out = differential.zeros(3 * n * 4, np.float32)
        coordinates = differential.upload(points)
        for kernel, objects in (("fetch123", handles[:3]), ("fetch123_int", handles[:3]),
                                ("fetch_elements_and_layers", handles[::3])):
            differential.launch(module, kernel, (2,), (64,), *objects, coordinates, out, n)
            assert differential.download(out, 3 * n * 4, np.uint32)[48:].any()
    assert differential.compiled, "no kernel of the test ran compiled"


def test_a_surface_handle_fetched_as_a_texture_faults_as_on_the_interpreter(differential,
                                                                            toolkit):
    module = differential.load(toolkit.ptx(FETCHES))
    data = np.zeros((1, 4, 5, 1), np.float32)
    surface = textures._object(differential, SURFACE_MAGIC, data[0], 2, 1, ChannelKind.FLOAT)
    texture = textures._object(differential, TEXTURE_MAGIC, data[0], 2, 1, ChannelKind.FLOAT)
    with pytest.raises(LaunchError) as failure:
        differential.launch(module, "fetch123", (1,), (32,), texture, surface, texture,
                            differential.upload(np.zeros(96, np.float32)),
                            differential.zeros(384, np.float32), 32)
    assert failure.value.code == 700
    assert "not a live texture object" in str(failure.value)
    assert differential.compiled, "no kernel of the test ran compiled"


SURFACE_FORMS = r"""
extern "C" __global__ void surface_forms(cudaSurfaceObject_t s1, cudaSurfaceObject_t s3,
                                         cudaSurfaceObject_t w1, cudaSurfaceObject_t w3,
                                         const int *x, float4 *out, int n) {
    int i = threadIdx.x;
    if (i < n) {
        out[2 * i] = surf1Dread<float4>(s1, x[i] * 16, cudaBoundaryModeClamp);
        unsigned char c = surf3Dread<unsigned char>(s3, x[i], x[i] / 2, x[i] / 3,
                                                    cudaBoundaryModeZero);
        out[2 * i + 1] = make_float4(c, 0, 0, 0);
        surf3Dwrite<unsigned short>((unsigned short)(i * 7), w3, x[i] * 2, 1, 1,
                                    cudaBoundaryModeClamp);
        surf1Dwrite<long long>(i * 3LL, w1, x[i] * 8, cudaBoundaryModeZero);
    }
}
"""


def test_surface_access_forms_agree(differential, toolkit):
    """1D and 3D surfaces, 1- to 16-byte accesses, .clamp and .zero, inside and outside (the
    stores to surfaces of their own: threads run in another order compiled)."""
    module = differential.load(toolkit.ptx(SURFACE_FORMS))
    row = np.arange(6 * 4, dtype=np.float32).reshape(1, 6, 4)
    s1 = textures._object(differential, SURFACE_MAGIC, row, 1, 4, ChannelKind.FLOAT)
    volume = (np.arange(3 * 4 * 8) % 251).astype(np.uint8).reshape(3, 4, 8, 1)
    s3 = textures._object(differential, SURFACE_MAGIC, volume, 3, 1, ChannelKind.UNSIGNED)
    w1 = textures._object(differential, SURFACE_MAGIC, row, 1, 4, ChannelKind.FLOAT)
    w3 = textures._object(differential, SURFACE_MAGIC, volume, 3, 1, ChannelKind.UNSIGNED)
    x = np.array([0, 1, 5, 6, 7, -1, 3, 12, -9, 2], np.int32)
    out = differential.zeros(2 * len(x) * 4, np.float32)
    differential.launch(module, "surface_forms", (1,), (32,), s1, s3, w1, w3,
                        differential.upload(x), out, len(x))
    assert differential.compiled == ["surface_forms"]


SURFACE_AFTER_A_BARRIER = r"""
extern "C" __global__ void surface_after_a_barrier(cudaSurfaceObject_t s, cudaSurfaceObject_t w,
                                                  const int *at, float *out) {
    __shared__ float tile[32];
    int x = at[threadIdx.x] * 4;        // a byte offset: before the barrier, read after it
    tile[threadIdx.x] = threadIdx.x;
    __syncthreads();
    float value = surf1Dread<float>(s, x, cudaBoundaryModeZero) + tile[31 - threadIdx.x];
    out[threadIdx.x] = value;
    surf1Dwrite(value, w, 4 * threadIdx.x);
}
"""


def test_registers_surface_accesses_take_after_a_barrier_are_kept_across_it(differential,
                                                                             toolkit):
    """A thread's turn ends at a barrier and it keeps the registers read after it: a
    surface access's handle and coordinates count as read (they sit in its address
    operand, which for a store comes first, where other instructions write)."""
    module = differential.load(toolkit.ptx(SURFACE_AFTER_A_BARRIER))
    row = np.arange(8 * 4, dtype=np.float32).reshape(1, 8, 4)
    surface = textures._object(differential, SURFACE_MAGIC, row, 1, 4, ChannelKind.FLOAT)
    written = textures._object(differential, SURFACE_MAGIC, np.zeros_like(row), 1, 4,
                               ChannelKind.FLOAT)
    at = differential.upload(np.arange(32, dtype=np.int32) % 7)
    out = differential.zeros(32, np.float32)
    differential.launch(module, "surface_after_a_barrier", (1,), (32,), surface, written, at,
                        out)
    assert differential.compiled == ["surface_after_a_barrier"]
    want = row.ravel()[np.arange(32) % 7] + (31 - np.arange(32))   # 4-byte elements
    np.testing.assert_array_equal(differential.download(out, 32, np.float32), want)


SURFACE_IN_A_FUNCTION = r"""
__device__ __noinline__ float element(cudaSurfaceObject_t s, int x) {
    return surf1Dread<float>(s, x * 4, cudaBoundaryModeZero);
}
extern "C" __global__ void surface_in_a_function(cudaSurfaceObject_t s, float *out) {
    out[threadIdx.x] = element(s, threadIdx.x);
}
"""


def test_a_surface_read_in_a_device_function_runs_interpreted(toolkit, caplog):
    """Surface accesses reach the interpreter's callback, which the compiler sets up per
    kernel, not per device function: such a kernel runs on the interpreter, said once, and
    reads the surface (zeros past its end)."""
    native.configure(enabled=True)
    device = Device()
    module = device.load(toolkit.ptx(SURFACE_IN_A_FUNCTION))
    row = np.arange(20, dtype=np.float32).reshape(1, 20, 1)
    surface = textures._object(device, SURFACE_MAGIC, row, 1, 1, ChannelKind.FLOAT)
    out = device.zeros(32, np.float32)
    with caplog.at_level(logging.INFO, logger="vgpu.emu.native"):
        for _ in range(2):
            device.launch(module, "surface_in_a_function", (1,), (32,), surface, out)
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("kernel 'surface_in_a_function' runs on the interpreter") \
        and "suld" in message and "in a device function" in message
    np.testing.assert_array_equal(device.download(out, 32, np.float32),
                                  np.concatenate([np.arange(20), np.zeros(12)]))


def test_malloc_and_free_compiled():
    """The device heap's tests (NULL once full, lane order, freed blocks reused, bad and
    double frees fault with the heap's message) on compiled kernels."""
    native.configure(enabled=True)
    device = Device()
    device_runtime.test_malloc_returns_null_once_the_heap_is_full_and_reuses_freed_blocks(
        device)
    device_runtime.test_freeing_what_malloc_did_not_return_or_twice_faults(device)
    module = device.load(device_runtime.HEAP_PTX)
    assert prepare(module, "grab", 1, 16).native is not None
    assert prepare(module, "release", 1, 1).native is not None


def test_device_function_calls_agree(differential, toolkit):
    ptx = toolkit.ptx(conformance.SOURCE)
    conformance.test_device_function_calls(differential, differential.load(ptx), ptx)
    assert "calls" in differential.compiled


@pytest.mark.parametrize("name,arguments", [
    ("test_spin_lock_between_threads_of_one_warp", ()), ("test_cub_block_primitives", ()),
    ("test_cooperative_groups_tiles", ("compute_75",))])
def test_programs_with_warps_and_calls_agree(differential, toolkit, name, arguments):
    getattr(conformance, name)(differential, toolkit, *arguments)
    assert differential.compiled, "no kernel of the test ran compiled"


@pytest.mark.parametrize("name", [
    "test_printf_matches_c_printf", "test_printf_order_is_block_then_thread",
    "test_assert_fails_launch_with_code_710",
    "test_every_failing_thread_gets_its_assert_line_in_order",
    "test_passing_asserts_do_not_fail"])
def test_printf_and_assert_agree(differential, toolkit, tmp_path, name):
    """Output, order, assert lines and the failed launch's message, as the interpreter's."""
    test = getattr(printf_assert, name)
    test(differential, toolkit, *([tmp_path] if "c_printf" in name else []))
    assert differential.compiled, "no kernel of the test ran compiled"


@pytest.fixture(scope="module")
def control_ptx() -> str:
    return (instructions.PTX / "native_control.ptx").read_text()


def test_calls_through_registers_agree(differential, control_ptx):
    module = differential.load(control_ptx)
    out = differential.zeros(64, np.uint32)
    differential.launch(module, "indirect", (1,), (64,), out, 1000, 0)
    t = np.arange(64)
    np.testing.assert_array_equal(differential.download(out, 64, np.uint32),
                                  np.where(t % 2 == 0, 2 * t, t * t))
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, "indirect", (1,), (64,), out, 5, 0x1234)
    assert caught.value.code == 718
    assert caught.value.message.startswith("call through 0x1234 by thread (5,0,0)")
    assert differential.compiled == ["indirect", "indirect"]


@pytest.mark.parametrize("kernel,args,code", [("jump", (4,), 801), ("trapping", (3,), 719)])
def test_jump_tables_and_traps_fail_as_on_the_interpreter(differential, control_ptx, kernel,
                                                          args, code):
    module = differential.load(control_ptx)
    out = differential.zeros(64, np.uint32)
    if kernel == "jump":
        differential.launch(module, "jump", (1,), (64,), out, 1000)
        np.testing.assert_array_equal(differential.download(out, 64, np.uint32),
                                      10 * (np.arange(64) % 3))
        args = (out, *args)
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, kernel, (1,), (64,), *args)
    assert caught.value.code == code
    assert "by thread (4,0,0)" in caught.value.message or kernel == "trapping"
    assert differential.compiled[-1] == kernel


@pytest.mark.parametrize("exited", [96, 80])
def test_block_reductions_and_warp_syncs_agree(differential, control_ptx, exited):
    module = differential.load(control_ptx)
    values = np.random.default_rng(3).integers(1, 60, 96).astype(np.uint32)
    values[40] = 0
    out = differential.zeros(96 * 6, np.uint32)
    differential.launch(module, "reductions", (1,), (96,), differential.upload(values), out,
                        exited)
    assert differential.compiled == ["reductions"]
    got = differential.download(out, 96 * 6, np.uint32).reshape(96, 6)[:exited]
    alive = values[:exited]
    np.testing.assert_array_equal(got[:, 0], np.count_nonzero(alive & 1))
    np.testing.assert_array_equal(got[:, 1], int((alive < 50).all()))
    np.testing.assert_array_equal(got[:, 2], int((alive == 0).any()))
    np.testing.assert_array_equal(got[:, 3], np.roll(alive, -1))
    t = np.arange(exited)
    lanes = np.zeros(96, np.uint32)
    lanes[:exited] = alive * 3
    np.testing.assert_array_equal(got[:, 4], lanes[(t & ~31) + (t + 5) % 32])
    for w in range(3):
        mine = t[(t // 32 == w)]
        even = [k for k in mine if k % 2 == 0]
        ballot = sum(1 << (k % 32) for k in even if alive[k] < 50)
        np.testing.assert_array_equal(got[mine, 5], np.where(mine % 2 == 0, ballot, 0))


@pytest.mark.parametrize("uniform", [False, True])
def test_warp_reductions_matches_and_masks_agree(differential, control_ptx, uniform):
    module = differential.load(control_ptx)
    values = np.random.default_rng(4).integers(-100, 100, 64).astype(np.int32)
    if uniform:
        values[16:32] = 2 * values[16:32]     # even: match.all holds in that half-warp
    out = differential.zeros(64 * 8, np.uint32)
    differential.launch(module, "warp_forms", (1,), (64,), differential.upload(values), out)
    assert differential.compiled == ["warp_forms"]
    got = differential.download(out, 64 * 8, np.uint32).reshape(64, 8)
    odd = values & 1
    for half in range(4):
        rows = slice(16 * half, 16 * half + 16)
        part = values[rows]
        np.testing.assert_array_equal(got[rows, 0].view(np.int32), part.min())
        np.testing.assert_array_equal(got[rows, 1], part.view(np.uint32).max())
        np.testing.assert_array_equal(got[rows, 2].view(np.int32), part.sum())
        same = len(set(odd[rows])) == 1
        mask = 0xFFFF << (16 * (half % 2))
        np.testing.assert_array_equal(got[rows, 3], mask if same else 0)
        np.testing.assert_array_equal(got[rows, 4], int(same))
    for warp in range(2):
        rows = slice(32 * warp, 32 * warp + 32)
        active = sum(1 << k for k in range(32) if odd[32 * warp + k])
        np.testing.assert_array_equal(got[rows, 5], np.where(odd[rows] == 1, active, 0))


def test_half_precision_atomics_agree(differential, control_ptx):
    module = differential.load(control_ptx)
    rng = np.random.default_rng(5)
    halves = rng.standard_normal(128).astype(np.float16)
    halves[:4] = [6e-8, -6e-8, 65504, 1e-3]       # subnormals, the largest, one rounding
    brains = (rng.standard_normal(64).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16)
    inputs = np.zeros((64, 4), np.uint16)
    inputs[:, 0] = halves[:64].view(np.uint16)
    inputs[:, 1] = brains
    inputs[:, 2:] = halves[64:].view(np.uint16).reshape(32, 2).repeat(2, 0)
    cells = differential.zeros(8, np.uint16)
    out = differential.zeros(64 * 4, np.uint32)
    differential.launch(module, "half_sums", (1,), (64,), cells, differential.upload(inputs),
                        out)
    assert differential.compiled == ["half_sums"]
    got = differential.download(out, 64 * 4, np.uint32).reshape(64, 4)
    running = np.float16(0)
    for t in range(64):                         # the old value each thread saw
        assert got[t, 0] == np.array(running).view(np.uint16)
        running = np.float16(np.float32(running) + np.float32(halves[t]))
    np.testing.assert_array_equal(got[:, 2], np.arange(64))   # each swap finds its index


EDGE_WORDS = [0, 1, 2, 31, 32, 33, 64, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x7FC00000,
              0xFFC00001, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF, 0x3FC00000,
              0x40200000, 0xC0200000, 0x4F000000, 0xCF000001, 0x5F800000]
EDGE_DOUBLES = [0.0, -0.0, 1.5, -2.5, 2.0**63, -2.0**63 - 4096, 2.0**64, 1e308, 5e-324,
                float("inf"), float("-inf"), float("nan"), 3.0, -7.25]


def slice_inputs(threads: int) -> np.ndarray:
    """Four 64-bit words per thread: every pair of edge words, and random ones."""
    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**63, (threads, 4), np.int64).view(np.uint64) * np.uint64(2)
    words |= rng.integers(0, 2, (threads, 4)).astype(np.uint64)
    count = len(EDGE_WORDS)
    for t in range(min(threads, count * count)):
        low = [EDGE_WORDS[t % count], EDGE_WORDS[t // count]]
        words[t, 0] = (words[t, 0] & np.uint64(0xFFFFFFFF_00000000)) | np.uint64(low[0])
        words[t, 1] = (words[t, 1] & np.uint64(0xFFFFFFFF_00000000)) | np.uint64(low[1])
    doubles = np.array(EDGE_DOUBLES).view(np.uint64)
    for t in range(threads // 2):
        words[t, 2] = doubles[t % len(doubles)]
        words[t, 3] = doubles[(t // len(doubles)) % len(doubles)]
    return words


@pytest.mark.parametrize("ptx,kernel,words", [
    ("native_slice.ptx", "slice", 64),
    # rounding modes, .ftz/.sat, approximate functions, f16/bf16, conversions, carries,
    # bit fields, packed integers and comparisons
    ("native_arith.ptx", "arith", 128)])
def test_every_translated_instruction_form_agrees(differential, ptx, kernel, words):
    """On edge values (NaNs, infinities, subnormals, signed zeros, extreme integers) and
    random bits."""
    module = differential.load((instructions.PTX / ptx).read_text())
    threads = 512
    out = differential.zeros(threads * words, np.uint64)
    differential.launch(module, kernel, (2,), (256,), differential.upload(slice_inputs(
        threads)), out)
    assert differential.compiled == [kernel]


@pytest.mark.parametrize("kernel,block", [("pick", (8, 4, 2)), ("pick_x", (64,))])
def test_loop_free_lanes_run_in_the_fast_pass_and_agree(differential, kernel, block):
    """Lanes that alternate between two allocations (each fast-pass access compares with
    the allocation its site last found: every other lane misses and reruns checked), an
    update in place, a guarded store, a last block partly past n; 3D blocks, and 1D blocks
    whose index is blockIdx.x * blockDim.x + threadIdx.x, which run 16 at a time as one
    row of lanes (a lane that misses reruns as its own block's thread). 40 blocks, all
    through the fast pass (in the first, whose sites' caches are empty, every lane
    misses)."""
    from vgpu.server.emu.native.codegen import kernel_ir
    module = differential.load((instructions.PTX / "native_lanes.ptx").read_text())
    text = kernel_ir(module.program, module.program.kernels[kernel], kernel)[0]
    assert f"{kernel}_speculative" in text and "llvm.loop.vectorize.enable" in text
    n = 40 * 64 - 20
    rng = np.random.default_rng(3)
    a, b = rng.random(n // 2, np.float32), rng.random(n // 2, np.float32)
    start = rng.random(n, np.float32)
    da, db, out = (differential.upload(v) for v in (a, b, start))
    marks = differential.zeros(n // 3 + 1, np.uint32)
    differential.launch(module, kernel, (40,), block, da, db, out, marks, n)
    assert differential.compiled == [kernel]
    i = np.arange(n)
    picked = np.where(i % 2 == 1, a[i // 2], b[i // 2])
    np.testing.assert_allclose(differential.download(out, n, np.float32),
                               start + 2 * picked, rtol=1e-6)
    np.testing.assert_array_equal(differential.download(marks, n // 3 + 1, np.uint32),
                                  np.arange(0, n, 3))


@pytest.mark.parametrize("kernel,block,thread", [("pick", (8, 4, 2), "(4,1,0)"),
                                                 ("pick_x", (64,), "(12,0,0)")])
def test_a_fast_pass_lane_past_its_allocation_faults_as_on_the_interpreter(
        differential, kernel, block, thread):
    """The first lane whose read leaves its allocation (i = 140: a thread of block 2, which
    runs in the fast pass, for pick_x in a run with blocks 0-15) is the one reported,
    though the lanes after it ran there. They missed too, and are not left marked: in the
    next launch on the same allocations (whose first block has lanes that pass and lanes
    that miss) every thread runs once."""
    native.configure(threads=1)   # the next launch starts on the worker that faulted
    module = differential.load((instructions.PTX / "native_lanes.ptx").read_text())
    n = 40 * 64
    data = differential.upload(np.ones(70, np.float32))   # lanes up to 139 read inside
    other = differential.upload(np.full(70, 2, np.float32))
    out, marks = differential.zeros(n, np.float32), differential.zeros(n // 3 + 1, np.uint32)
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, kernel, (40,), block, data, data, out, marks, n)
    assert caught.value.code == 700
    assert f"thread {thread}" in caught.value.message
    assert "block (2,0,0)" in caught.value.message
    assert differential.compiled == [kernel]

    before = differential.download(out, n, np.float32)
    differential.launch(module, kernel, (40,), block, data, other, out, marks, 140)
    i = np.arange(n)
    added = np.where(i < 140, np.where(i % 2 == 1, 2, 4), 0)   # 2 * a[i / 2] or b[i / 2]
    np.testing.assert_array_equal(differential.download(out, n, np.float32), before + added)


_INDEX = {"mad": "mad.lo.s32 %r4, %r1, %r2, %r3;",
          "mul_add": "mul.lo.s32 %r5, %r2, %r1; add.s32 %r4, %r3, %r5;",
          "shift": "shl.b32 %r5, %r1, 8; add.s32 %r4, %r5, %r3;",
          "tid_twice": "mad.lo.s32 %r4, %r1, %r2, %r3; add.s32 %r4, %r4, %r3;",
          "offset": "mul.lo.s32 %r5, %r1, %r2; add.s32 %r6, %r3, 5; add.s32 %r4, %r5, %r6;",
          "unwritten": "mad.lo.s32 %r4, %r1, %r0, %r3;",
          "lane": "mad.lo.s32 %r4, %r1, %r2, %r3; mov.u32 %r5, %laneid; add.s32 %r4, %r4, %r5;"}


@pytest.mark.parametrize("form,joins", [("mad", True), ("mul_add", True), ("shift", False),
                                        ("tid_twice", False), ("offset", False),
                                        ("unwritten", False), ("lane", False)])
def test_blocks_join_in_a_row_only_where_threads_know_no_more_than_their_index(form, joins):
    """A lane of a run has its run's first ctaid.x and a tid.x past blockDim.x: right only
    for what reads them as blockIdx.x * blockDim.x + threadIdx.x and nothing else that
    tells a block's threads apart."""
    from vgpu.server.emu import PtxModule
    from vgpu.server.emu.native.speculative import joins_blocks
    ptx = PTX_HEADER + f""".visible .entry k(.param .u64 out)
{{
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    {_INDEX[form]}
    mul.wide.u32 %rd2, %r4, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}}
"""
    body = PtxModule.parse(ptx).program.kernels["k"].function.body
    assert joins_blocks(body) is joins


@pytest.fixture(scope="module")
def rows_ptx() -> str:
    return (instructions.PTX / "native_rows.ptx").read_text()


def test_the_fast_pass_finds_the_addresses_that_step_with_tid_x(rows_ptx):
    """Strides along a row of lanes (row_checks.py): the index, the byte offsets and
    addresses from it (4 bytes a lane, -4 for rev[n - 1 - i]); 0 for what is the same for
    the whole row (tid.y and the block are); loaded values have none."""
    from vgpu.server.emu import PtxModule
    from vgpu.server.emu.native.row_checks import lane_strides
    module = PtxModule.parse(rows_ptx)
    function = module.program.kernels["rows"].function
    strides = lane_strides(function.body)
    named = {r.name: strides[r.id] for r in function.registers if r.id in strides}
    assert {name: named.get(name) for name in (
        "%r4", "%r7", "%rd5", "%rd8", "%rd9", "%rd11", "%r9", "%rd13", "%rd14", "%rd15",
        "%f1", "%f3")} == {
        "%r4": 0, "%r7": 1, "%rd5": 0, "%rd8": 4, "%rd9": 4, "%rd11": 4, "%r9": -1,
        "%rd13": -4, "%rd14": -4, "%rd15": 4, "%f1": None, "%f3": None}


@pytest.mark.parametrize("base,ubase,lbase,limit,ulimit,llimit", [
    (5, 7, 11, 1000, 3, 600),                     # rows that all pass (or all fail)
    (2000, 0, 9000, 100, 1000, 12),               # rows that all fail
    (5, 2**32 - 20, 0, 30, 10, 60),               # rows passing in part; ubase wraps
    (2**31 - 20, 0, 2**63 - 20, 2**31 - 1, 0, 2**63 - 11),   # both ends pass, wrapping
    (2**31 - 20, 2**32 - 20, 2**63 - 20, -2**31 + 5, 2**32 - 10, -2**63 + 5),  # both fail
    (-2**31 + 10, 2**31, -5, -2**31 + 200, 2**31 + 100, 2),  # a falling row wraps
])
def test_guards_a_whole_row_passes_or_fails_agree_with_the_interpreter(
        differential, rows_ptx, base, ubase, lbase, limit, ulimit, llimit):
    """The fast pass knows a guard for a whole row where both its ends agree and the row
    crosses no wrap point (where it does, both ends may pass and lanes between fail): bit
    for bit the interpreter's, for rows that pass, fail, pass in part, step backwards and
    wrap, in 32 and 64 bits, signed and unsigned. 16 blocks on one thread, all through the
    fast pass."""
    module = differential.load(rows_ptx)
    out = differential.zeros(16 * 64, np.uint32)
    differential.launch(module, "guards", (16,), (64,), base, ubase, lbase, limit, ulimit,
                        llimit, out)
    t = np.tile(np.arange(64), 16)

    def wrapped(value: int, bits: int) -> int:
        return (value + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
    expected = [(wrapped(base + k, 32) < limit) | ((ubase + k) % 2**32 >= ulimit) << 1
                | (wrapped(base - 3 * k, 32) > limit) << 2
                | (wrapped(lbase + 2 * k, 64) <= llimit) << 3 for k in map(int, t)]
    np.testing.assert_array_equal(differential.download(out, 16 * 64, np.uint32), expected)
    assert differential.compiled == ["guards"]


def test_rows_of_lanes_checked_once_agree_with_the_interpreter(differential, rows_ptx):
    """Addresses stepping forwards and backwards (a generic store), 32-bit indices widened
    signed and unsigned, rows in 2D blocks, a last block partly past n; NaNs from the fast
    pass's fma (a signaling x, a NaN y, inf - inf) come out as the interpreter's."""
    module = differential.load(rows_ptx)
    n = 40 * 64 - 20
    rng = np.random.default_rng(5)
    x, y = rng.random(n, np.float32), rng.random(n, np.float32)
    x.view(np.uint32)[7] = 0x7FA00001
    y.view(np.uint32)[1000] = 0xFFC00123
    x.view(np.uint32)[2000], y.view(np.uint32)[2000] = 0xFFA00042, 0x7FC00077   # x's wins
    x[1500], y[1500] = np.inf, -np.inf
    a = np.float32(2.5)
    dx, dy = differential.upload(x), differential.upload(y)
    out, rev, shifted = (differential.zeros(n, np.float32) for _ in range(3))
    differential.launch(module, "rows", (40,), (32, 2), dx, dy, out, rev, shifted, n, a)
    assert differential.compiled == ["rows"]
    got = differential.download(out, n, np.float32)
    numbers = np.ones(n, bool)
    numbers[[7, 1000, 1500, 2000]] = False
    with np.errstate(invalid="ignore"):   # the NaNs
        want = (x.astype(np.float64) * a + y).astype(np.float32)
        one_minus = (1 - x.astype(np.float64)).astype(np.float32)   # exact: x = k / 2^24
    np.testing.assert_array_equal(got[numbers], want[numbers])
    assert [hex(v) for v in got.view(np.uint32)[[7, 1000, 2000]]] == [
        "0x7fe00001", "0xffc00123", "0xffe00042"]
    assert np.isnan(got[1500])
    rev = differential.download(rev, n, np.float32)[::-1]
    np.testing.assert_array_equal(rev[numbers], one_minus[numbers])
    assert hex(rev.view(np.uint32)[7]) == "0xffe00001"   # sub.rm: 1 + (-x), x's NaN negated
    np.testing.assert_array_equal(differential.download(shifted, n, np.float32),
                                  np.concatenate([np.zeros(1, np.float32), x[:-1]]))


@pytest.mark.parametrize("size,k,block", [(256, 2**31 - 28, 3), (100, 0, 12)])
def test_a_row_leaving_its_allocation_runs_checked_and_faults_as_interpreted(
        differential, rows_ptx, size, k, block):
    """Thread 4 of a fast-pass block is the first to read outside x: where index + k passes
    2^31 - 1 (the address is then far before x, though the row's first and last addresses
    are inside: only the row's check that its 32-bit values do not wrap sends it to the
    checked run), or where the index passes x's 100 floats (the row's last address)."""
    module = differential.load(rows_ptx)
    x, out = differential.upload(np.arange(size, dtype=np.float32)), differential.zeros(
        256, np.float32)
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, "wrapping", (32,), (8,), x, out, k)
    assert caught.value.code == 700
    assert "thread (4,0,0)" in caught.value.message
    assert f"block ({block},0,0)" in caught.value.message


@pytest.mark.parametrize("kernel,thread,block", [("misaligned_rows", 0, 1),
                                                ("misaligned_lanes", 1, 9)])
def test_misaligned_lanes_of_the_fast_pass_fault_as_interpreted(differential, rows_ptx,
                                                                kernel, thread, block):
    """Block 1 (the first after a checked block 0) reads words at x + 2 + 4 * tid.x (the
    row's first address is misaligned, so every lane's is), or block 9 at x + 2 * tid.x
    (every other lane's: the stride is not a multiple of the size)."""
    module = differential.load(rows_ptx)
    x, out = differential.upload(np.arange(64, dtype=np.uint32)), differential.zeros(
        32 * 16, np.uint32)
    arguments = (x, out) if kernel == "misaligned_rows" else (x, out, 9)
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, kernel, (32,), (16,), *arguments)
    assert caught.value.code == 716
    assert f"thread ({thread},0,0)" in caught.value.message
    assert f"block ({block},0,0)" in caught.value.message


@pytest.fixture(scope="module")
def faults_ptx() -> str:
    return (instructions.PTX / "native_faults.ptx").read_text()


@pytest.mark.parametrize("kernel,grid,block,args", [
    ("read_at", (1,), (32,), (1000, 4 * 32)),      # past the end of the allocation
    ("shared_at", (2,), (16,), (4,)),              # past the end of the block's 64 bytes
    ("misaligned", (1,), (1,), ()),
])
def test_faults_are_reported_as_the_interpreter_reports_them(differential, faults_ptx, kernel,
                                                              grid, block, args):
    module = differential.load(faults_ptx)
    data = differential.upload(np.arange(1024, dtype=np.uint32))
    arguments = {"read_at": lambda: (data, differential.zeros(32, np.uint32), args[0]),
                 "shared_at": lambda: args, "misaligned": lambda: (data,)}[kernel]()
    with pytest.raises(LaunchError) as caught:
        differential.launch(module, kernel, grid, block, *arguments)
    assert caught.value.code == (716 if kernel == "misaligned" else 700)
    assert differential.compiled == [kernel]


def test_stray_accesses_are_reported_once_as_the_interpreter_reports_them(faults_ptx):
    from vgpu.server.emu import DeviceMemory
    reports = []
    for compiled in (False, True):
        native.configure(enabled=compiled)
        device = Device()
        device.memory = DeviceMemory(granule=512)
        module = device.load(faults_ptx)
        data = device.upload(np.arange(100, dtype=np.uint32))   # 400 bytes, granule 512
        out = device.zeros(32, np.uint32)
        prepared = prepare(module, "read_at", (1,), (32,))
        assert (prepared.native is not None) == compiled
        checker = MemoryChecker(strict=False)
        params = device.pack(module, "read_at", (data, out, 90))
        first = prepared.run(params, device.memory, checker)
        second = prepared.run(params, device.memory, checker)
        reports.append((first.report, second.report, device.download(out, 32, np.uint32)))
    assert reports[0][0] and "(PTX line 19)" in reports[0][0] and not reports[0][1]
    assert reports[1][:2] == reports[0][:2]
    np.testing.assert_array_equal(reports[1][2], reports[0][2])


def test_a_kernel_the_compiler_does_not_handle_runs_interpreted_with_one_log_line(
        faults_ptx, caplog):
    native.configure(enabled=True)
    device = Device()
    module = device.load(faults_ptx)
    out = device.zeros(32, np.uint32)
    with caplog.at_level(logging.INFO, logger="vgpu.emu.native"):
        for _ in range(3):
            device.launch(module, "recursive", (1,), (32,), out)
    assert [r.getMessage() for r in caplog.records] == [
        "kernel 'recursive' runs on the interpreter: the compiler does not handle "
        "call.uni: recursion (twice) (PTX line 67)"]
    np.testing.assert_array_equal(device.download(out, 32, np.uint32),
                                  2 * (np.arange(32) % 8))


def test_a_second_load_of_the_same_ptx_compiles_nothing(faults_ptx, monkeypatch):
    from vgpu.server.emu.native import engine
    native.configure(enabled=True)
    device = Device()
    data = device.upload(np.arange(64, dtype=np.uint32))
    out = device.zeros(32, np.uint32)
    device.launch(device.load(faults_ptx), "read_at", (1,), (32,), data, out, 7)

    def refuse(text):
        raise AssertionError("compiled again")
    monkeypatch.setattr(engine, "compile_object", refuse)
    again = device.load(faults_ptx)
    assert prepare(again, "read_at", (1,), (32,)).native is not None
    device.launch(again, "read_at", (1,), (32,), data, out, 9)
    np.testing.assert_array_equal(device.download(out, 32, np.uint32), np.arange(9, 41))


def test_the_disk_cache_key_follows_the_emulators_source(tmp_path, monkeypatch):
    """Generated code follows from the emulator's source: a change to any of its files (a
    name, a byte) makes new keys, so no stale object is loaded and there is no version
    number to bump by hand."""
    from vgpu.server.emu.native import engine
    (tmp_path / "codegen.py").write_text("A = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "lower.py").write_text("B = 2\n")
    digests = {engine.source_digest.__wrapped__(tmp_path)}
    (tmp_path / "sub" / "lower.py").write_text("B = 3\n")
    digests.add(engine.source_digest.__wrapped__(tmp_path))
    (tmp_path / "sub" / "lower.py").rename(tmp_path / "sub" / "lower2.py")
    digests.add(engine.source_digest.__wrapped__(tmp_path))
    (tmp_path / "notes.txt").write_text("not source")
    digests.add(engine.source_digest.__wrapped__(tmp_path))
    assert len(digests) == 3
    key = engine.cache_key("ptx", "kernel")
    monkeypatch.setattr(engine, "source_digest", lambda directory: "another source")
    assert engine.cache_key("ptx", "kernel") != key


@pytest.mark.parametrize("threads", [1, 2])
def test_a_spinning_kernel_is_cancelled(faults_ptx, threads):
    native.configure(enabled=True, threads=threads)
    device = Device()
    prepared = prepare(device.load(faults_ptx), "forever", (4,), (8,))
    assert prepared.native is not None
    for _ in range(2):   # the second after what watches for cancels has gone to sleep
        cancelled = threading.Event()
        threading.Timer(0.2, cancelled.set).start()
        with pytest.raises(LaunchCancelled):
            prepared.execute(b"", device.memory, cancelled=cancelled)
        time.sleep(0.1)


def test_blocks_on_two_threads_give_the_interpreter_results(differential, toolkit):
    """Bit for bit but for float atomics, which round in the order threads reach them."""
    native.configure(threads=2)
    mod = differential.load(toolkit.ptx(conformance.SOURCE))
    conformance.test_block_reduction(differential, mod)   # integer atomics across blocks
    conformance.test_tiled_matmul(differential, mod, 37, 21, 50)
    assert differential.compiled == ["block_sum", "matmul"]


def test_a_fault_in_a_later_block_on_two_threads_is_reported_as_interpreted(differential,
                                                                          faults_ptx):
    """Blocks 32 on fault (threads 1024 on read past the 1,024 words): whichever worker
    claims them, the report names the first, as the interpreter's; the launch after it
    (the same frame and job) runs whole."""
    native.configure(threads=2)
    module = differential.load(faults_ptx)
    data = differential.upload(np.arange(1024, dtype=np.uint32))
    out = differential.zeros(2048, np.uint32)
    for _ in range(3):
        with pytest.raises(LaunchError) as caught:
            differential.launch(module, "read_global_at", (64,), (32,), data, out, 0)
        assert caught.value.code == 700 and "block (32,0,0)" in str(caught.value)
    differential.launch(module, "read_global_at", (32,), (32,), data, out, 0)
    np.testing.assert_array_equal(differential.download(out, 1024, np.uint32),
                                  np.arange(1024))
    assert set(differential.compiled) == {"read_global_at"}


def test_blocks_run_at_once_on_two_threads_awake_or_woken(faults_ptx):
    """Block 0 waits for the flag block 1 sets: it sees it only if a helper runs block 1
    meanwhile, both right after another launch (the helper still looking for work) and
    after a pause long enough for it to have gone to sleep (each a launch of a block shape
    not run before: how long it takes is not known, so it wakes the helpers)."""
    native.configure(enabled=True, threads=2)
    device = Device()
    module = device.load(faults_ptx)
    assert prepare(module, "meet", (2,), (1,)).native is not None
    for pause, threads in ((0, 1), (0, 1), (0.05, 2), (0.05, 3)):
        time.sleep(pause)
        flag, seen = device.zeros(1, np.uint32), device.zeros(1, np.uint32)
        device.launch(module, "meet", (2,), (threads,), flag, seen)
        assert device.download(seen, 1, np.uint32)[0] == 1


def test_a_launch_expected_short_wakes_the_helpers_once_a_thread_runs_long(faults_ptx):
    """A launch whose last run was short leaves sleeping helpers asleep; should one of its
    threads run long after all (here block 0 waits for the flag block 1 sets), the kernel
    wakes them, and block 1 runs meanwhile."""
    native.configure(enabled=True, threads=2)
    device = Device()
    module = device.load(faults_ptx)
    seen = device.zeros(1, np.uint32)
    for flag in (1, 1, 0):   # set already: block 0 ends at once, the launch is short
        time.sleep(0.05)     # the helper sleeps
        flags = device.upload(np.array([flag], np.uint32))
        device.launch(module, "meet", (2,), (1,), flags, seen)
        assert device.download(seen, 1, np.uint32)[0] == 1


def test_a_launch_shorter_than_a_wake_up_leaves_the_helpers_asleep(faults_ptx):
    """Waking a sleeping helper costs the launching thread a system call, and the helper
    comes tens of microseconds later: a launch whose last run took less runs on the
    launching thread alone (its results whole); one whose length is not known yet rings
    for them, and so do launches back to back (the helpers then keep looking between
    them)."""
    from vgpu.server.emu.native import team
    native.configure(enabled=True, threads=2)
    device = Device()
    module = device.load(faults_ptx)
    data = device.upload(np.arange(4 * 64, dtype=np.uint32))
    out = device.zeros(4 * 64, np.uint32)
    params = device.pack(module, "read_global_at", [data, out, 0])

    def rings(block) -> int:
        """Run a launch after the helper has gone to sleep; how often it rang for it."""
        time.sleep(0.05)
        bell = team._teams[1].record[team.BELL]
        prepare(module, "read_global_at", (256 // block,), (block,)).run(params, device.memory)
        return int(team._teams[1].record[team.BELL] - bell)

    prepare(module, "read_global_at", (4,), (64,)).run(params, device.memory)   # the team
    assert rings(32) == 1         # a shape not run before
    device.memory.write(out, bytes(4 * 64 * 4))
    assert rings(32) == 0         # its last run took a few microseconds
    np.testing.assert_array_equal(device.download(out, 4 * 64, np.uint32), np.arange(256))
    bell = team._teams[1].record[team.BELL]
    prepared = prepare(module, "read_global_at", (8,), (32,))
    for _ in range(20):
        prepared.run(params, device.memory)
    assert team._teams[1].record[team.BELL] > bell


def test_a_launch_that_wakes_the_helpers_keeps_them_off_its_cpu(faults_ptx):
    """Linux may wake a thread on its waker's CPU, where a helper would wait behind the launch
    it came to help. A launch keeps the helpers off the CPU it is launched from, also when
    the launching thread has moved since the last launch (helpers that kept themselves off
    the CPU of the launch before they slept woke trapped behind a launching thread that had
    moved there: for 1-2 ms its launches ran on one thread). A process that may use one
    CPU only leaves the helper on it."""
    import os

    from vgpu.server.emu.native import team
    cpus = os.sched_getaffinity(0)
    native.configure(enabled=True, threads=2)
    device = Device()
    module = device.load(faults_ptx)
    data = device.upload(np.arange(256, dtype=np.uint32))
    out = device.zeros(256, np.uint32)
    params = device.pack(module, "read_global_at", [data, out, 0])
    prepare(module, "read_global_at", (4,), (64,)).run(params, device.memory)   # the team
    helper = int(team._teams[1]._thread_ids[0])
    try:   # between two CPUs in turn (where there are two)
        for block, cpu in zip((16, 8, 4), itertools.cycle(sorted(cpus)[:2])):
            os.sched_setaffinity(0, {cpu})   # the launching thread (this one) moves
            time.sleep(0.05)                 # the helper sleeps
            device.memory.write(out, bytes(256 * 4))
            # a shape not run before: its length unknown, it wakes the helper
            prepare(module, "read_global_at", (256 // block,), (block,)).run(params,
                                                                           device.memory)
            np.testing.assert_array_equal(device.download(out, 256, np.uint32),
                                          np.arange(256))
            assert os.sched_getaffinity(helper) == (cpus - {cpu} or cpus)
    finally:
        os.sched_setaffinity(0, cpus)


def test_launches_from_several_threads_share_the_helpers(faults_ptx):
    """Four host threads launching at once (as a server's sessions do) post jobs to the
    same helpers: every launch's blocks all run, and only once."""
    native.configure(enabled=True, threads=2)
    device = Device()
    module = device.load(faults_ptx)
    data = device.upload(np.arange(64 * 256, dtype=np.uint32))
    failures = []

    def launches(k: int) -> None:
        out = device.zeros(64 * 256, np.uint32)
        for round_ in range(25):
            device.launch(module, "read_global_at", (64 - k,), (256,), data, out, k)
            got = device.download(out, (64 - k) * 256, np.uint32)
            if not np.array_equal(got, np.arange(k, k + (64 - k) * 256)):
                failures.append((k, round_))
            device.launch(module, "read_global_at", (64 - k,), (256,), data, out, 0)

    workers = [threading.Thread(target=launches, args=(k,)) for k in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert failures == []


def test_threads_spinning_on_a_later_thread_of_their_block_let_it_run(differential,
                                                                      faults_ptx):
    module = differential.load(faults_ptx)
    out = differential.zeros(32, np.uint32)
    differential.launch(module, "wait_for_last", (2,), (32,), differential.zeros(1, np.uint32),
                        out)
    np.testing.assert_array_equal(differential.download(out, 32, np.uint32), np.arange(1, 33))
    assert differential.compiled == ["wait_for_last"]


def test_the_compiler_is_on_unless_switched_off_and_uses_every_cpu():
    """The defaults a server starts with: VGPU_EMU_COMPILE=0 (or `vgpu server
    --no-compile`) keeps every kernel on the interpreter; blocks run on every CPU the
    process may use unless VGPU_EMU_THREADS (or `--threads`) says how many."""
    import os
    import subprocess
    import sys
    script = ("from vgpu.server.emu import native\n"
              "print(native.enabled(), native.threads())")
    cpus = len(os.sched_getaffinity(0))
    for compile_, threads, expected in (("", "", f"True {cpus}"), ("0", "", f"False {cpus}"),
                                        ("", "3", "True 3")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_EMU_")}
        env["VGPU_EMU_COMPILE"], env["VGPU_EMU_THREADS"] = compile_, threads
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True).stdout
        assert out.split() == expected.split()


def test_the_disk_cache_keeps_under_its_limit_dropping_the_least_recently_used(
        tmp_path, monkeypatch):
    import os

    from vgpu.server.emu.native import engine
    monkeypatch.setenv("VGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(engine, "CACHE_LIMIT", 4000)
    for k, key in enumerate("abc"):
        engine.store_cached(key, bytes(1000), {"function": key})
        os.utime(tmp_path / "native" / f"{key}.json", (k, k))   # a stored before b before c
    assert engine.load_cached("a", ("function",)) == (bytes(1000), {"function": "a"})
    engine.store_cached("d", bytes(1000), {"function": "d"})   # over 4000: b then c go
    kept = {key for key in "abcd" if engine.load_cached(key, ("function",)) is not None}
    assert kept == {"a", "d"}
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == [
        "a.json", "a.o", "d.json", "d.o"]


def test_a_kernel_over_the_size_limit_runs_interpreted_with_one_log_line(faults_ptx, caplog,
                                                                         monkeypatch):
    native.configure(enabled=True)
    monkeypatch.setattr(native, "MAX_INSTRUCTIONS", 3)
    device = Device()
    module = device.load(faults_ptx)
    data = device.upload(np.arange(64, dtype=np.uint32))
    out = device.zeros(32, np.uint32)
    with caplog.at_level(logging.INFO, logger="vgpu.emu.native"):
        assert prepare(module, "read_at", (1,), (32,)).native is None
        device.launch(module, "read_at", (1,), (32,), data, out, 5)
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith(
        "kernel 'read_at' runs on the interpreter: the compiler does not handle a kernel of ")
    np.testing.assert_array_equal(device.download(out, 32, np.uint32), np.arange(5, 37))
