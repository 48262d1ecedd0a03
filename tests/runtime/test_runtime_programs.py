"""Unmodified runtime-API programs under `vgpu run`, on the emu backend and on the nested cuda
backend (a cuda-backend server run under vgpu against an emu server).

Each program in programs/ is CUDA C++ that checks its own results and exits 0 only when all
are right; it is compiled here with nvcc `-cudart shared`, once with the default (zstd-
compressed) fatbin and once with `--no-compress`, and run through our libcudart and libcuda.
A sample is also built with nvcc's default (NVIDIA's runtime linked statically, running on our
libcuda alone) and must print what its shared build prints. The programs share one server per
backend (`vgpu run --server`), which keeps the module fast; one test runs with a private
server, as `vgpu run --backend emu` starts it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from toolkit import C_INCLUDE, cuda12_runtime
from vgpu_processes import emu_server as emu_server_at
from vgpu_processes import run_under_vgpu, vgpu_environment

PROGRAMS = Path(__file__).resolve().parent / "programs"
E2E = Path(__file__).resolve().parents[1] / "e2e"
FATBINS = {"compressed": [], "uncompressed": ["--no-compress"]}
TIMEOUT_S = 300  # a program on the nested cuda backend crosses two servers


# Runs on the nested cuda backend: the program's calls cross two servers, and each program
# runs there once (with nvcc's default, compressed, fatbin), which keeps the module's time.
BACKEND_RUNS = [("emu", "compressed"), ("emu", "uncompressed"), ("cuda", "compressed")]


def pytest_generate_tests(metafunc):
    """Each acceptance program runs on the emu backend with both fatbins and on the nested
    cuda backend; what vgpu refuses is checked on emu (`emu_server`)."""
    if "fatbin" in metafunc.fixturenames:
        metafunc.parametrize(("backend", "fatbin"), BACKEND_RUNS, scope="module",
                             ids=[f"{b}-{f}" for b, f in BACKEND_RUNS])
    elif "server" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["emu", "cuda"], scope="module")


@pytest.fixture(scope="module")
def emu_server(tmp_path_factory):
    """One emu server for every program of the module."""
    with emu_server_at(tmp_path_factory.mktemp("runtime-server")) as address:
        yield address


@pytest.fixture(scope="module")
def server(request, backend):
    """The emu server, or the session's nested cuda server."""
    return request.getfixturevalue("emu_server" if backend == "emu" else "nested_cuda")


def build(toolkit, name: str, fatbin: str = "compressed", flags: tuple[str, ...] = (),
          extra: tuple[str, ...] = (), cudart: str = "shared") -> Path:
    """programs/<name>.cu (plus `extra` files of programs/) built with nvcc."""
    return toolkit.executable(
        (PROGRAMS / f"{name}.cu").read_text(),
        ["-cudart", cudart, f"-I{PROGRAMS}", f"-I{C_INCLUDE}", *FATBINS[fatbin], *flags],
        {file: (PROGRAMS / file).read_text() for file in extra})


def run(server: str, program: Path) -> subprocess.CompletedProcess:
    return run_under_vgpu(server, program, timeout=TIMEOUT_S)


def assert_passed(result: subprocess.CompletedProcess, *lines: str) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    for line in lines:
        assert line in result.stdout, f"{line!r} missing from\n{result.stdout}\n{result.stderr}"


# ----------------------------------------------------------------- acceptance programs

def test_vector_add(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "vector_add", fatbin)),
                  "vector_add: 1000 sums correct")


def test_vector_add_with_a_private_server(toolkit):
    program = build(toolkit, "vector_add")
    result = run_under_vgpu(None, program, timeout=TIMEOUT_S)  # a private server
    assert_passed(result, "vector_add: 1000 sums correct")


def test_tiled_matrix_multiply(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "matmul_tiled", fatbin)),
                  "matmul_tiled: 40x36 product correct")


def test_reduction_with_shared_memory_and_warp_shuffles(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "reduction", fatbin)), "reduction: sum")


def test_atomics(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "atomics", fatbin)), "atomics: histogram")


def test_streams_with_events_and_waits(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "streams_events", fatbin)),
                  "streams_events: 3 streams joined")


def test_async_copies_with_pinned_memory(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "async_pinned", fatbin)),
                  "async_pinned: pinned and registered copies correct")


def test_kernels_use_mapped_and_registered_host_memory(toolkit, server, fatbin):
    result = run(server, build(toolkit, "zero_copy", fatbin))
    assert_passed(result, "zero_copy: mapped and registered host memory used by kernels "
                          "correctly")


