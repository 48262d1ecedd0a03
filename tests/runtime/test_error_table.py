"""The runtime's error texts and codes agree with NVIDIA's headers."""

from __future__ import annotations

from vgpu.api.cudadefs import CUresult
from vgpu.api.cudartdefs import cudaError
from vgpu.shim.runtime import error_table, gen_error_table
from vgpu.shim.runtime._state import DRIVER_TO_RUNTIME


def test_committed_texts_match_the_header(toolkit):
    generated = gen_error_table.render(toolkit.include)
    committed = gen_error_table.OUTPUT.read_text()
    assert generated == committed, \
        "shim/runtime/error_table.py is stale: run python -m vgpu.shim.runtime.gen_error_table"


def test_every_runtime_error_has_a_text():
    assert set(error_table.ERROR_TEXT) == {int(code) for code in cudaError}


def test_driver_errors_map_to_the_runtime_error_of_the_same_number():
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_INVALID_VALUE] == cudaError.cudaErrorInvalidValue
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_OUT_OF_MEMORY] == \
        cudaError.cudaErrorMemoryAllocation
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_INVALID_HANDLE] == \
        cudaError.cudaErrorInvalidResourceHandle
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU] == \
        cudaError.cudaErrorNoKernelImageForDevice
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_ASSERT] == cudaError.cudaErrorAssert
    assert DRIVER_TO_RUNTIME[CUresult.CUDA_ERROR_DEVICE_UNAVAILABLE] == \
        cudaError.cudaErrorDevicesUnavailable
    for driver, runtime in DRIVER_TO_RUNTIME.items():
        assert runtime == driver or runtime == cudaError.cudaErrorUnknown
        assert cudaError(runtime).name.startswith("cuda")
