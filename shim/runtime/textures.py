"""CUDA arrays, texture objects and surface objects, on the driver layer's (arrays.py and
textures.py there): a cudaArray_t is the driver's CUarray, a texture or surface object the
same descriptor address. Channel descriptions become CUarray formats here."""

from __future__ import annotations

from vgpu.api.cudadefs import CUarray_format

from ..driver import arrays as driver_arrays
from ..driver import textures as driver_textures
from ..driver.memory import (
    CU_MEMORYTYPE_ARRAY,
    CU_MEMORYTYPE_DEVICE,
    CU_MEMORYTYPE_HOST,
    _check_stream,
)
from ._state import CudaError, E, api, check_out, driver_state, ffi, ptr, set_pointer
from .memory import _sides

__all__ = [
    "cudaMallocArray", "cudaMalloc3DArray", "cudaFreeArray", "cudaArrayGetInfo",
    "cudaGetChannelDesc", "cudaMallocMipmappedArray", "cudaGetMipmappedArrayLevel",
    "cudaFreeMipmappedArray", "cudaMemcpy2DToArray", "cudaMemcpy2DToArrayAsync",
    "cudaMemcpy2DFromArray", "cudaMemcpy2DFromArrayAsync", "cudaMemcpyToArray",
    "cudaMemcpyFromArray", "cudaMemcpy3D", "cudaMemcpy3DAsync", "cudaCreateTextureObject",
    "cudaDestroyTextureObject", "cudaGetTextureObjectResourceDesc",
    "cudaGetTextureObjectTextureDesc", "cudaCreateSurfaceObject", "cudaDestroySurfaceObject",
]

F = CUarray_format
SIGNED, UNSIGNED, FLOAT = 0, 1, 2  # cudaChannelFormatKind
_FORMATS = {(SIGNED, 8): F.CU_AD_FORMAT_SIGNED_INT8, (SIGNED, 16): F.CU_AD_FORMAT_SIGNED_INT16,
            (SIGNED, 32): F.CU_AD_FORMAT_SIGNED_INT32,
            (UNSIGNED, 8): F.CU_AD_FORMAT_UNSIGNED_INT8,
            (UNSIGNED, 16): F.CU_AD_FORMAT_UNSIGNED_INT16,
            (UNSIGNED, 32): F.CU_AD_FORMAT_UNSIGNED_INT32, (FLOAT, 16): F.CU_AD_FORMAT_HALF,
            (FLOAT, 32): F.CU_AD_FORMAT_FLOAT}
_KINDS = {value: key for key, value in _FORMATS.items()}
cudaResourceTypeArray, cudaResourceTypeMipmappedArray = 0, 1
cudaResourceTypeLinear, cudaResourceTypePitch2D = 2, 3
cudaReadModeElementType = 0


def _format_at(pointer) -> tuple[int, int]:
    if pointer == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "the channel description is NULL")
    return _format(pointer[0])


def _format(desc) -> tuple[int, int]:
    """(CUarray format, channels) of a cudaChannelFormatDesc."""
    bits = [desc.x, desc.y, desc.z, desc.w]
    channels = sum(1 for b in bits if b)
    if channels not in (1, 2, 4) or any(b != bits[0] for b in bits[:channels]) \
            or any(bits[channels:]) or (desc.f, bits[0]) not in _FORMATS:
        raise CudaError(E.cudaErrorInvalidChannelDescriptor,
                        f"unsupported channel description {bits} of kind {desc.f}")
    return _FORMATS[(desc.f, bits[0])], channels


def _array(array):
    try:
        return driver_arrays.array_of(array)
    except CudaError:
        raise CudaError(E.cudaErrorInvalidResourceHandle, "not a live CUDA array") from None


@api
def cudaMallocArray(array, desc, width, height, flags):
    check_out(array)
    format_, channels = _format_at(desc)
    set_pointer(array, driver_arrays.create_array(width, height, 0, format_, channels, flags))


@api
def cudaMalloc3DArray(array, desc, extent, flags):
    check_out(array)
    format_, channels = _format_at(desc)
    set_pointer(array, driver_arrays.create_array(extent.width, extent.height, extent.depth,
                                                  format_, channels, flags))


@api
def cudaFreeArray(array):
    if ptr(array):
        _array(array)
        driver_arrays.cuArrayDestroy.__wrapped__(array)


def _describe(desc, found) -> None:
    kind, bits = _KINDS[found.format]
    desc.x = bits
    desc.y = bits if found.channels > 1 else 0
    desc.z = desc.w = bits if found.channels > 2 else 0
    desc.f = kind


