"""Backends execute a session's device work; all of them follow one interface, `Backend`.

`open_backend(name)` picks one: `emu` (PTX on the CPU), `cuda` (a physical GPU through
cuda-python; not built yet), or `auto` (cuda when a GPU is usable, else emu: today, emu).
"""

from __future__ import annotations

from .base import Backend, DeviceDescription, LoadedModule

__all__ = ["Backend", "DeviceDescription", "LoadedModule", "open_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("auto", "emu", "cuda")


def open_backend(name: str) -> Backend:
    """A fresh backend instance for one session."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "cuda":
        # The physical-GPU backend is its own piece of work (a later issue); say so plainly.
        raise RuntimeError("the cuda backend is not available in this version of vgpu; "
                           "use --backend emu (or auto)")
    from .emu import EmuBackend

    return EmuBackend()
