"""What stands between a cffi callback and an implementation when C's types ask for more than a
plain call (see dispatch.py): one thin Python frame, only for the functions that need it.

- A struct passed by value is copied: cffi passes it as a view of the C caller's frame, gone
  once the call returns, and an implementation may keep it (a launch configuration pushed for
  later).
- A `void` function's result is dropped (cffi wants None; an implementation may return
  anything).
- A result other than the result code: None is C's zero; a pointer result may be an int, or
  any cdata pointer (which the implementation keeps alive).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = ["adapt", "zero_of"]


def zero_of(ffi: Any, ctype: Any) -> Any:
    """C's zero of `ctype`, as a value cffi converts back to it."""
    if ctype.kind == "void":
        return None
    if ctype.kind == "pointer":
        return ffi.NULL
    if ctype.kind in ("struct", "union"):
        return ffi.new(ffi.getctype(ctype, "*"))[0]
    return 0


def adapt(ffi: Any, ctype: Any, impl: Callable[..., Any], *,
          returns_code: bool) -> Callable[..., Any]:
    """`impl` made callable by cffi as a callback of the function type `ctype`."""
    structs = tuple(index for index, arg in enumerate(ctype.args)
                    if arg.kind in ("struct", "union"))
    kind = ctype.result.kind
    result = "code" if returns_code else kind if kind in ("void", "pointer") else "value"
    if not structs and result == "code":
        return impl
    pointer_types = [ffi.typeof(ffi.getctype(ctype.args[index], "*")) for index in structs]
    make = _adapter_maker(len(ctype.args), structs, result)
    return make(impl, ffi.new, ffi.cast, ctype.result, zero_of(ffi, ctype.result),
                *pointer_types)


_RESULTS = {
    "code": "return impl({args})",
    "void": "impl({args})",
    "pointer": "value = impl({args})\n"
               "        return zero if value is None else cast(result, value)",
    "value": "value = impl({args})\n"
             "        return zero if value is None else value",
}


@cache
def _adapter_maker(arity: int, structs: tuple[int, ...], result: str) -> Callable[..., Any]:
    """A factory of adapters of one shape, compiled once per shape (about ten in all). Written
    out with the exact arity, an adapter costs about 170 ns less per call than one taking
    *args and copying in a loop (measured: 6 arguments, 2 structs), on the `<<<>>>` path."""
    args = ", ".join(f"new(t{i}, a{i})[0]" if i in structs else f"a{i}" for i in range(arity))
    source = (f"def make(impl, new, cast, result, zero{''.join(f', t{i}' for i in structs)}):\n"
              f"    def adapter({', '.join(f'a{i}' for i in range(arity))}):\n"
              f"        {_RESULTS[result].format(args=args)}\n"
              f"    return adapter\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<vgpu adapter: {arity} arguments, structs at {structs}, {result}>",
                 "exec"), namespace)
    return namespace["make"]