def test_constant_memory_and_symbol_copies(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "constant_memory", fatbin)),
                  "constant_memory: 64 evaluations")


def test_device_printf(toolkit, server, fatbin):
    result = run(server, build(toolkit, "device_printf", fatbin))
    assert_passed(result)
    lines = result.stdout.splitlines()
    device = {f"block {b} thread {t} says {1.5 + t:.2f} {'odd' if t % 2 else 'even'}"
              for b in range(2) for t in range(3)}
    assert lines[0] == "host before" and lines[-1] == "host after", result.stdout
    assert set(lines[1:-1]) == device, result.stdout


def test_kernel_assert_is_reported_and_sticky(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "kernel_assert", fatbin)),
                  "kernel_assert: error 710 reported and sticky")


def test_each_launch_runs_with_its_own_configuration(toolkit, server):
    assert_passed(run(server, build(toolkit, "launch_configuration")),
                  "launch_configuration: nested, concurrent and refused launches configured "
                  "right")


def test_templated_kernels(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "templates", fatbin)),
                  "templates: int, float, double and functor instantiations correct")


def test_relocatable_device_code_across_files(toolkit, server, fatbin):
    program = build(toolkit, "rdc_main", fatbin, flags=("-rdc=true",),
                    extra=("rdc_combine.cu",))
    assert_passed(run(server, program), "rdc: cross-file device function called 100 times")


def test_device_side_launches_heap_calls_and_grid_sync(toolkit, emu_server):
    # On emu only: the driver API's device-side program runs on the nested cuda backend too
    # (tests/e2e/test_driver_programs.py).
    program = build(toolkit, "device_side", flags=("-rdc=true", "-lcudadevrt"))
    assert_passed(run(emu_server, program),
                  "device_side: children, grandchildren and a tail launch ran in order",
                  "device_side: malloc, free, new and delete on a 1 MiB heap",
                  "device_side: virtual functions and recursion correct",
                  "device_side: a cooperative grid of 8 blocks met at grid.sync()")


def test_host_callbacks(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "host_callback", fatbin)),
                  "host_callback: host function and stream callback ran after the copy")


def test_occupancy_queries(toolkit, server, fatbin):
    result = run(server, build(toolkit, "occupancy", fatbin))
    # The emulated device's 164 KiB of shared memory per multiprocessor, less 1 KiB reserved
    # per block, holds three blocks of 48 KiB and four of 40 KiB; its 2048 threads per
    # multiprocessor eight blocks of 256, __launch_bounds__(128) or not (as on an H200).
    assert_passed(result, "occupancy: queries consistent with the device's limits",
                  "occupancy: 48 KiB of static shared memory: 3 blocks",
                  "occupancy: 40 KiB of dynamic shared memory: 4 blocks",
                  "occupancy: 256 threads of a kernel bounded to 128: 8 blocks")
    blocks = [int(b) for b in re.findall(r"threads: (\d+) blocks", result.stdout)]
    assert blocks == sorted(blocks, reverse=True), "bigger blocks, fewer of them fit"


def test_bad_calls_get_cuda_error_codes(toolkit, server, fatbin):
    result = run(server, build(toolkit, "error_checks", fatbin))
    assert_passed(result, "error_checks: every bad call got CUDA's code")


def test_device_management(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "device_management", fatbin)),
                  "device_management: queries consistent")


def test_memory_api(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "memory_api", fatbin)),
                  "memory_api: pitched, default-direction and pooled memory correct")


def test_host_threads(toolkit, server, fatbin):
    assert_passed(run(server, build(toolkit, "host_threads", fatbin)),
                  "host_threads: 4 threads launched and copied correctly")


def test_per_thread_default_stream(toolkit, server):
    """`--default-stream per-thread` programs call the `_ptsz` / `_ptds` entry points."""
    flags = ("--default-stream", "per-thread")
    program = build(toolkit, "streams_events", flags=flags)
    imports = subprocess.run(["nm", "-D", "--undefined-only", str(program)],
                             capture_output=True, text=True, check=True).stdout
    assert "__cudaLaunchKernel_ptsz" in imports and "cudaMemcpyAsync_ptsz" in imports
    assert_passed(run(server, program), "streams_events: 3 streams joined")


