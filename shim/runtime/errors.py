"""Errors: the last error of each thread, the process's sticky error, names and texts.

CUDA's semantics: every failing runtime call sets the calling thread's last error;
`cudaGetLastError` returns it and resets it to cudaSuccess, `cudaPeekAtLastError` only
returns it. A sticky error (a kernel fault) is no exception: like NVIDIA's runtime, both read
the thread's last error only, so `cudaGetLastError` hands a sticky error out once. What keeps
it sticky is that every later call using the device fails with it again (and so sets it as
the last error again, `_state.api`), until `cudaDeviceReset`. Errors of queued work (a
launch, an async copy) surface at the next call that synchronizes, as on a GPU.
"""

from __future__ import annotations

from vgpu.api.generated.error_texts import ERROR_TEXT

from ._state import E, ffi, ptr, runtime

__all__ = ["cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorName", "cudaGetErrorString"]

_UNRECOGNIZED = "unrecognized error code"


def cudaGetLastError():
    code = runtime.last_error()
    runtime.set_last_error(0)
    return code


def cudaPeekAtLastError():
    return runtime.last_error()


# C strings handed out live as long as the process, as NVIDIA's do.
_strings: dict[str, object] = {}


def _c_string(text: str) -> int:
    """The address of a NUL-terminated copy of `text` (the dispatcher returns it as the
    function's `const char *`)."""
    string = _strings.get(text)
    if string is None:
        string = _strings[text] = ffi.new("char[]", text.encode())
    return ptr(string)


def cudaGetErrorName(error):
    try:
        return _c_string(E(error).name)
    except ValueError:
        return _c_string(_UNRECOGNIZED)


def cudaGetErrorString(error):
    return _c_string(ERROR_TEXT.get(error, _UNRECOGNIZED))
