"""The one exception type that carries a CUDA error code through vgpu's Python layers.

    CudaError(code, message)        raised anywhere a CUDA call fails; `code` is the CUresult
    └── DeviceUnavailable           the server cannot be reached (CUDA_ERROR_DEVICE_UNAVAILABLE)

Server handlers raise CudaError; the session turns it into the reply's error code. Client code
raises it from validation and from replies; the driver layer turns it into the return value.
"""

from __future__ import annotations

__all__ = ["CudaError", "DeviceUnavailable"]

CUDA_ERROR_DEVICE_UNAVAILABLE = 46


class CudaError(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message or f"CUDA error {code}")
        self.code = int(code)
        self.message = message


class DeviceUnavailable(CudaError):
    def __init__(self, message: str):
        super().__init__(CUDA_ERROR_DEVICE_UNAVAILABLE, message)