@api
def cudaArrayGetInfo(desc, extent, flags, array):
    found = _array(array)
    if desc != ffi.NULL:
        _describe(desc, found)
    if extent != ffi.NULL:
        extent.width, extent.height, extent.depth = found.width, found.height, found.depth
    if flags != ffi.NULL:
        flags[0] = found.flags


@api
def cudaGetChannelDesc(desc, array):
    check_out(desc)
    _describe(desc, _array(array))


@api
def cudaMallocMipmappedArray(mipmapped, desc, extent, levels, flags):
    check_out(mipmapped)
    format_, channels = _format_at(desc)
    set_pointer(mipmapped, driver_arrays.create_mipmapped(
        extent.width, extent.height, extent.depth, format_, channels, flags, levels))


def _levels(mipmapped) -> list[int]:
    try:
        return driver_arrays.mipmap_levels(mipmapped)
    except CudaError:
        raise CudaError(E.cudaErrorInvalidResourceHandle,
                        "not a live mipmapped array") from None


@api
def cudaGetMipmappedArrayLevel(level_array, mipmapped, level):
    check_out(level_array)
    _levels(mipmapped)
    set_pointer(level_array, driver_arrays.mipmap_level(mipmapped, level))


@api
def cudaFreeMipmappedArray(mipmapped):
    if ptr(mipmapped):
        _levels(mipmapped)
        driver_arrays.cuMipmappedArrayDestroy.__wrapped__(mipmapped)


# ----------------------------------------------------------------- copies

def _pointer_side(address: int, on_device: bool, x: int, y: int, z: int, pitch: int,
                  rows: int) -> tuple:
    kind = CU_MEMORYTYPE_DEVICE if on_device else CU_MEMORYTYPE_HOST
    return (kind, address, address, 0, x, y, z, pitch, rows)


def _array_side(array, x_bytes: int, y: int, z: int = 0) -> tuple:
    _array(array)
    return (CU_MEMORYTYPE_ARRAY, 0, 0, array, x_bytes, y, z, 0, 0)


def _to_array(dst, w_offset, h_offset, src, src_pitch, width, height, kind, queued):
    _, src_dev = _sides(kind, 0, ptr(src))
    driver_arrays.copy_3d_sides(_pointer_side(ptr(src), src_dev, 0, 0, 0, src_pitch, height),
                                _array_side(dst, w_offset, h_offset), width, height, 1, queued)


def _from_array(dst, dst_pitch, src, w_offset, h_offset, width, height, kind, queued):
    dst_dev, _ = _sides(kind, ptr(dst), 0)
    driver_arrays.copy_3d_sides(_array_side(src, w_offset, h_offset),
                                _pointer_side(ptr(dst), dst_dev, 0, 0, 0, dst_pitch, height),
                                width, height, 1, queued)


@api
def cudaMemcpy2DToArray(dst, w_offset, h_offset, src, src_pitch, width, height, kind):
    _to_array(dst, w_offset, h_offset, src, src_pitch, width, height, kind, False)


@api
def cudaMemcpy2DToArrayAsync(dst, w_offset, h_offset, src, src_pitch, width, height, kind,
                             stream):
    _check_stream(stream)
    _to_array(dst, w_offset, h_offset, src, src_pitch, width, height, kind, True)


@api
def cudaMemcpy2DFromArray(dst, dst_pitch, src, w_offset, h_offset, width, height, kind):
    _from_array(dst, dst_pitch, src, w_offset, h_offset, width, height, kind, False)


@api
def cudaMemcpy2DFromArrayAsync(dst, dst_pitch, src, w_offset, h_offset, width, height, kind,
                               stream):
    _check_stream(stream)
    _from_array(dst, dst_pitch, src, w_offset, h_offset, width, height, kind, True)


@api
def cudaMemcpyToArray(dst, w_offset, h_offset, src, count, kind):
    """Deprecated: `count` bytes from (w_offset, h_offset) on, through the array's rows."""
    found = _array(dst)
    _, src_dev = _sides(kind, 0, ptr(src))
    start = found.address + h_offset * found.pitch + w_offset
    driver_arrays._linear(found, start - found.address, count)
    driver_arrays.copy_rows(True, start, count, src_dev, ptr(src), count, count, 1, False)


@api
def cudaMemcpyFromArray(dst, src, w_offset, h_offset, count, kind):
    found = _array(src)
    dst_dev, _ = _sides(kind, ptr(dst), 0)
    start = found.address + h_offset * found.pitch + w_offset
    driver_arrays._linear(found, start - found.address, count)
    driver_arrays.copy_rows(dst_dev, ptr(dst), count, True, start, count, count, 1, False)


