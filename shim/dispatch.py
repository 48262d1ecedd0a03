"""Attaches the Python callback of every C stub of a shim to the function implementing it.

Each generated stub calls its symbol's own cffi callback, `vgpu_py_<symbol>`, declared with
the symbol's C signature (shim/generated/*_callbacks.h): cffi converts the arguments in its
generated C, integers and enums to ints, pointers and handles to cdata the implementation may
write through. At boot each callback gets, in order of preference:
- the implementation itself, when the implementation module (vgpu.shim.driver for libcuda,
  vgpu.shim.runtime for libcudart) has a callable of the symbol's exact name and the C types
  ask nothing more: cffi then calls it with no Python frame in between;
- the implementation behind an adapter (adapters.py) when they do: structs passed by value,
  results other than the result code;
- for any other symbol, "not supported", the symbol named once on stderr.
An exception answers "unknown" with its traceback printed; so does a result C cannot take
(not an int, for a result code): cffi's conversion fails and reports it here. An exception
that is no Exception (KeyboardInterrupt, SystemExit: what a signal handler of a Python
program raises to stop it, and handlers run inside our callbacks) is the program's: the call
answers "unknown" silently, and the program gets the exception once the call has returned
(shim/c/embedded_python.h). The C layer lets no call through before the boot has attached
every callback: one left bare would answer 0, success. With VGPU_TRACE=1 every callback
prints its call, arguments and result (trace.py).
"""

from __future__ import annotations

import enum
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TextIO

from vgpu.api.table import CALLBACK_PREFIX, ApiFunction

from .adapters import adapt, zero_of
from .trace import format_value, traced, tracing

__all__ = ["ResultCodes", "attach_callbacks", "boot_driver", "boot_runtime", "driver_results",
           "runtime_results", "take_interruption"]

# The exception a signal handler of the program raised inside a callback, until the C layer
# has the program's main thread raise it (take_interruption). Handlers run in the main
# thread only, which is also the one that takes it.
_interruption: BaseException | None = None


def take_interruption() -> BaseException | None:
    """The program's exception kept from an interrupted callback, once (the C layer's)."""
    global _interruption
    exc, _interruption = _interruption, None
    return exc


def _called_from_python(tb: Any) -> bool:
    """Whether the failed callback (`tb` is its traceback) was called from Python code, which
    can take the exception: a Python program's, not a C program's (where the callback's
    frame is the thread's first)."""
    return tb is not None and tb.tb_frame.f_back is not None


def _keep_interruption(exc: BaseException) -> None:
    """Keep `exc` to be raised in the program: without the frames and the exception context
    of the callback it interrupted, so that its traceback is the program's own."""
    global _interruption
    exc.__context__ = None
    _interruption = exc.with_traceback(None)


class ResultCodes:
    """An API family's result codes: its C type, its enum, and what the dispatcher reports."""

    def __init__(self, ctype: str, codes: type[enum.IntEnum], not_supported: int,
                 unknown: int):
        self.ctype = ctype
        self.codes = codes
        self.not_supported = int(not_supported)
        self.unknown = int(unknown)
        self.not_supported_name = self.name(not_supported)
        self.unknown_name = self.name(unknown)

    def name(self, value: int) -> str:
        try:
            return self.codes(value).name
        except ValueError:
            return str(value)


