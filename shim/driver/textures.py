"""Texture and surface objects over CUDA arrays and linear or pitched device memory.

An object is the device address of a descriptor (vgpu/texture_objects.py) that this module
writes when the program creates it and frees when it is destroyed; kernels pass it to `tex`,
`suld` and `sust`, which the emulator executes by reading the descriptor.
"""

from __future__ import annotations

from vgpu.api.cudadefs import CUarray_format, CUresourcetype
from vgpu.texture_objects import (
    LEVEL,
    SURFACE_MAGIC,
    TEXTURE_MAGIC,
    ChannelKind,
    Descriptor,
)

from ._state import CudaError, E, api, check_out, ffi, state
from .arrays import (
    CUDA_ARRAY3D_CUBEMAP,
    CUDA_ARRAY3D_LAYERED,
    CUDA_ARRAY3D_SURFACE_LDST,
    array_of,
    mipmap_levels,
    texel_bytes,
)
from .memory import _alloc, _free, _htod

F = CUarray_format
_CHANNEL_KINDS = {F.CU_AD_FORMAT_UNSIGNED_INT8: ChannelKind.UNSIGNED,
                  F.CU_AD_FORMAT_UNSIGNED_INT16: ChannelKind.UNSIGNED,
                  F.CU_AD_FORMAT_UNSIGNED_INT32: ChannelKind.UNSIGNED,
                  F.CU_AD_FORMAT_SIGNED_INT8: ChannelKind.SIGNED,
                  F.CU_AD_FORMAT_SIGNED_INT16: ChannelKind.SIGNED,
                  F.CU_AD_FORMAT_SIGNED_INT32: ChannelKind.SIGNED,
                  F.CU_AD_FORMAT_HALF: ChannelKind.FLOAT, F.CU_AD_FORMAT_FLOAT: ChannelKind.FLOAT}
CU_TRSF_READ_AS_INTEGER, CU_TRSF_NORMALIZED_COORDINATES, CU_TRSF_SRGB = 0x01, 0x02, 0x10
_IGNORED_FLAGS = 0x20 | 0x40  # trilinear optimisation off, seamless cubemaps: no effect here
R = CUresourcetype
# texture objects over mipmapped arrays -> their level tables (device memory)
_level_tables: dict[int, int] = {}


def array_resource(handle) -> dict:
    """Descriptor fields of a CUDA array (`handle` a CUarray or cudaArray_t), with its format
    and whether surfaces may use it."""
    array = array_of(handle)
    cubemap = bool(array.flags & CUDA_ARRAY3D_CUBEMAP)
    layered = bool(array.flags & CUDA_ARRAY3D_LAYERED) or cubemap  # faces are layers
    dims = 1 if array.height == 0 else 3 if array.depth and not layered else 2
    return dict(base=array.address, dims=dims, layered=layered, width=array.width,
                height=max(array.height, 1), depth=max(array.depth, 1) if dims == 3 else 1,
                layers=array.depth if layered else 1, pitch=array.pitch,
                slice_pitch=array.slice_pitch, format=array.format, channels=array.channels,
                cubemap=cubemap, surface=bool(array.flags & CUDA_ARRAY3D_SURFACE_LDST))


def linear_resource(address: int, format_: int, channels: int, size: int) -> dict:
    texel = texel_bytes(format_, channels)
    state.check_device_range(address, size)
    if size < texel:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the linear resource holds no texel")
    return dict(base=address, dims=1, layered=False, width=size // texel, height=1, depth=1,
                layers=1, pitch=size, slice_pitch=size, format=format_, channels=channels,
                cubemap=False, surface=False)


def pitch2d_resource(address: int, format_: int, channels: int, width: int, height: int,
                     pitch: int) -> dict:
    texel = texel_bytes(format_, channels)
    if width == 0 or height == 0 or pitch < width * texel:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "invalid pitch2D resource")
    state.check_device_range(address, pitch * height)
    return dict(base=address, dims=2, layered=False, width=width, height=height, depth=1,
                layers=1, pitch=pitch, slice_pitch=pitch * height, format=format_,
                channels=channels, cubemap=False, surface=False)


def _resource(desc) -> dict:
    """The memory and shape a CUDA_RESOURCE_DESC names, as Descriptor fields."""
    if desc == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the resource descriptor is NULL")
    if desc.resType == R.CU_RESOURCE_TYPE_ARRAY:
        return array_resource(desc.res.array.hArray)
    if desc.resType == R.CU_RESOURCE_TYPE_LINEAR:
        linear = desc.res.linear
        return linear_resource(linear.devPtr, linear.format, linear.numChannels,
                               linear.sizeInBytes)
    if desc.resType == R.CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
        return mipmapped_resource(desc.res.mipmap.hMipmappedArray)
    if desc.resType == R.CU_RESOURCE_TYPE_PITCH2D:
        pitched = desc.res.pitch2D
        return pitch2d_resource(pitched.devPtr, pitched.format, pitched.numChannels,
                                pitched.width, pitched.height, pitched.pitchInBytes)
    raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown resource type {desc.resType}")


def _descriptor(magic: bytes, resource: dict, **sampling) -> Descriptor:
    format_ = resource.pop("format")
    resource.pop("surface")
    return Descriptor(magic=magic, channel_kind=_CHANNEL_KINDS[format_],
                      channel_bits=texel_bytes(format_, 1) * 8, **resource, **sampling)


def _place(data: bytes) -> int:
    """`data` written to a new device allocation: a descriptor (the object's value) or a
    mipmap level table."""
    address = _alloc(len(data))
    source = ffi.from_buffer(data)
    _htod(address, int(ffi.cast("uintptr_t", source)), len(data), queued=False)
    return address


