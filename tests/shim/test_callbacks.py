"""The typed callbacks between the C stubs and Python, called from C through the real shims.

Each test runs a Python process that loads a shim by its soname (as cuda-python does), lets it
boot, then attaches the callbacks to a test implementation (what the boot does with
vgpu.shim.driver / vgpu.shim.runtime) and calls the exported symbols through ctypes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HARNESS = """
import ctypes, json, sys, types
from vgpu.api import cudadefs, cudartdefs
from vgpu.api.table import driver_functions, runtime_functions
from vgpu.shim.dispatch import attach_callbacks, driver_results, runtime_results
from vgpu.shim.trace import tracing

libcuda = ctypes.CDLL("libcuda.so.1")
assert libcuda.cuDriverGetVersion(ctypes.byref(ctypes.c_int())) == 0  # boots the shim
driver = sys.modules["vgpu.shim._libcuda"]
libcudart = ctypes.CDLL("libcudart.so.13")
assert libcudart.cudaRuntimeGetVersion(ctypes.byref(ctypes.c_int())) == 0
runtime = sys.modules["vgpu.shim._libcudart"]


def attach_driver(implementation, functions=None):
    return attach_callbacks(driver.ffi, driver.lib, functions or driver_functions(),
                            implementation, driver_results(), cudadefs, trace=tracing())


def attach_runtime(implementation):
    return attach_callbacks(runtime.ffi, runtime.lib, runtime_functions(), implementation,
                            runtime_results(), cudartdefs, trace=tracing())


def show(**values):
    print(json.dumps(values))
