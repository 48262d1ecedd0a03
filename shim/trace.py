"""VGPU_TRACE=1: every call through a shim printed with its decoded arguments and result."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vgpu.api.table import ApiFunction

__all__ = ["format_value", "traced", "tracing"]


def tracing() -> bool:
    return os.environ.get("VGPU_TRACE", "") not in ("", "0")


def traced(ffi: Any, fn: ApiFunction, call: Callable[..., Any], enums: ModuleType,
           write: Callable[[str], None], outcome: Callable[[Any], tuple[Any, str]],
           failed: Callable[..., Any]) -> Callable[..., Any]:
    """`call`, printing each call as `vgpu trace: f(a=1, ...) -> result`. `outcome(value)`
    gives the value C gets and its text; an exception goes to `failed(*exc_info)`, which
    reports it and gives the value to answer instead."""
    shown_params = [(param.name, param.enum, param.ctype.startswith("const char *"))
                    for param in fn.params]

    def traced_call(*args: Any) -> Any:
        # Arguments are shown before the call: output parameters show where results will go.
        shown = ", ".join(f"{name}={format_value(ffi, arg, enums, enum_name, is_text)}"
                          for (name, enum_name, is_text), arg in zip(shown_params, args,
                                                                     strict=True))
        try:
            value = call(*args)
        except Exception:
            value = failed(*sys.exc_info())
        value, text = outcome(value)
        write(f"vgpu trace: {fn.symbol}({shown}) -> {text}")
        return value

    return traced_call


def format_value(ffi: Any, value: Any, enums: ModuleType | None, enum_name: str | None,
                 is_text: bool, depth: int = 0) -> str:
    """A decoded argument or result as the trace shows it: enums by name, pointers in hex."""
    if isinstance(value, int):
        if enum_name is not None and enums is not None:
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
            f"{name}={format_value(ffi, getattr(value, name), enums, None, False, 1)}"
            for name, _ in ctype.fields if name)
        return f"{{{fields}}}"
    return repr(value)
