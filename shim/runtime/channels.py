"""Channel format descriptions of textures and CUDA arrays: host arithmetic that needs no
device (`cudaCreateChannelDesc`). `cudaGetChannelDesc`, which reads an array's description,
is with the arrays (textures.py)."""

from __future__ import annotations

__all__ = ["cudaCreateChannelDesc"]


def cudaCreateChannelDesc(x, y, z, w, f):
    # cffi converts a dict into the C struct the function returns by value.
    return {"x": x, "y": y, "z": z, "w": w, "f": f}