"""


def run(shim_dir, body: str, trace: bool = False) -> tuple[dict, str]:
    """Runs HARNESS + body; returns what it `show`ed, and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VGPU_"))}
    env["LD_LIBRARY_PATH"] = str(shim_dir)
    if trace:
        env["VGPU_TRACE"] = "1"
    result = subprocess.run([sys.executable, "-c", HARNESS + textwrap.dedent(body)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


def test_arguments_arrive_decoded(shim_dir):
    shown, _ = run(shim_dir, """
        seen = []
        class Implementation:
            def cuLaunchKernel(*args):
                seen.extend(args)
                return 0
        implemented = attach_driver(Implementation)
        params = (ctypes.c_void_p * 1)()
        rc = libcuda.cuLaunchKernel(ctypes.c_void_p(0x1000), 1, 2, 3, 4, 5, 6, 7,
                                    ctypes.c_void_p(0x2000), params, None)
        ffi = driver.ffi
        show(rc=rc, implemented=sorted(implemented),
             types=[type(a).__name__ if isinstance(a, int) else ffi.typeof(a).cname
                    for a in seen],
             values=[a if isinstance(a, int) else int(ffi.cast("uintptr_t", a)) for a in seen],
             params=ctypes.addressof(params))
    """)
    assert shown["rc"] == 0
    assert shown["implemented"] == ["cuLaunchKernel"]
    assert shown["types"] == ["struct CUfunc_st *", *["int"] * 7, "struct CUstream_st *",
                              "void * *", "void * *"]
    assert shown["values"] == [0x1000, 1, 2, 3, 4, 5, 6, 7, 0x2000, shown["params"], 0]


def test_per_thread_stream_variants_are_implemented_by_their_base(shim_dir):
    shown, _ = run(shim_dir, """
        import vgpu.shim.driver
        show(implemented=sorted(attach_driver(vgpu.shim.driver)))
    """)
    assert {"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuMemAlloc_v2"} <= set(shown["implemented"])
    assert "cuGraphicsGLRegisterBuffer" not in shown["implemented"]


FAILING = """
    class Implementation:
        def cuCtxSynchronize():
            raise ValueError("broken on purpose")
        def cuCtxGetDevice(device):
            return None
        def cuCtxGetApiVersion(ctx, version):
            return "CUDA_SUCCESS"
    attach_driver(Implementation)
    show(codes=[libcuda.cuCtxSynchronize(), libcuda.cuCtxGetDevice(None),
                libcuda.cuCtxGetApiVersion(None, None)])
"""


@pytest.mark.parametrize("trace", [False, True], ids=["direct", "traced"])
def test_failures_answer_unknown_and_say_why(shim_dir, trace):
    shown, stderr = run(shim_dir, FAILING, trace=trace)
    assert shown["codes"] == [999, 999, 999]  # CUDA_ERROR_UNKNOWN
    assert "vgpu: cuCtxSynchronize raised an exception; returning CUDA_ERROR_UNKNOWN\n" \
           "Traceback (most recent call last):\n" in stderr
    assert "ValueError: broken on purpose" in stderr
    if trace:  # the traced call checks the result itself and shows it
        assert "vgpu: cuCtxGetDevice returned None, not a result code; " \
               "returning CUDA_ERROR_UNKNOWN" in stderr
        assert "vgpu trace: cuCtxGetDevice(device=NULL) -> CUDA_ERROR_UNKNOWN" in stderr
    else:
        assert "vgpu: cuCtxGetDevice returned a value its C result cannot hold (TypeError: " \
               in stderr
        assert "vgpu: cuCtxGetApiVersion returned a value its C result cannot hold" in stderr


def test_a_callback_the_table_lacks_fails_the_boot(shim_dir):
    shown, _ = run(shim_dir, """
        functions = [fn for fn in driver_functions() if fn.symbol != "cuLaunchKernel"]
        try:
            attach_driver(object(), functions)
        except RuntimeError as exc:
            show(error=str(exc))
    """)
    assert "vgpu_py_cuLaunchKernel" in shown["error"] and "reinstall vgpu" in shown["error"]


RUNTIME = """
    class Extent(ctypes.Structure):
        _fields_ = [("width", ctypes.c_size_t), ("height", ctypes.c_size_t),
                    ("depth", ctypes.c_size_t)]
    class ChannelDesc(ctypes.Structure):
        _fields_ = [(name, ctypes.c_int) for name in ("x", "y", "z", "w", "f")]
    kept = []
    text = runtime.ffi.new("char[]", b"kept alive by the implementation")
    def cudaMalloc3D(pitched, extent):
        kept.append(extent)
        return 0
    def cudaCreateChannelDesc(x, y, z, w, f):
        return None if x == 0 else {"x": x, "y": y, "z": z, "w": w, "f": f}
    def cudaGetErrorString(error):
        return {0: None, 1: text, 2: int(runtime.ffi.cast("uintptr_t", text))}[error]
    def __cudaInitModule(handle):
        return 1
    def __cudaRegisterFatBinaryEnd(handle):
        return 5  # a void function's result is dropped
    # A namespace, not a class: a class would mangle the `__cuda` names.
    Implementation = types.SimpleNamespace(**{name: globals()[name] for name in (
        "cudaMalloc3D", "cudaCreateChannelDesc", "cudaGetErrorString", "__cudaInitModule",
        "__cudaRegisterFatBinaryEnd")})
    attach_runtime(Implementation)
    libcudart.cudaMalloc3D.argtypes = [ctypes.c_void_p, Extent]
    libcudart.cudaCreateChannelDesc.restype = ChannelDesc
    libcudart.cudaGetErrorString.restype = ctypes.c_char_p
    libcudart.__cudaInitModule.restype = ctypes.c_char
    libcudart.__cudaRegisterFatBinary.restype = ctypes.c_void_p
    codes = [libcudart.cudaMalloc3D(None, Extent(1, 2, 3)),
             libcudart.cudaMalloc3D(None, Extent(4, 5, 6))]
    libcudart.__cudaRegisterFatBinaryEnd(None)
    descs = [libcudart.cudaCreateChannelDesc(0, 1, 2, 3, 0),
             libcudart.cudaCreateChannelDesc(8, 16, 0, 0, 2)]
    show(codes=codes, kept=[[e.width, e.height, e.depth] for e in kept],
         descs=[[d.x, d.y, d.z, d.w, d.f] for d in descs],
         strings=[(s or b"NULL").decode() for s in map(libcudart.cudaGetErrorString, (0, 1, 2))],
         init=libcudart.__cudaInitModule(None).decode("latin-1"),
         fatbin=[libcudart.__cudaRegisterFatBinary(None) for _ in range(2)])
"""


@pytest.mark.parametrize("trace", [False, True], ids=["direct", "traced"])
def test_structs_by_value_and_other_result_types(shim_dir, trace):
    shown, stderr = run(shim_dir, RUNTIME, trace=trace)
    assert shown["codes"] == [0, 0]
    assert shown["kept"] == [[1, 2, 3], [4, 5, 6]]  # copies, still valid after the calls
    assert shown["descs"] == [[0, 0, 0, 0, 0], [8, 16, 0, 0, 2]]  # None is C's zero
    assert shown["strings"] == ["NULL", *["kept alive by the implementation"] * 2]
    assert shown["init"] == "\x01"  # `char`, given as an int
    assert shown["fatbin"] == [None, None]  # not implemented: NULL, said once
    assert stderr.count("vgpu: __cudaRegisterFatBinary is not implemented "
                        "(cudaErrorNotSupported)") == 1
    assert "raised" not in stderr and "cannot hold" not in stderr
    if trace:
        assert "vgpu trace: cudaMalloc3D(pitchedDevPtr=NULL, extent={width=4, height=5, " \
               "depth=6}) -> cudaSuccess" in stderr
        assert "vgpu trace: cudaCreateChannelDesc(x=0, y=1, z=2, w=3, " \
               "f=cudaChannelFormatKindSigned) -> {x=0, y=0, z=0, w=0, f=0}" in stderr
        assert "vgpu trace: __cudaInitModule(fatCubinHandle=NULL) -> 1" in stderr