def _copy_3d(p, queued: bool) -> None:
    """cudaMemcpy3DParms: positions and extent count array elements when an array takes
    part (bytes otherwise)."""
    if p == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "cudaMemcpy3DParms pointer is NULL")
    src_array, dst_array = ptr(p.srcArray), ptr(p.dstArray)
    element = _array(p.srcArray if src_array else p.dstArray).texel_bytes \
        if src_array or dst_array else 1
    dst_dev, src_dev = _sides(p.kind, ptr(p.dstPtr.ptr), ptr(p.srcPtr.ptr))

    def side(array, pos, pitched, on_device):
        if ptr(array):
            return _array_side(array, pos.x * element, pos.y, pos.z)
        return _pointer_side(ptr(pitched.ptr), on_device, pos.x * element, pos.y, pos.z,
                             pitched.pitch, pitched.ysize)
    driver_arrays.copy_3d_sides(side(p.srcArray, p.srcPos, p.srcPtr, src_dev),
                                side(p.dstArray, p.dstPos, p.dstPtr, dst_dev),
                                p.extent.width * element, p.extent.height, p.extent.depth,
                                queued)


@api
def cudaMemcpy3D(p):
    _copy_3d(p, False)


@api
def cudaMemcpy3DAsync(p, stream):
    _check_stream(stream)
    _copy_3d(p, True)


# ----------------------------------------------------------------- texture and surface objects

def _resource(desc) -> dict:
    if desc == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "the resource description is NULL")
    if desc.resType == cudaResourceTypeArray:
        _array(desc.res.array.array)
        return driver_textures.array_resource(desc.res.array.array)
    if desc.resType == cudaResourceTypeMipmappedArray:
        _levels(desc.res.mipmap.mipmap)
        return driver_textures.mipmapped_resource(desc.res.mipmap.mipmap)
    if desc.resType == cudaResourceTypeLinear:
        linear = desc.res.linear
        return driver_textures.linear_resource(ptr(linear.devPtr), *_format(linear.desc),
                                               linear.sizeInBytes)
    if desc.resType == cudaResourceTypePitch2D:
        pitched = desc.res.pitch2D
        return driver_textures.pitch2d_resource(
            ptr(pitched.devPtr), *_format(pitched.desc), pitched.width,
            pitched.height, pitched.pitchInBytes)
    raise CudaError(E.cudaErrorInvalidValue, f"unknown resource type {desc.resType}")


@api
def cudaCreateTextureObject(handle, res_desc, tex_desc, view_desc):
    check_out(handle)
    if view_desc != ffi.NULL:
        raise CudaError(E.cudaErrorNotSupported, "resource views are not supported by vgpu")
    if tex_desc == ffi.NULL:
        raise CudaError(E.cudaErrorInvalidValue, "the texture description is NULL")
    if tex_desc.sRGB:
        raise CudaError(E.cudaErrorNotSupported, "sRGB textures are not supported by vgpu")
    resource = _resource(res_desc)
    sampled = driver_textures.sampling(
        tuple(int(tex_desc.addressMode[k]) for k in range(3)), tex_desc.filterMode,
        tex_desc.readMode == cudaReadModeElementType, bool(tex_desc.normalizedCoords),
        tuple(float(tex_desc.borderColor[k]) for k in range(4)), tex_desc.mipmapFilterMode,
        (tex_desc.mipmapLevelBias, tex_desc.minMipmapLevelClamp, tex_desc.maxMipmapLevelClamp))
    handle[0] = driver_textures.texture_object(resource, sampled,
                                               (_saved(res_desc), _saved(tex_desc)))


@api
def cudaDestroyTextureObject(handle):
    driver_textures.destroy_texture(int(handle))


def _saved(pointer) -> bytes:
    """A description's bytes, which the Get*Desc calls copy back (the structs are the
    runtime's types, which the driver layer's cffi module does not declare)."""
    return ffi.buffer(pointer, ffi.sizeof(pointer[0]))[:]


def _restore(pointer, saved: bytes) -> None:
    check_out(pointer)
    ffi.memmove(pointer, saved, len(saved))


def _texture(handle) -> tuple:
    return driver_textures.kept(driver_state.texture_objects, int(handle), "texture")


@api
def cudaGetTextureObjectResourceDesc(res_desc, handle):
    _restore(res_desc, _texture(handle)[0])


@api
def cudaGetTextureObjectTextureDesc(tex_desc, handle):
    _restore(tex_desc, _texture(handle)[1])


@api
def cudaCreateSurfaceObject(handle, res_desc):
    check_out(handle)
    resource = _resource(res_desc)
    if res_desc.resType != cudaResourceTypeArray:
        raise CudaError(E.cudaErrorInvalidValue, "a surface needs a CUDA array")
    handle[0] = driver_textures.surface_object(resource, (_saved(res_desc),))


@api
def cudaDestroySurfaceObject(handle):
    driver_textures.destroy_surface(int(handle))
