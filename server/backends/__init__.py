"""Backends execute a session's device work; all of them follow one interface, `Backend`.

`open_backend(name)` picks one: `emu` (PTX on the CPU), `cuda` (a physical GPU through
cuda-python), or `auto` (cuda when a CUDA driver and a GPU are usable, else emu); with
`own_process`, the backend runs in a device process of its own (isolated.py).
"""

from __future__ import annotations

from .base import Backend, DeviceDescription, LoadedModule

__all__ = ["Backend", "DeviceDescription", "LoadedModule", "open_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("auto", "emu", "cuda")


def open_backend(name: str, own_process: bool = False) -> Backend:
    """A fresh backend instance for one session."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if own_process:
        from .isolated import IsolatedBackend

        return IsolatedBackend(resolve_backend(name))
    if name in ("cuda", "auto"):
        from .cuda import CudaBackend, cuda_usable

        # Without a usable driver, `cuda` fails with _load_driver's one-line RuntimeError.
        if name == "cuda" or cuda_usable():
            return CudaBackend()
    from .emu import EmuBackend

    return EmuBackend()


def resolve_backend(name: str) -> str:
    """The backend `name` stands for here: `auto` is cuda or emu."""
    if name == "auto":
        from .cuda import cuda_usable

        return "cuda" if cuda_usable() else "emu"
    return name
