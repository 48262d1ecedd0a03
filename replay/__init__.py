"""A session's state as data: its journal, and checkpoint images of it.

`vgpu.replay.journal` keeps a session's live objects, each with what it takes to make it
again; `vgpu.replay.image` stores checkpoint images (the journal, the session's own state
and the contents of its memory) on disk, `vgpu.replay.trace` traces (a session's calls, to
run again) and `vgpu.replay.replayer` runs them again: see README.md in this folder for
the formats.
"""

from .image import (
    CHUNK_BYTES,
    FORMAT_VERSION,
    Image,
    ImageError,
    WriteStats,
    chunk_digests,
    read_image,
    write_image,
)

__all__ = [
    "CHUNK_BYTES", "FORMAT_VERSION", "Image", "ImageError", "WriteStats", "chunk_digests",
    "read_image", "write_image",
]
