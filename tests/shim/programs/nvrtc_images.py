"""Compiles a kernel through vgpu's libnvrtc.so.13, loaded by its path (as a program linked
against it would load it), and writes what it hands back: `python nvrtc_images.py ARCH DIR`
writes DIR/image (nvrtcGetCUBIN), DIR/cubin (the same program's cubin as NVIDIA's NVRTC hands
it back) and DIR/ptx (nvrtcGetPTX). VGPU_NVRTC_LIBRARY names NVIDIA's library."""

import ctypes
import os
import sys
from pathlib import Path

from vgpu.shim.loader import NVRTC, shim_library_dir

SOURCE = b'extern "C" __global__ void twice(float *x) { x[threadIdx.x] *= 2; }'


def output(library, program, size_function: str, function: str) -> bytes:
    size = ctypes.c_size_t()
    assert getattr(library, size_function)(program, ctypes.byref(size)) == 0
    buffer = ctypes.create_string_buffer(size.value)
    assert getattr(library, function)(program, buffer) == 0
    return buffer.raw


def main(arch: str, folder: Path) -> None:
    ours = ctypes.CDLL(str(shim_library_dir() / NVRTC))
    nvidia = ctypes.CDLL(os.environ["VGPU_NVRTC_LIBRARY"])
    program = ctypes.c_void_p()
    assert ours.nvrtcCreateProgram(ctypes.byref(program), SOURCE, b"k.cu", 0, None, None) == 0
    options = (ctypes.c_char_p * 1)(f"-arch={arch}".encode())
    assert ours.nvrtcCompileProgram(program, 1, options) == 0
    (folder / "image").write_bytes(output(ours, program, "nvrtcGetCUBINSize", "nvrtcGetCUBIN"))
    (folder / "cubin").write_bytes(output(nvidia, program, "nvrtcGetCUBINSize",
                                          "nvrtcGetCUBIN"))
    (folder / "ptx").write_bytes(output(ours, program, "nvrtcGetPTXSize", "nvrtcGetPTX"))
    assert ours.nvrtcDestroyProgram(ctypes.byref(program)) == 0


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
