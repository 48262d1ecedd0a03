"""Enums made on first use, for the generated enum modules (cudadefs, cudartdefs).

Making all of their IntEnums at import (114 from cuda.h, 100 from the runtime's headers) cost
18 ms of every CUDA program's start; a program uses a handful.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

__all__ = ["lazy_enums"]


def lazy_enums(namespace: dict, members: dict[str, tuple[tuple[str, int], ...]],
               aliases: dict[str, str]) -> tuple[Callable, Callable]:
    """The `__getattr__` and `__dir__` (PEP 562) of the module whose globals are `namespace`:
    `members` maps each enum's name to its (member, value) pairs, `aliases` other names of
    an enum to its own. An enum is made on its first access and kept in the module;
    setdefault keeps one class per enum even when two threads race to make it."""
    module = namespace["__name__"]

    def __getattr__(name: str):
        canonical = aliases.get(name, name)
        values = members.get(canonical)
        if values is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        made = namespace.get(canonical)
        if made is None:
            made = namespace.setdefault(canonical,
                                        enum.IntEnum(canonical, values, module=module))
        namespace[name] = made
        return made

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return __getattr__, __dir__
