"""What the cuda backend reads from module images itself, before and besides its driver: the
kernels that may print or assert (their launches are waited for, their output captured), and
the module variables of an image without PTX (from its cubins' symbol tables)."""

from __future__ import annotations

import subprocess

from vgpu.server.backends.cuda_images import cubin_variables, printing_kernels

SOURCE = """
#include <cstdio>
#include <cassert>
__device__ float bias = 0.25f;
__device__ void tell(int i) { printf("%d\\n", i); }
extern "C" __global__ void prints(int *x) { tell(x[0]); }
extern "C" __global__ void asserts(int *x) { assert(x[0] > 0); }
extern "C" __global__ void quiet(float *x) { x[0] += bias; }
"""


def test_kernels_that_print_or_assert_through_the_functions_they_call(toolkit):
    ptx = toolkit.ptx(SOURCE)
    printing = printing_kernels(ptx.encode(), [ptx])
    assert {"prints", "asserts"} <= printing and "quiet" not in printing


def test_without_ptx_every_kernel_of_an_image_naming_printf_may_print():
    assert "any" in printing_kernels(b"\x7fELF ... vprintf ...", [])
    assert "any" not in printing_kernels(b"\x7fELF ... nothing of the kind", [])


def test_variables_of_images_holding_only_sass(toolkit, tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE)
    for kind in ("-cubin", "-fatbin"):
        subprocess.run([str(toolkit.nvcc), kind, "-arch=sm_80", "k.cu", "-o", "k.out"],
                       cwd=tmp_path, check=True, capture_output=True)
        assert cubin_variables((tmp_path / "k.out").read_bytes()) == [("bias", 0)], kind
