"""Routes each call of a shim's C stubs to the Python function implementing it.

At boot the dispatcher walks the API table: a symbol is implemented when the implementation
module (vgpu.shim.driver for libcuda, vgpu.shim.runtime for libcudart) has an attribute of
that exact name (`cuMemAlloc_v2`). A stub hands over `void *args[]`, where args[i] points at
its i-th argument; the handler reads each with `ffi.cast("<ctype> *", args[i])[0]`: integers
and enums arrive as ints, pointers and handles as cffi cdata the implementation may write
through, structs passed by value as cdata copies the implementation may keep. It returns the
implementation's int result code; for a function returning something else (`void **`,
`void`, `const char *`), the implementation's return value is written to the stub's result.
Any other symbol returns "not supported" and is named once on stderr. With VGPU_TRACE=1 every
call is printed with its decoded arguments and its result.
"""

from __future__ import annotations

import enum
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TextIO

from vgpu.api.table import ApiFunction, ApiParam

__all__ = ["Dispatcher", "ResultCodes", "boot_driver", "boot_runtime"]

Handler = Callable[[Any, Any], int]


class ResultCodes:
    """An API family's result codes: its C type, its enum, and what the dispatcher reports."""

    def __init__(self, ctype: str, codes: type[enum.IntEnum], not_supported: int,
                 unknown: int):
        self.ctype = ctype
        self.codes = codes
        self.not_supported = int(not_supported)
        self.unknown = int(unknown)

    def name(self, value: int) -> str:
        try:
            return self.codes(value).name
        except ValueError:
            return str(value)


class Dispatcher:
    """fn_id -> handler, built once from the API table and an implementation module."""

    def __init__(self, ffi: Any, functions: Sequence[ApiFunction], implementation: ModuleType,
                 results: ResultCodes, enums: ModuleType, *, trace: bool = False,
                 stream: TextIO | None = None):
        self._ffi = ffi
        self._functions = functions
        self._results = results
        self._enums = enums
        self._stream = stream
        self._reported: set[int] = set()
        self._readers = [tuple(ffi.typeof(ffi.getctype(p.ctype, "*")) for p in fn.params)
                         for fn in functions]
        self.implemented: set[str] = set()
        self._handlers: list[Handler] = [self._handler(fn, implementation)
                                         for fn in functions]
        self.dispatch: Callable[[int, Any, Any], int] = self._traced if trace else self._direct

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(line + "\n")
        stream.flush()

    def _decoder(self, fn: ApiFunction) -> Callable[[Any], list[Any]]:
        ffi = self._ffi
        cast, new = ffi.cast, ffi.new
        readers = self._readers[fn.fn_id]
        by_value = [ffi.typeof(p.ctype).kind in ("struct", "union") for p in fn.params]
        if not any(by_value):
            return lambda args: [cast(reader, args[i])[0] for i, reader in enumerate(readers)]
        # A struct argument lives in the stub's frame; an implementation that keeps it (a
        # launch configuration pushed for later) needs its own copy.
        return lambda args: [new(reader, cast(reader, args[i])[0])[0] if copy
                             else cast(reader, args[i])[0]
                             for i, (reader, copy) in enumerate(zip(readers, by_value,
                                                                    strict=True))]

    def _result_writer(self, fn: ApiFunction) -> Callable[[Any, Any], None] | None:
        """For a function that does not return the result code: stores its return value."""
        if fn.restype in (self._results.ctype, "void"):
            return None
        ffi = self._ffi
        # `char` (cudaInitModule's flag) is written as a number, not a one-byte string.
        restype = "signed char" if fn.restype == "char" else fn.restype
        target = ffi.typeof(ffi.getctype(restype, "*"))
        is_pointer = ffi.typeof(restype).kind == "pointer"

        def write(result: Any, value: Any) -> None:
            if is_pointer and isinstance(value, int):
                value = ffi.cast(restype, value)
            ffi.cast(target, result)[0] = value

        return write

    def _handler(self, fn: ApiFunction, implementation: ModuleType) -> Handler:
        impl = getattr(implementation, fn.symbol, None)
        if not callable(impl):
            return self._not_implemented_handler(fn)
        self.implemented.add(fn.symbol)
        decode = self._decoder(fn)
        write_result = self._result_writer(fn)
        returns_code = fn.restype == self._results.ctype
        unknown, write = self._results.unknown, self._write
        failure = f"returning {self._results.name(unknown)}"

        def call_implementation(args: Any, result: Any) -> int:
            try:
                value = impl(*decode(args))
                if write_result is not None and value is not None:
                    write_result(result, value)
            except Exception:
                write(f"vgpu: {fn.symbol} raised an exception; {failure}\n"
                      f"{traceback.format_exc().rstrip()}")
                return unknown
            if not returns_code:
                return 0
            if not isinstance(value, int):
                write(f"vgpu: {fn.symbol} returned {value!r}, not a result code; {failure}")
                return unknown
            return value

        return call_implementation

    def _not_implemented_handler(self, fn: ApiFunction) -> Handler:
        def not_implemented(args: Any, result: Any) -> int:
            if fn.fn_id not in self._reported:
                self._reported.add(fn.fn_id)
                self._write(f"vgpu: {fn.symbol} is not implemented "
                            f"({self._results.name(self._results.not_supported)})")
            return self._results.not_supported

        return not_implemented

    def _direct(self, fn_id: int, args: Any, result: Any) -> int:
        return self._handlers[fn_id](args, result)

    def _traced(self, fn_id: int, args: Any, result: Any) -> int:
        fn = self._functions[fn_id]
        # Arguments are read before the call: output parameters show where results will go.
        shown = ", ".join(
            f"{param.name}={self._format(param, reader, args[i])}"
            for i, (param, reader) in enumerate(zip(fn.params, self._readers[fn_id],
                                                    strict=True)))
        code = self._handlers[fn_id](args, result)
        if fn.restype == self._results.ctype:
            outcome = self._results.name(code)
        elif fn.restype == "void":
            outcome = "void"
        else:
            value = self._ffi.cast(self._ffi.getctype(fn.restype, "*"), result)[0]
            outcome = _format_value(self._ffi, value, self._enums, None, False)
        self._write(f"vgpu trace: {fn.symbol}({shown}) -> {outcome}")
        return code

    def _format(self, param: ApiParam, reader: Any, arg: Any) -> str:
        value = self._ffi.cast(reader, arg)[0]
        return _format_value(self._ffi, value, self._enums, param.enum,
                             param.ctype.startswith("const char *"))