def test_graphs_and_stream_capture(toolkit, emu_server):
    assert_passed(run(emu_server, build(toolkit, "graphs")),
                  "graphs: module loaded during a capture", "graphs: captured graph ran 3 times",
                  "graphs: built graph ran and was updated",
                  "graphs: stream-ordered allocation captured",
                  "graphs: IF/else and SWITCH nodes chose by the kernel's condition",
                  "graphs: WHILE node looped until the kernel cleared its condition",
                  "graphs: conditional nodes' misuse refused",
                  "graphs: host-to-host copy nodes ran in order, a captured graph launch too",
                  "graphs: symbol copy nodes, node queries, attributes and a child graph "
                  "replaced",
                  "graphs: edge data kept, handed back and checked",
                  "graphs: graphs launched by a kernel, tail after fire-and-forget",
                  "graphs: misuse refused",
                  "graphs: all checks passed")


def test_textures_surfaces_and_arrays(toolkit, emu_server):
    """On emu: a texture object there is vgpu's descriptor in device memory, which only the
    emulator reads."""
    assert_passed(run(emu_server, build(toolkit, "textures")),
                  "textures: 2D point and linear sampling correct",
                  "textures: normalized reads with wrapped coordinates correct",
                  "textures: tex1Dfetch from linear memory correct",
                  "textures: 3D array copies and sampling correct",
                  "textures: layered array correct", "textures: cubemap faces correct",
                  "textures: mipmap levels of detail correct",
                  "textures: surface writes correct",
                  "textures: misuse refused with CUDA's errors")


def test_managed_memory(toolkit, server):
    assert_passed(run(server, build(toolkit, "managed_memory")),
                  "managed_memory: attributes say managed memory without concurrent access",
                  "managed_memory: host and kernel writes seen across launches",
                  "managed_memory: pointers stored in managed memory work on the device",
                  "managed_memory: __managed__ variables shared by host and device",
                  "managed_memory: copies, memsets and a 3 MiB allocation correct",
                  "managed_memory: misuse refused with CUDA's errors")


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """An emu server offering two devices."""
    with emu_server_at(tmp_path_factory.mktemp("two-devices"), "--devices", "2") as address:
        yield address


@pytest.mark.parametrize(("backend", "cudart"),
                         [("emu", "shared"), ("emu", "static"), ("cuda", "shared")])
def test_several_devices(request, toolkit, backend, cudart):
    """vgpu's runtime and NVIDIA's (on vgpu's driver) alike, on emu; on the nested cuda
    backend, which drives the two GPUs its driver offers."""
    server = request.getfixturevalue("two_devices" if backend == "emu"
                                     else "nested_cuda_two_devices")
    assert_passed(run(server, build(toolkit, "multi_device", cudart=cudart)),
                  "multi_device: 2 devices told apart",
                  "multi_device: a kernel on device 0 read device 1's memory",
                  "multi_device: peer copies correct",
                  "multi_device: misuse refused with CUDA's errors")


# ----------------------------------------------------------------- what vgpu refuses

def test_binary_without_ptx_names_the_kernel_when_launched(toolkit, emu_server):
    program = build(toolkit, "no_ptx", flags=("-gencode", "arch=compute_80,code=sm_80"))
    result = run(emu_server, program)
    assert_passed(result, "no_ptx: launch refused, memory calls fine")
    assert "cubin_only" in result.stderr and "PTX" in result.stderr, result.stderr
    assert "compute_80" in result.stderr, "the message says what to rebuild with"


@pytest.mark.parametrize(("cudart", "loading"), [("shared", "LAZY"), ("static", "LAZY"),
                                                 ("static", "EAGER")])
def test_cubin_only_kernels_are_refused_at_their_launch_only(toolkit, emu_server, tmp_path,
                                                             cudart, loading):
    """A program one of whose files was built cubin-only runs its other kernels, vgpu's
    runtime and NVIDIA's alike (NVIDIA's loads each image at the first use of one of its
    kernels, or, with CUDA_MODULE_LOADING=EAGER, every image at its first call); a library
    of cubins loads, and its kernel is refused naming it."""
    sass_only = ["-gencode", "arch=compute_80,code=sm_80"]
    program = toolkit.linked_executable(
        {"partly_cubin.cu": ((PROGRAMS / "partly_cubin.cu").read_text(), []),
         "partly_cubin_sass.cu": ((PROGRAMS / "partly_cubin_sass.cu").read_text(), sass_only)},
        ["-cudart", cudart, f"-I{PROGRAMS}"])
    library = tmp_path / "k.fatbin"
    library.write_bytes(toolkit.fatbin('extern "C" __global__ void k(int *v) { *v = 1; }',
                                       sass_only))
    result = run_under_vgpu(emu_server, program, library, timeout=TIMEOUT_S,
                            CUDA_MODULE_LOADING=loading)
    assert_passed(result, "partly_cubin: PTX kernels ran beside cubin-only ones, which were "
                          "refused")
    refusals = [line for line in result.stderr.splitlines() if line.startswith("vgpu:")]
    assert len(refusals) == 2 and "sass_only" in refusals[0] and "'k'" in refusals[1], \
        result.stderr
    assert all("no PTX" in line and "compute_80" in line for line in refusals), result.stderr