class _Callback:
    """What is attached to one symbol's callback, and how its failures are reported."""

    def __init__(self, ffi: Any, fn: ApiFunction, ctype: Any, results: ResultCodes,
                 code_type: Any, write: Callable[[str], None],
                 note_interruption: Callable[[], None]):
        self.ffi = ffi
        self.note_interruption = note_interruption
        self.fn = fn
        self.results = results
        self.write = write
        self.returns_code = ctype.result == code_type
        self.returns_void = ctype.result.kind == "void"
        # What C gets when the call fails: the result code "unknown", else a zero.
        self.error = results.unknown if self.returns_code else zero_of(ffi, ctype.result)
        self.failure = (f"; returning {results.unknown_name}" if self.returns_code
                        else "" if self.returns_void else "; returning zero")

    def onerror(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        """cffi's report of a failed callback; C then gets the callback's error value."""
        if not issubclass(exc_type, Exception) and _called_from_python(tb):
            _keep_interruption(exc)  # the program's: C has it raised there, once we return
            self.note_interruption()
        elif tb is None:  # nothing ran in Python: cffi could not convert the result to C
            self.write(f"vgpu: {self.fn.symbol} returned a value its C result cannot hold "
                       f"({exc_type.__name__}: {exc}){self.failure}")
        else:
            text = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip()
            self.write(f"vgpu: {self.fn.symbol} raised an exception{self.failure}\n{text}")

    def not_implemented(self) -> Callable[..., Any]:
        """Answers "not supported" (a zero where the result is not a code), and says so once."""
        value = self.results.not_supported if self.returns_code else self.error
        line = f"vgpu: {self.fn.symbol} is not implemented ({self.results.not_supported_name})"
        reported = False

        def not_implemented(*args: Any) -> Any:
            nonlocal reported
            if not reported:
                reported = True
                self.write(line)
            return value

        return not_implemented

    def traced(self, call: Callable[..., Any], enums: ModuleType) -> Callable[..., Any]:
        return traced(self.ffi, self.fn, call, enums, self.write, self._outcome, self._failed)

    def _outcome(self, value: Any) -> tuple[Any, str]:
        """For the trace: the value C gets for `value`, and how the trace shows it. A traced
        call checks a result code itself, so that its report can show the offending value."""
        if self.returns_code:
            if not isinstance(value, int):
                self.write(f"vgpu: {self.fn.symbol} returned {value!r}, not a result code"
                           f"{self.failure}")
                value = self.results.unknown
            return value, self.results.name(value)
        if self.returns_void:
            return None, "void"
        return value, format_value(self.ffi, value, None, None, False)

    def _failed(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> Any:
        self.onerror(exc_type, exc, tb)
        return self.error


def attach_callbacks(ffi: Any, lib: Any, functions: Sequence[ApiFunction],
                     implementation: Any, results: ResultCodes, enums: ModuleType, *,
                     trace: bool = False, stream: TextIO | None = None) -> frozenset[str]:
    """Attaches every callback `lib` declares; returns the symbols `implementation` has. Raises
    if `lib` declares a callback that `functions` lacks: it would be left bare."""

    def write(line: str) -> None:
        out = stream or sys.stderr
        out.write(line + "\n")
        out.flush()

    declared = {name for name in dir(lib) if name.startswith(CALLBACK_PREFIX)}
    code_type = ffi.typeof(results.ctype)
    note_interruption = lib.vgpu_note_interruption
    implemented = set()
    for fn in functions:
        name = CALLBACK_PREFIX + fn.symbol
        if name not in declared:
            continue  # written in C (cuGetProcAddress, ...): no callback
        declared.discard(name)
        ctype = ffi.typeof(getattr(lib, name))
        callback = _Callback(ffi, fn, ctype, results, code_type, write, note_interruption)
        impl = getattr(implementation, fn.symbol, None)
        if callable(impl):
            implemented.add(fn.symbol)
            call = adapt(ffi, ctype, impl, returns_code=callback.returns_code)
        else:
            call = callback.not_implemented()
        if trace:
            call = callback.traced(call, enums)
        # `error=None`: cffi answers C's zero of any other result type.
        ffi.def_extern(name=name, error=results.unknown if callback.returns_code else None,
                       onerror=callback.onerror)(call)
    if declared:
        raise RuntimeError(f"the built shim has callbacks the API table lacks "
                           f"({', '.join(sorted(declared)[:3])}, ...): reinstall vgpu")
    return frozenset(implemented)


def driver_results() -> ResultCodes:
    from vgpu.api.cudadefs import CUresult

    return ResultCodes("CUresult", CUresult, CUresult.CUDA_ERROR_NOT_SUPPORTED,
                       CUresult.CUDA_ERROR_UNKNOWN)


def runtime_results() -> ResultCodes:
    from vgpu.api.cudartdefs import cudaError

    return ResultCodes("cudaError_t", cudaError, cudaError.cudaErrorNotSupported,
                       cudaError.cudaErrorUnknown)


def boot_driver(ffi: Any, lib: Any) -> frozenset[str]:
    """Called by the libcuda shim's embedded init: attaches the driver's callbacks."""
    from vgpu.api import cudadefs
    from vgpu.api.table import driver_functions
    from vgpu.shim import driver

    functions = driver_functions()
    _check_stub_table(lib.vgpu_driver_symbol_name, ffi, functions)
    return attach_callbacks(ffi, lib, functions, driver, driver_results(), cudadefs,
                            trace=tracing())


def boot_runtime(ffi: Any, lib: Any) -> frozenset[str]:
    """Called by the libcudart shim's embedded init: attaches the runtime's callbacks."""
    from vgpu.api import cudartdefs
    from vgpu.api.table import runtime_functions
    from vgpu.shim import runtime

    functions = runtime_functions()
    _check_stub_table(lib.vgpu_runtime_symbol_name, ffi, functions)
    return attach_callbacks(ffi, lib, functions, runtime, runtime_results(), cudartdefs,
                            trace=tracing())


def _check_stub_table(symbol_name: Callable[[int], Any], ffi: Any,
                      functions: Sequence[ApiFunction]) -> None:
    """The compiled stubs and the Python table must number the functions alike; they differ
    when the table was regenerated without rebuilding the shim."""
    for fn in functions:
        compiled = symbol_name(fn.fn_id)
        if compiled == ffi.NULL or ffi.string(compiled).decode() != fn.symbol:
            raise RuntimeError("the built shim does not match the API table in "
                               "vgpu/api/generated/ (regenerated without rebuilding?): "
                               "reinstall vgpu")
    if symbol_name(len(functions)) != ffi.NULL:
        raise RuntimeError("the built shim has more functions than the API table: reinstall vgpu")