def _format_value(ffi: Any, value: Any, enums: ModuleType, enum_name: str | None,
                  is_text: bool, depth: int = 0) -> str:
    """A decoded argument as the trace shows it: enums by name, pointers in hex."""
    if isinstance(value, int):
        if enum_name is not None:
            try:
                return getattr(enums, enum_name)(value).name
            except ValueError:
                pass
        return str(value)
    if not isinstance(value, ffi.CData):
        return repr(value)
    ctype = ffi.typeof(value)
    if ctype.kind in ("pointer", "function"):
        address = int(ffi.cast("uintptr_t", value))
        if address == 0:
            return "NULL"
        if is_text:
            return f"{address:#x} {ffi.string(value, 256).decode(errors='replace')!r}"
        return f"{address:#x}"
    if ctype.kind in ("struct", "union"):
        if depth > 0:
            return "{...}"
        fields = ", ".join(
            f"{name}={_format_value(ffi, getattr(value, name), enums, None, False, 1)}"
            for name, _ in ctype.fields if name)
        return f"{{{fields}}}"
    return repr(value)


def _tracing() -> bool:
    return os.environ.get("VGPU_TRACE", "") not in ("", "0")


def _install(ffi: Any, lib: Any, prefix: str, functions: Sequence[ApiFunction],
             implementation: ModuleType, results: ResultCodes, enums: ModuleType) -> Dispatcher:
    _check_stub_table(getattr(lib, f"vgpu_{prefix}_symbol_name"), ffi, functions)
    dispatcher = Dispatcher(ffi, functions, implementation, results, enums, trace=_tracing())
    dispatch = dispatcher.dispatch

    @ffi.def_extern(name="vgpu_py_dispatch", error=results.unknown)
    def vgpu_py_dispatch(fn_id: int, args: Any, result: Any) -> int:
        return dispatch(fn_id, args, result)

    return dispatcher


def boot_driver(ffi: Any, lib: Any) -> Dispatcher:
    """Called by the libcuda shim's embedded init: installs the driver's dispatcher."""
    from vgpu.api import cudadefs
    from vgpu.api.table import driver_functions
    from vgpu.shim import driver

    codes = cudadefs.CUresult
    results = ResultCodes("CUresult", codes, codes.CUDA_ERROR_NOT_SUPPORTED,
                          codes.CUDA_ERROR_UNKNOWN)
    return _install(ffi, lib, "driver", driver_functions(), driver, results, cudadefs)


def boot_runtime(ffi: Any, lib: Any) -> Dispatcher:
    """Called by the libcudart shim's embedded init: installs the runtime's dispatcher."""
    from vgpu.api import cudartdefs
    from vgpu.api.table import runtime_functions
    from vgpu.shim import runtime

    codes = cudartdefs.cudaError
    results = ResultCodes("cudaError_t", codes, codes.cudaErrorNotSupported,
                          codes.cudaErrorUnknown)
    return _install(ffi, lib, "runtime", runtime_functions(), runtime, results, cudartdefs)


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
