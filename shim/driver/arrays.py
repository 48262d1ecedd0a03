"""CUDA arrays: 1D, 2D, 3D and layered, and the copies to and from them.

An array is device memory holding its texels in rows (no tiling: the emulator reads them as
they lie), described by `state.arrays`; its handle is a vgpu handle, never an address the
program could use. Copies address it by (x in bytes, y, z), as CUDA's do.
"""

from __future__ import annotations

from vgpu.api.cudadefs import CUarray_format

from ._state import CudaArray, CudaError, E, Kind, api, check_out, ffi, handle_of, ptr, state
from .memory import (
    CU_MEMORYTYPE_ARRAY,
    _alloc,
    _check_stream,
    _free,
    copy_rows,
    copy_side,
)

F = CUarray_format
# CUarray_format -> bytes per channel, for the formats textures read.
CHANNEL_BYTES = {F.CU_AD_FORMAT_UNSIGNED_INT8: 1, F.CU_AD_FORMAT_UNSIGNED_INT16: 2,
                 F.CU_AD_FORMAT_UNSIGNED_INT32: 4, F.CU_AD_FORMAT_SIGNED_INT8: 1,
                 F.CU_AD_FORMAT_SIGNED_INT16: 2, F.CU_AD_FORMAT_SIGNED_INT32: 4,
                 F.CU_AD_FORMAT_HALF: 2, F.CU_AD_FORMAT_FLOAT: 4}
CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SURFACE_LDST, CUDA_ARRAY3D_CUBEMAP = 0x01, 0x02, 0x04
CUDA_ARRAY3D_TEXTURE_GATHER = 0x08
_KNOWN_FLAGS = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP \
    | CUDA_ARRAY3D_TEXTURE_GATHER
# The largest arrays, as the emu device reports them (server/backends/device_attributes.py):
# 1D and 2D extents, 3D extents, layered and cubemap extents, layer (and cubemap) counts.
MAX_EXTENT, MAX_3D_EXTENT, MAX_LAYERED_EXTENT, MAX_LAYERS = 65536, 16384, 32768, 2048


def texel_bytes(format_: int, channels: int) -> int:
    if format_ not in CHANNEL_BYTES:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unsupported array format {format_:#x}")
    if channels not in (1, 2, 4):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{channels} channels (CUDA allows 1, 2, 4)")
    return CHANNEL_BYTES[format_] * channels


def create_array(width: int, height: int, depth: int, format_: int, channels: int,
                 flags: int) -> int:
    """A new array's handle (its memory allocated in the current context)."""
    if flags & ~_KNOWN_FLAGS:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown array flags {flags:#x}")
    texel = texel_bytes(format_, channels)
    if flags & CUDA_ARRAY3D_CUBEMAP:  # six square faces, as layers (six per cubemap)
        faces = 6 * MAX_LAYERS if flags & CUDA_ARRAY3D_LAYERED else 6
        fits = width == height <= MAX_LAYERED_EXTENT and depth % 6 == 0 and 0 < depth <= faces
    elif flags & CUDA_ARRAY3D_LAYERED:
        fits = 0 < depth <= MAX_LAYERS and max(width, height) <= MAX_LAYERED_EXTENT
    elif depth:
        fits = height > 0 and max(width, height, depth) <= MAX_3D_EXTENT
    else:
        fits = max(width, height) <= MAX_EXTENT
    if width == 0 or not fits:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"invalid array extent {width}x{height}x{depth} (flags {flags:#x})")
    array = CudaArray(0, format_, channels, width, height, depth, flags, texel)
    array.address = _alloc(array.size)
    handle = state.new_handle(Kind.ARRAY)
    state.arrays[handle] = array
    return handle


def array_of(handle) -> CudaArray:
    return state.arrays[handle_of(handle, Kind.ARRAY, state.arrays)]


@api
def cuArrayCreate_v2(handle, descriptor):
    check_out(handle)
    if descriptor == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the array descriptor is NULL")
    handle[0] = ffi.cast("CUarray", create_array(descriptor.Width, descriptor.Height, 0,
                                                 descriptor.Format, descriptor.NumChannels, 0))


@api
def cuArray3DCreate_v2(handle, descriptor):
    check_out(handle)
    if descriptor == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the array descriptor is NULL")
    handle[0] = ffi.cast("CUarray", create_array(
        descriptor.Width, descriptor.Height, descriptor.Depth, descriptor.Format,
        descriptor.NumChannels, descriptor.Flags))


@api
def cuArrayGetDescriptor_v2(descriptor, handle):
    check_out(descriptor)
    array = array_of(handle)
    descriptor.Width, descriptor.Height = array.width, array.height
    descriptor.Format, descriptor.NumChannels = array.format, array.channels


@api
def cuArray3DGetDescriptor_v2(descriptor, handle):
    check_out(descriptor)
    array = array_of(handle)
    descriptor.Width, descriptor.Height, descriptor.Depth = array.width, array.height, \
        array.depth
    descriptor.Format, descriptor.NumChannels = array.format, array.channels
    descriptor.Flags = array.flags


@api
def cuArrayDestroy(handle):
    array = array_of(handle)
    del state.arrays[ptr(handle)]
    _free(array.address)


# ----------------------------------------------------------------- mipmapped arrays

def create_mipmapped(width: int, height: int, depth: int, format_: int, channels: int,
                     flags: int, levels: int) -> int:
    """A mipmapped array: `levels` arrays, each half the extent of the one before (at least
    1), whose handles cuMipmappedArrayGetLevel hands out."""
    if flags & CUDA_ARRAY3D_LAYERED or flags & CUDA_ARRAY3D_CUBEMAP:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        "layered and cubemap mipmapped arrays are not supported by vgpu")
    if not 0 < levels <= max(width, height, depth, 1).bit_length():
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{levels} mipmap levels for an extent of "
                        f"{width}x{height}x{depth}")
    handles = [create_array(max(width >> k, 1), height and max(height >> k, 1),
                            depth and max(depth >> k, 1), format_, channels, flags)
               for k in range(levels)]
    handle = state.new_handle(Kind.MIPMAP)
    state.mipmaps[handle] = handles
    return handle


