"""Error texts and codes agree with NVIDIA's: its runtime library's texts, its headers' codes."""

from __future__ import annotations

from vgpu.api import gen_error_texts
from vgpu.api.cudadefs import CUresult
from vgpu.api.cudartdefs import cudaError
from vgpu.api.generated.error_texts import ERROR_TEXT
from vgpu.shim.runtime._state import DRIVER_TO_RUNTIME


def test_committed_texts_are_nvidias(toolkit):
    generated = gen_error_texts.render(toolkit.cudart_library)
    committed = gen_error_texts.OUTPUT.read_text()
    assert generated == committed, \
        "vgpu/api/generated/error_texts.py is stale: run python -m vgpu.api.gen_error_texts"


def test_every_runtime_error_has_a_text():
    assert set(ERROR_TEXT) == {int(code) for code in cudaError}
    assert ERROR_TEXT[cudaError.cudaErrorIllegalAddress] == \
        "an illegal memory access was encountered"


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
