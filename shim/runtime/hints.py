"""Performance hints of the runtime API (stream attributes such as access-policy windows,
resetting persisting L2 lines): the driver layer's (shim/driver/hints.py), whose value
layouts are the same."""

from __future__ import annotations

from ..driver import hints as driver_hints
from ._state import api

__all__ = ["cudaStreamSetAttribute", "cudaStreamGetAttribute", "cudaStreamCopyAttributes",
           "cudaCtxResetPersistingL2Cache"]


@api
def cudaStreamSetAttribute(stream, attr, value):
    driver_hints.cuStreamSetAttribute.__wrapped__(stream, attr, value)


@api
def cudaStreamGetAttribute(stream, attr, value_out):
    driver_hints.cuStreamGetAttribute.__wrapped__(stream, attr, value_out)


@api
def cudaStreamCopyAttributes(dst, src):
    driver_hints.cuStreamCopyAttributes.__wrapped__(dst, src)


@api
def cudaCtxResetPersistingL2Cache():
    driver_hints.cuCtxResetPersistingL2Cache.__wrapped__()