def mipmap_levels(handle) -> list[int]:
    return state.mipmaps[handle_of(handle, Kind.MIPMAP, state.mipmaps)]


@api
def cuMipmappedArrayCreate(handle, descriptor, levels):
    check_out(handle)
    if descriptor == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the array descriptor is NULL")
    handle[0] = ffi.cast("CUmipmappedArray", create_mipmapped(
        descriptor.Width, descriptor.Height, descriptor.Depth, descriptor.Format,
        descriptor.NumChannels, descriptor.Flags, levels))


def mipmap_level(handle, level: int) -> int:
    levels = mipmap_levels(handle)
    if not 0 <= level < len(levels):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"level {level} of {len(levels)}")
    return levels[level]


@api
def cuMipmappedArrayGetLevel(level_array, handle, level):
    check_out(level_array)
    level_array[0] = ffi.cast("CUarray", mipmap_level(handle, level))


@api
def cuMipmappedArrayDestroy(handle):
    for level in mipmap_levels(handle):
        cuArrayDestroy.__wrapped__(level)
    del state.mipmaps[ptr(handle)]


# ----------------------------------------------------------------- copies

def _linear(array: CudaArray, offset: int, count: int) -> int:
    if offset + count > array.size:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{offset}+{count} bytes run past the "
                        f"{array.size}-byte CUDA array")
    return array.address + offset


@api
def cuMemcpyHtoA_v2(dst, offset, src, count):
    copy_rows(True, _linear(array_of(dst), offset, count), count, False, ptr(src), count,
              count, 1, queued=False)


@api
def cuMemcpyAtoH_v2(dst, src, offset, count):
    copy_rows(False, ptr(dst), count, True, _linear(array_of(src), offset, count), count,
              count, 1, queued=False)


@api
def cuMemcpyDtoA_v2(dst, offset, src, count):
    copy_rows(True, _linear(array_of(dst), offset, count), count, True, src, count, count, 1,
              queued=False)


@api
def cuMemcpyAtoD_v2(dst, src, offset, count):
    copy_rows(True, dst, count, True, _linear(array_of(src), offset, count), count, count, 1,
              queued=False)


@api
def cuMemcpyAtoA_v2(dst, dst_offset, src, src_offset, count):
    copy_rows(True, _linear(array_of(dst), dst_offset, count), count, True,
              _linear(array_of(src), src_offset, count), count, count, 1, queued=False)


def copy_3d(p, queued: bool) -> None:
    """CUDA_MEMCPY3D."""
    if p == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "CUDA_MEMCPY3D pointer is NULL")
    if p.srcLOD or p.dstLOD:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "mipmap levels are not supported by vgpu")
    copy_3d_sides((p.srcMemoryType, p.srcHost, p.srcDevice, p.srcArray, p.srcXInBytes, p.srcY,
                   p.srcZ, p.srcPitch, p.srcHeight),
                  (p.dstMemoryType, p.dstHost, p.dstDevice, p.dstArray, p.dstXInBytes, p.dstY,
                   p.dstZ, p.dstPitch, p.dstHeight),
                  p.WidthInBytes, p.Height, p.Depth, queued)


def copy_3d_sides(src: tuple, dst: tuple, width: int, height: int, depth: int,
                  queued: bool) -> None:
    """A 3D copy, slice by slice, each a 2D copy. A side is (memory type, host pointer,
    device address, array, x in bytes, y, z, pitch, rows per slice), as CUDA_MEMCPY3D's."""
    height, depth = max(height, 1), max(depth, 1)

    def side(memory_type, host, device, array, x, y, z, pitch, rows):
        pitch = pitch or width
        on_device, start, pitch = copy_side(memory_type, host, device, array, x, y, pitch,
                                            width, height)
        if memory_type == CU_MEMORYTYPE_ARRAY:
            found = array_of(array)
            if z + depth > max(found.depth, 1):
                raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the copy runs past the CUDA array")
            return on_device, start + z * found.slice_pitch, pitch, found.slice_pitch
        slice_bytes = pitch * (rows or height)
        return on_device, start + z * slice_bytes, pitch, slice_bytes

    src_dev, src_start, src_pitch, src_slice = side(*src)
    dst_dev, dst_start, dst_pitch, dst_slice = side(*dst)
    for z in range(depth):
        copy_rows(dst_dev, dst_start + z * dst_slice, dst_pitch, src_dev,
                  src_start + z * src_slice, src_pitch, width, height, queued)


@api
def cuMemcpy3D_v2(p):
    copy_3d(p, queued=False)


@api
def cuMemcpy3DAsync_v2(p, stream):
    _check_stream(stream)
    copy_3d(p, queued=True)
