"""Exceptions raised by the PTX emulator, and the CUDA error codes they carry.

    Exception
    ├── PtxError        a module that cannot be loaded (syntax, unknown directive,
    │   │               unresolved external): raised at load, never at run time
    │   └── UnsupportedPtx  an instruction the emulator does not implement: the module
    │                   loads, and only launches of kernels that can reach it fail (801)
    ├── IllegalAddress  a DeviceMemory access outside every live allocation
    └── LaunchError     a launch that failed; `code` is the CUresult CUDA itself would report
"""

from __future__ import annotations

__all__ = [
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_INVALID_PTX",
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_NOT_FOUND",
    "CUDA_ERROR_NOT_SUPPORTED",
    "IllegalAddress",
    "LaunchError",
    "PtxError",
    "UnsupportedPtx",
]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_ASSERT = 710
CUDA_ERROR_MISALIGNED_ADDRESS = 716
CUDA_ERROR_INVALID_PC = 718
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_NOT_SUPPORTED = 801


class PtxError(Exception):
    """A PTX module that cannot be loaded; the message names the line and the construct."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


class UnsupportedPtx(PtxError):
    """An instruction, modifier or operand form the emulator does not implement (PTX that
    NVIDIA's assembler may accept). The module still loads; a kernel that can reach the
    instruction, directly or through calls, fails to launch with CUDA_ERROR_NOT_SUPPORTED."""


class IllegalAddress(Exception):
    """An access of `size` bytes at `address` that is not inside one live allocation, or
    (`denied` says why) inside one that does not allow it.

    `index` is the position of the first offending lane when the access was a vector of
    per-lane addresses (`DeviceMemory.gather` and friends), else None.
    """

    def __init__(self, address: int, size: int, index: int | None = None,
                 denied: str | None = None):
        self.address = int(address)
        self.size = int(size)
        self.index = index
        self.denied = denied
        super().__init__(f"illegal address 0x{self.address:x} (size {self.size})"
                         + (f": {denied}" if denied else ""))


class LaunchError(Exception):
    """A failed launch. `code` is the CUresult value; `output` is the device printf text
    produced before the failure, in deterministic order (for stdout); `diagnostics` what
    goes to stderr after it: CUDA's message for each failed assert, the memory checker's
    report."""

    def __init__(self, code: int, message: str, output: str = "", diagnostics: str = ""):
        self.code = int(code)
        self.message = message
        self.output = output
        self.diagnostics = diagnostics
        super().__init__(message)
