"""The declarative API table: every function a shim exports, as typed records.

The data is generated from NVIDIA's headers (vgpu/api/generated/, see gen_driver_table.py);
this module gives it names. A function's `fn_id` is its index in the table, and the shim's
compiled symbol table (`vgpu_driver_symbol_name(fn_id)`) numbers its symbols alike. The C stub
of symbol S calls the cffi callback named CALLBACK_PREFIX + S (see render_c.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from vgpu.api.generated import driver_table, runtime_table
from vgpu.api.proc_address import ProcAddressEntry

__all__ = ["ApiParam", "ApiFunction", "CALLBACK_PREFIX", "ProcAddressEntry", "driver_functions",
           "driver_proc_address", "runtime_functions"]

# Shared by the generator of the C stubs and the dispatcher that attaches their callbacks.
CALLBACK_PREFIX = "vgpu_py_"


@dataclass(frozen=True, slots=True)
class ApiParam:
    """`ctype` as C writes it without the name (`const char *`); `enum`: the cudadefs
    IntEnum the type names (through typedef aliases), if any."""

    ctype: str
    name: str
    enum: str | None


@dataclass(frozen=True, slots=True)
class ApiFunction:
    fn_id: int
    symbol: str       # the exported name: cuMemAlloc_v2
    base: str         # the name in the documentation and cuGetProcAddress: cuMemAlloc
    restype: str
    params: tuple[ApiParam, ...]


def _functions(rows: tuple) -> tuple[ApiFunction, ...]:
    return tuple(
        ApiFunction(fn_id, symbol, base, restype, tuple(ApiParam(*param) for param in params))
        for fn_id, (symbol, base, restype, params) in enumerate(rows))


@cache
def driver_functions() -> tuple[ApiFunction, ...]:
    """Every symbol libcuda.so.1 exports, indexed by fn_id."""
    return _functions(driver_table.FUNCTIONS)


@cache
def runtime_functions() -> tuple[ApiFunction, ...]:
    """Every symbol libcudart.so.13 exports (NVIDIA's set), indexed by fn_id."""
    return _functions(runtime_table.FUNCTIONS)


@cache
def driver_proc_address() -> tuple[ProcAddressEntry, ...]:
    return tuple(ProcAddressEntry(*entry) for entry in driver_table.PROC_ADDRESS)
