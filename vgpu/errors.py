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

    def __reduce__(self):
        # Pickled (a device process's error going to the server) as its state: subclasses'
        # constructors take other arguments.
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type, args: tuple, state: dict) -> CudaError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class DeviceUnavailable(CudaError):
    def __init__(self, message: str):
        super().__init__(CUDA_ERROR_DEVICE_UNAVAILABLE, message)