# ----------------------------------------------------------------- NVIDIA's own runtime

# nvcc's default build links NVIDIA's runtime statically; it runs on vgpu's libcuda through
# the driver's private tables (shim/c/driver_export_slots.c), and each program must print what
# its -cudart shared build prints. A sample, to keep the suite fast: module registration and
# symbols, printf, a reset that reloads the runtime's libraries, the runtime's own error codes,
# freeing NULL, pitches, occupancy, streams and events, device queries, managed variables
# (cuLibraryGetManaged), a sticky error and the last error that reports it, launch
# configurations nested and from several threads, and relocatable device code (the device-link
# image NVIDIA's runtime loads holds only a cubin; vgpu's libcuda links the objects' PTX
# instead), with device-side launches.
COMPARED = ("vector_add", "constant_memory", "device_printf", "printf_fifo", "error_checks",
            "memory_api", "occupancy", "streams_events", "async_pinned", "device_management",
            "managed_variable", "kernel_assert", "rdc_main", "device_side",
            "launch_configuration")
# How the programs above that need more than nvcc's defaults are built.
BUILT_WITH = {"rdc_main": {"flags": ("-rdc=true",), "extra": ("rdc_combine.cu",)},
              "device_side": {"flags": ("-rdc=true", "-lcudadevrt")}}


@pytest.mark.parametrize("name", COMPARED)
def test_default_build_with_nvidias_runtime_matches_the_shared_build(toolkit, emu_server,
                                                                     name):
    options = BUILT_WITH.get(name, {})
    shared = run(emu_server, build(toolkit, name, **options))
    static = run(emu_server, build(toolkit, name, cudart="static", **options))
    assert (static.returncode, static.stdout) == (shared.returncode, shared.stdout), \
        static.stderr
    assert shared.returncode == 0, shared.stderr
    assert "private table" not in static.stderr, static.stderr  # no table or slot refused


# NVIDIA's CUDA 12 runtime linked statically, as CUDA 12's nvcc links it by default. CUDA 12's
# nvcc is not on PyPI (its wheel holds only ptxas and libNVVM), so these programs are compiled
# by the CUDA 13 toolkit and linked with the CUDA 12.9 wheel's libcudart_static.a, whose
# directory comes first on the library path: the calls vgpu's libcuda sees are that
# runtime's. Left out: what checks CUDART_VERSION against the runtime's version
# (device_management).
CUDA12_COMPARED = ("vector_add", "constant_memory", "streams_events", "managed_variable",
                   "device_printf", "error_checks", "kernel_assert", "rdc_main")


def cuda12_static_flags() -> tuple[str, ...]:
    return (f"-L{cuda12_runtime('libcudart_static.a').parent}",)


def test_cuda_12_static_runtime_is_what_is_linked(toolkit, emu_server):
    source = ('#include <cstdio>\nint main() { int v = 0; cudaRuntimeGetVersion(&v); '
              'printf("runtime %d\\n", v); return v / 1000 == 12 ? 0 : 1; }\n')
    program = toolkit.executable(source, ["-cudart", "static", *cuda12_static_flags()])
    assert_passed(run(emu_server, program), "runtime 12")


@pytest.mark.parametrize("name", CUDA12_COMPARED)
def test_cuda_12_static_runtime_matches_the_shared_build(toolkit, emu_server, name):
    options = BUILT_WITH.get(name, {})
    shared = run(emu_server, build(toolkit, name, **options))
    flags = (*options.get("flags", ()), *cuda12_static_flags())
    static = run(emu_server, build(toolkit, name, cudart="static", flags=flags,
                                   extra=options.get("extra", ())))
    assert shared.returncode == 0, shared.stderr
    assert (static.returncode, static.stdout) == (shared.returncode, shared.stdout), \
        static.stderr
    assert "private table" not in static.stderr, static.stderr