def mipmapped_resource(handle) -> dict:
    """Descriptor fields of a mipmapped array: its level 0, and the records of its levels
    (which a texture object writes to device memory, and frees with itself)."""
    levels = [array_of(level) for level in mipmap_levels(handle)]
    resource = array_resource(mipmap_levels(handle)[0])
    resource["level_records"] = b"".join(
        LEVEL.pack(a.address, a.pitch, a.slice_pitch, a.width, max(a.height, 1),
                   max(a.depth, 1)) for a in levels)
    return resource


def _sampling(tex) -> dict:
    if tex == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the texture descriptor is NULL")
    flags = tex.flags & ~_IGNORED_FLAGS
    if flags & CU_TRSF_SRGB:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "sRGB textures are not supported by vgpu")
    if flags & ~(CU_TRSF_READ_AS_INTEGER | CU_TRSF_NORMALIZED_COORDINATES):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown texture flags {tex.flags:#x}")
    return sampling(tuple(int(tex.addressMode[k]) for k in range(3)), tex.filterMode,
                    bool(flags & CU_TRSF_READ_AS_INTEGER),
                    bool(flags & CU_TRSF_NORMALIZED_COORDINATES),
                    tuple(float(tex.borderColor[k]) for k in range(4)), tex.mipmapFilterMode,
                    (tex.mipmapLevelBias, tex.minMipmapLevelClamp, tex.maxMipmapLevelClamp))


def sampling(address_modes: tuple, filter_mode: int, read_as_integer: bool,
             normalized_coords: bool, border: tuple, mip_filter_mode: int = 0,
             levels: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> dict:
    """Descriptor fields of a texture's sampling (CUDA's enum values in both APIs); `levels`
    is the mipmap level bias and the smallest and largest level."""
    if any(m not in (0, 1, 2, 3) for m in address_modes) or filter_mode not in (0, 1) \
            or mip_filter_mode not in (0, 1):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "invalid address or filter mode")
    return dict(address_modes=address_modes, linear_filter=filter_mode == 1,
                read_as_integer=read_as_integer, normalized_coords=normalized_coords,
                border=border, mip_linear=mip_filter_mode == 1, level_bias=levels[0],
                min_level=levels[1], max_level=levels[2])


def texture_object(resource: dict, sampled: dict, kept) -> int:
    """A new texture object; `kept` is what its Get*Desc calls answer with."""
    integer = _CHANNEL_KINDS[resource["format"]] != ChannelKind.FLOAT
    if sampled["linear_filter"] and integer and sampled["read_as_integer"]:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        "linear filtering of integer texels read as integers")
    records = resource.pop("level_records", b"")
    if records:
        resource.update(level_table=_place(records), levels=len(records) // LEVEL.size)
    handle = _place(_descriptor(TEXTURE_MAGIC, resource, **sampled).pack())
    state.texture_objects[handle] = kept
    if records:
        _level_tables[handle] = resource["level_table"]
    return handle


def surface_object(resource: dict, kept) -> int:
    if not resource["surface"] or "level_records" in resource:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a surface needs a CUDA array created "
                        "with the surface load/store flag")
    handle = _place(_descriptor(SURFACE_MAGIC, resource).pack())
    state.surface_objects[handle] = kept
    return handle


def destroy_texture(handle: int) -> None:
    _destroy(state.texture_objects, handle, "texture")


def destroy_surface(handle: int) -> None:
    _destroy(state.surface_objects, handle, "surface")


def _destroy(table: dict, handle: int, what: str) -> None:
    kept(table, handle, what)
    del table[handle]
    _free(handle)
    if handle in _level_tables:
        _free(_level_tables.pop(handle))


@api
def cuTexObjectCreate(handle, res_desc, tex_desc, view_desc):
    check_out(handle)
    if view_desc != ffi.NULL:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "resource views are not supported by vgpu")
    resource, sampled = _resource(res_desc), _sampling(tex_desc)
    handle[0] = texture_object(resource, sampled, (
        ffi.new("CUDA_RESOURCE_DESC *", res_desc[0]),
        ffi.new("CUDA_TEXTURE_DESC *", tex_desc[0])))


@api
def cuTexObjectDestroy(handle):
    destroy_texture(int(handle))


def kept(table: dict, handle: int, what: str) -> tuple:
    """The descriptions a live object was created from."""
    if handle not in table:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"0x{handle:x} is not a live {what} object")
    return table[handle]


@api
def cuTexObjectGetResourceDesc(res_desc, handle):
    check_out(res_desc)
    res_desc[0] = kept(state.texture_objects, int(handle), "texture")[0][0]


@api
def cuTexObjectGetTextureDesc(tex_desc, handle):
    check_out(tex_desc)
    tex_desc[0] = kept(state.texture_objects, int(handle), "texture")[1][0]


@api
def cuSurfObjectCreate(handle, res_desc):
    check_out(handle)
    resource = _resource(res_desc)
    if res_desc.resType != R.CU_RESOURCE_TYPE_ARRAY:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a surface needs a CUDA array")
    handle[0] = surface_object(resource, (ffi.new("CUDA_RESOURCE_DESC *", res_desc[0]),))


@api
def cuSurfObjectDestroy(handle):
    destroy_surface(int(handle))


@api
def cuSurfObjectGetResourceDesc(res_desc, handle):
    check_out(res_desc)
    res_desc[0] = kept(state.surface_objects, int(handle), "surface")[0][0]
