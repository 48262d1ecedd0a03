"""Journal format, checkpoint/restore, migration and record/replay.

`vgpu.replay.image` stores checkpoint images (a session's state and the contents of its
memory) on disk: see README.md in this folder for the format.
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
