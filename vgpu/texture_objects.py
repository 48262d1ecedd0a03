"""Texture and surface objects as vgpu represents them: a descriptor in device memory.

A CUDA texture or surface object is an opaque 64-bit value that a kernel passes to `tex`,
`suld` and `sust`. vgpu makes it the device address of a small allocation holding this
descriptor (written by the driver shim when the object is created): the emulator reads it
when a kernel samples, so objects need nothing from the server beyond device memory, and
they survive checkpoints and migration like every allocation. The texels themselves are
ordinary device memory too: a CUDA array is an allocation with its rows `pitch` bytes apart
and its slices (3D depth or layers) `slice_pitch` bytes apart.

Both the shim (in the application) and the emulator (in the server) read this module: it
imports only the standard library.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["DESCRIPTOR_SIZE", "LEVEL", "SURFACE_MAGIC", "TEXTURE_MAGIC", "ChannelKind",
           "Descriptor", "ADDRESS_WRAP", "ADDRESS_CLAMP", "ADDRESS_MIRROR", "ADDRESS_BORDER"]

TEXTURE_MAGIC = b"VTX1"
SURFACE_MAGIC = b"VSF1"
# CUaddress_mode's values.
ADDRESS_WRAP, ADDRESS_CLAMP, ADDRESS_MIRROR, ADDRESS_BORDER = 0, 1, 2, 3

# magic; dims, layered, channel kind, channel bits, channels, linear filter, read as integer,
# normalized coordinates, three address modes, cubemap; base, pitch, slice pitch; width,
# height, depth, layers; border colour; mipmaps: the level table's address, the level count,
# linear filtering between levels, level bias, smallest and largest level.
_LAYOUT = struct.Struct("<4s12BQQQIIII4fQIB3f")
DESCRIPTOR_SIZE = _LAYOUT.size
# One level of a mipmapped array: base, pitch, slice pitch, width, height, depth.
LEVEL = struct.Struct("<QQQIII")


class ChannelKind:
    UNSIGNED, SIGNED, FLOAT = 0, 1, 2


@dataclass(frozen=True)
class Descriptor:
    magic: bytes  # TEXTURE_MAGIC or SURFACE_MAGIC
    base: int  # device address of texel (0, 0, 0) of layer 0
    dims: int  # 1, 2 or 3
    layered: bool
    width: int
    height: int  # 1 for 1D
    depth: int  # 1 unless 3D
    layers: int  # 1 unless layered
    pitch: int  # bytes from one row to the next
    slice_pitch: int  # bytes from one 3D slice, or one layer, to the next
    channel_kind: int  # a ChannelKind
    channel_bits: int  # 8, 16 or 32 (16-bit floats are CUDA's half)
    channels: int  # 1, 2 or 4
    address_modes: tuple[int, int, int] = (ADDRESS_CLAMP,) * 3
    linear_filter: bool = False
    read_as_integer: bool = False  # integer texels read as integers, not normalized floats
    normalized_coords: bool = False
    border: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    # Six square faces as layers (+x, -x, +y, -y, +z, -z; with `layered`, six per cubemap).
    cubemap: bool = False
    # Mipmaps: `levels` LEVEL records at `level_table` (level 0 is the fields above).
    level_table: int = 0
    levels: int = 1
    mip_linear: bool = False
    level_bias: float = 0.0
    min_level: float = 0.0
    max_level: float = 0.0

    @property
    def texel_bytes(self) -> int:
        return self.channel_bits // 8 * self.channels

    def pack(self) -> bytes:
        return _LAYOUT.pack(self.magic, self.dims, self.layered, self.channel_kind,
                            self.channel_bits, self.channels, self.linear_filter,
                            self.read_as_integer, self.normalized_coords, *self.address_modes,
                            self.cubemap, self.base, self.pitch, self.slice_pitch, self.width,
                            self.height, self.depth, self.layers, *self.border,
                            self.level_table, self.levels, self.mip_linear, self.level_bias,
                            self.min_level, self.max_level)

    @classmethod
    def unpack(cls, data: bytes) -> Descriptor | None:
        """The descriptor in `data`, or None if it is not one."""
        if len(data) < DESCRIPTOR_SIZE:
            return None
        (magic, dims, layered, kind, bits, channels, linear, as_integer, normalized, a0, a1,
         a2, cubemap, base, pitch, slice_pitch, width, height, depth, layers, b0, b1, b2, b3,
         level_table, levels, mip_linear, bias, min_level, max_level) = \
            _LAYOUT.unpack_from(data)
        if magic not in (TEXTURE_MAGIC, SURFACE_MAGIC):
            return None
        return cls(magic, base, dims, bool(layered), width, height, depth, layers, pitch,
                   slice_pitch, kind, bits, channels, (a0, a1, a2), bool(linear),
                   bool(as_integer), bool(normalized), (b0, b1, b2, b3), bool(cubemap),
                   level_table, levels, bool(mip_linear), bias, min_level, max_level)
