"""PTX from NVRTC (through cuda.bindings.nvrtc; needs the nvidia-cuda-nvrtc wheel)."""

from __future__ import annotations

import numpy as np
from cuda.bindings import nvrtc  # the test extra installs cuda-bindings and NVRTC

SOURCE = rb"""
template <typename T>
__global__ void scale(T* x, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}
extern "C" __global__ void clamp01(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __saturatef(x[i]);
}
"""


def _check(result):
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtc failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def compile_ptx(source: bytes, names: list[bytes]) -> tuple[str, dict[bytes, str]]:
    program = _check(nvrtc.nvrtcCreateProgram(source, b"k.cu", 0, [], []))
    for name in names:
        _check(nvrtc.nvrtcAddNameExpression(program, name))
    options = [b"--gpu-architecture=compute_75", b"-default-device"]
    err, = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = _check(nvrtc.nvrtcGetProgramLogSize(program))
        log = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(program, log))
        raise RuntimeError(log.decode())
    size = _check(nvrtc.nvrtcGetPTXSize(program))
    ptx = b" " * size
    _check(nvrtc.nvrtcGetPTX(program, ptx))
    lowered = {name: _check(nvrtc.nvrtcGetLoweredName(program, name)).decode()
               for name in names}
    return ptx.rstrip(b"\0").decode(), lowered


def test_nvrtc_ptx_runs(device):
    ptx, lowered = compile_ptx(SOURCE, [b"scale<double>"])
    mod = device.load(ptx)
    x = np.linspace(-1, 2, 100)
    dx = device.upload(x)
    device.launch(mod, lowered[b"scale<double>"], (1,), (128,), dx, -2.5, 100)
    np.testing.assert_array_equal(device.download(dx, 100, np.float64), x * -2.5)
    f = np.linspace(-1, 2, 50).astype(np.float32)
    df = device.upload(f)
    device.launch(mod, "clamp01", (1,), (64,), df, 50)
    np.testing.assert_array_equal(device.download(df, 50, np.float32), np.clip(f, 0, 1))