def test_default_build_runs_without_the_cli(toolkit, emu_server):
    """Straight against vgpu's libcuda, as a program finds it on its library path."""
    from vgpu.shim.loader import shim_library_dir

    program = build(toolkit, "vector_add", cudart="static")
    env = {**vgpu_environment(), "LD_LIBRARY_PATH": str(shim_library_dir()),
           "VGPU_SERVER": emu_server}
    result = subprocess.run([str(program)], capture_output=True, text=True, timeout=TIMEOUT_S,
                            env=env)
    assert_passed(result, "vector_add: 1000 sums correct")


def test_streams_run_concurrently(toolkit, server):
    """Streams run beside each other (on emu each has a thread of its own on the server, on
    cuda a device stream): a kernel waiting for one launched after it on another stream
    finishes (it would hang with streams run in arrival order), and host functions run on
    vgpu's thread in stream order. First, on the default stream alone, each query of running
    work says not ready."""
    assert_passed(run(server, build(toolkit, "concurrent_streams")),
                  "concurrent_streams: waiting kernel released, events joined 1000 sums, "
                  "host functions in order")


def test_ipc_memory_between_processes(toolkit, server):
    """Two processes of one server: the child maps the parent's exported memory, and they
    wait for each other on the device (a kernel for a flag, a stream for an IPC event)."""
    assert_passed(run(server, build(toolkit, "ipc_memory")),
                  "ipc_memory: the child process added to 5000 ints of the parent's memory")


def test_ipc_in_order_between_processes_on_cuda(toolkit, nested_cuda):
    """Two processes of the nested cuda server share device memory and an event, each
    waiting only for what the other has done already: the child's context maps the parent's
    device memory."""
    assert_passed(run(nested_cuda, build(toolkit, "ipc_ordered")),
                  "ipc_ordered: the child doubled 4000 ints of the parent's memory after its "
                  "event")


def test_memory_pools_created_and_shared(toolkit, server):
    """A pool of cudaMemPoolCreate: allocations, attributes, access and misuse errors; then
    exported to a forked child, which imports a pointer of it and adds to it in place (on
    the cuda backend, the child's context maps the parent's device memory)."""
    assert_passed(run(server, build(toolkit, "memory_pools")),
                  "memory_pools: the child process added to 3000 ints of the parent's pool")


def test_hints_occupancy_and_libraries(toolkit, emu_server, tmp_path):
    """Access-policy windows and persisting-L2 limits accepted as hints, cudaFuncSetAttribute,
    the occupancy calculator, and a library loaded from PTX with cudaLibraryLoadData."""
    library = tmp_path / "library.ptx"
    library.write_text(toolkit.ptx((E2E / "stream_kernels.cu").read_text()))
    result = run_under_vgpu(emu_server, build(toolkit, "hints_and_libraries"), library,
                            timeout=TIMEOUT_S)
    assert_passed(result, "hints_and_libraries: hints accepted, library kernel and occupancy "
                          "correct")


def test_device_graph_misuse_errors(toolkit, emu_server):
    """Graphs a device may not launch fail to instantiate for device launch, with the
    result and node at fault; kernels' launches of graphs not made or not uploaded for it,
    into regular streams or while the graph still runs are refused, and the rest run."""
    program = build(toolkit, "device_graph_errors", flags=("-rdc=true", "-lcudadevrt"))
    assert_passed(run(emu_server, program),
                  "device_graph_errors: graphs a device may not launch failed to instantiate",
                  "device_graph_errors: kernels' misplaced graph launches were refused, the "
                  "rest ran",
                  "device_graph_errors: all checks passed")


def test_device_graph_cooperative_kernels_and_mapped_host_copies(toolkit, emu_server):
    """Cooperative kernel nodes and copies of device-mapped pinned memory in graphs that
    kernels launch: the grid meets at grid.sync(), and the copies move the host memory as
    it is at each launch, as the host's own sums say."""
    program = build(toolkit, "device_graph_nodes", flags=("-rdc=true", "-lcudadevrt"))
    assert_passed(run(emu_server, program),
                  "device_graph_nodes: cooperative kernel nodes met at grid.sync() from the "
                  "device",
                  "device_graph_nodes: copies of mapped pinned memory ran from the device",
                  "device_graph_nodes: all checks passed")


def test_graph_user_objects_and_device_graph_order(toolkit, emu_server):
    assert_passed(run(emu_server, build(toolkit, "graph_lifetimes")),
                  "graph_lifetimes: user objects destroyed after the last reference and launch",
                  "graph_lifetimes: tail launches ran after their graph, in CUDA's order",
                  "graph_lifetimes: a device graph's memset, kernel and copy ran from the "
                  "device",
                  "graph_lifetimes: a device graph found itself and relaunched itself",
                  "graph_lifetimes: all checks passed")
