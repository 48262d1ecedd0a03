"""Texture fetches and surface loads and stores: tex (1d, 2d, 3d, a1d, a2d, cube, acube;
.level and .grad on mipmaps), tld4 (2d, a2d), txq and suq (sizes and sampling), suld.b,
sust.b.

Texture and surface objects are device addresses of descriptors that the driver shim wrote
(vgpu/texture_objects.py); the texels are device memory, read and written through the same
checked accesses as `ld`/`st`. Sampling follows CUDA's texture unit:
- coordinates are texel-space, or multiplied by the size when normalized; point filtering
  takes the texel under the coordinate, linear filtering blends the 2, 4 or 8 nearest texel
  centres with weights kept to 8 fractional bits, as the hardware's 1.8 fixed point does;
- address modes per dimension: clamp, border (the border colour), and with normalized
  coordinates wrap and mirror (which CUDA treats as clamp otherwise); layers are clamped;
- integer texels read as normalized floats ([0, 1] unsigned, [-1, 1] signed) unless the
  object reads them as integers; a texel's missing channels read as 0, alpha as 1.
Surface coordinates are bytes in x and rows/slices in y and z; an access outside the surface
traps (700, the memory checker's message) by default, reads zero and is dropped with `.zero`,
or is clamped to the edge with `.clamp`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vgpu.texture_objects import (
    ADDRESS_BORDER,
    ADDRESS_CLAMP,
    ADDRESS_MIRROR,
    ADDRESS_WRAP,
    DESCRIPTOR_SIZE,
    LEVEL,
    SURFACE_MAGIC,
    TEXTURE_MAGIC,
    ChannelKind,
    Descriptor,
)

from .errors import CUDA_ERROR_ILLEGAL_ADDRESS, IllegalAddress
from .ir import Address, RegisterOperand, Vector
from .isa import CompileContext, Modifiers, opcode
from .memory import load_elements
from .operands import reader, writer
from .ptx_types import TYPES
from .spaces import load, store
from .state import Fault, lane_count

__all__: list[str] = []

# geometry -> (dimensions, layered)
_GEOMETRIES = {"1d": (1, False), "2d": (2, False), "3d": (3, False), "a1d": (1, True),
               "a2d": (2, True)}
_CHANNEL_DTYPES = {(ChannelKind.UNSIGNED, 8): np.uint8, (ChannelKind.UNSIGNED, 16): np.uint16,
                   (ChannelKind.UNSIGNED, 32): np.uint32, (ChannelKind.SIGNED, 8): np.int8,
                   (ChannelKind.SIGNED, 16): np.int16, (ChannelKind.SIGNED, 32): np.int32,
                   (ChannelKind.FLOAT, 16): np.float16, (ChannelKind.FLOAT, 32): np.float32}
_WEIGHT_STEPS = 256.0  # linear filtering weights: 8 fractional bits


def _handle_and_coordinates(ctx: CompileContext, operand, count: int, coordinate_type):
    """Readers of the object handle and of the first `count` coordinates of `[h, {...}]`
    (`coordinate_type` a PtxType, or a list of one per coordinate)."""
    if not isinstance(operand, Address) or operand.coordinates is None:
        raise ctx.error("expected [handle, {coordinates}]")
    if not isinstance(operand.base, RegisterOperand) or operand.offset:
        raise ctx.unsupported("texture and surface references (only objects are supported)")
    elements = operand.coordinates.elements
    if len(elements) < count:
        raise ctx.error(f"expected {count} coordinates, got {len(elements)}")
    types = coordinate_type if isinstance(coordinate_type, list) else [coordinate_type] * count
    return (reader(operand.base, TYPES["u64"], ctx),
            [reader(e, t, ctx) for e, t in zip(elements, types, strict=False)])


def _descriptors(state, lanes, handles: np.ndarray, magic: bytes, what: str):
    """(descriptor, positions) for each distinct handle among the lanes; a handle that is
    not a live object of the right kind faults like an illegal address."""
    uniform = len(handles) and (handles == handles[0]).all()  # the usual case, found fast
    for handle in (handles[:1] if uniform else np.unique(handles)):
        positions = np.arange(len(handles)) if uniform else np.flatnonzero(handles == handle)
        try:
            descriptor = Descriptor.unpack(state.ctx.memory.read(int(handle), DESCRIPTOR_SIZE))
        except IllegalAddress:
            descriptor = None
        if descriptor is None or descriptor.magic != magic:
            lane = int(positions[0]) if lanes is None else int(lanes[positions[0]])
            raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, f"Invalid {what} object 0x{int(handle):x}",
                        f"it is not a live {what} object", lane)
        yield descriptor, positions


def _sub_lanes(lanes, positions):
    return positions if lanes is None else lanes[positions]


def _broadcast(values, count: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(values), (count,))


# ----------------------------------------------------------------- texture fetches

def _address(desc: Descriptor, axis: int, index: np.ndarray, size: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """Texel indices after the axis's address mode, and which fall outside (border)."""
    mode = desc.address_modes[axis]
    if desc.normalized_coords and mode == ADDRESS_WRAP:
        return np.mod(index, size), np.zeros(index.shape, bool)
    if desc.normalized_coords and mode == ADDRESS_MIRROR:
        folded = np.mod(index, 2 * size)
        return np.where(folded < size, folded, 2 * size - 1 - folded), np.zeros(index.shape,
                                                                                 bool)
    outside = (index < 0) | (index >= size)
    if mode == ADDRESS_BORDER:
        return np.clip(index, 0, size - 1), outside
    return np.clip(index, 0, size - 1), np.zeros(index.shape, bool)


def _texel_memory(state, lanes, desc: Descriptor) -> np.ndarray:
    """The bytes of every texel of the object, checked once: the addressing above keeps each
    fetch inside them, so the lanes' fetches need no check of their own."""
    size = desc.slice_pitch * max(desc.depth, desc.layers)
    try:
        return np.frombuffer(state.ctx.memory.view(desc.base, size, writing=False), np.uint8)
    except IllegalAddress:
        lane = 0 if lanes is None else int(lanes[0])
        raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, f"Invalid texture fetch from 0x{desc.base:x}",
                    f"the object's {size} bytes of texels are not a live allocation",
                    lane) from None


def _texels(state, lanes, desc: Descriptor, indices: list[np.ndarray], layer, as_float: bool
            ) -> np.ndarray:
    """The texels at integer `indices` (one array per dimension), as (n, 4) float64 (read
    mode applied) or int64 values, the border colour where the address mode says so."""
    sizes = (desc.width, desc.height, desc.depth)
    offset = np.zeros(len(indices[0]), np.uint64)
    border = np.zeros(len(indices[0]), bool)
    strides = (desc.texel_bytes, desc.pitch, desc.slice_pitch)
    for axis, index in enumerate(indices):
        clamped, outside = _address(desc, axis, index, sizes[axis])
        border |= outside
        offset += clamped.astype(np.uint64) * np.uint64(strides[axis])
    if layer is not None:
        offset += np.clip(layer, 0, desc.layers - 1).astype(np.uint64) * np.uint64(
            desc.slice_pitch)
    dtype = np.dtype(_CHANNEL_DTYPES[(desc.channel_kind, desc.channel_bits)])
    raw = load_elements(_texel_memory(state, lanes, desc), offset, dtype, desc.channels)
    raw = raw.reshape(len(offset), desc.channels)
    if as_float:
        values = raw.astype(np.float64)
        if desc.channel_kind != ChannelKind.FLOAT and not desc.read_as_integer:
            top = float(np.iinfo(dtype).max)
            values = np.maximum(values / top, -1.0)
        out = np.zeros((len(offset), 4), np.float64)
        out[:, 3] = 1.0
    else:
        values = raw.astype(np.int64)
        out = np.zeros((len(offset), 4), np.int64)
        out[:, 3] = 1
    out[:, :desc.channels] = values
    if border.any():
        out[border] = np.asarray(desc.border, out.dtype)
    return out


def _sample(state, lanes, desc: Descriptor, coords: list[np.ndarray], layer, integer_coords,
            as_float: bool) -> np.ndarray:
    if integer_coords:
        return _texels(state, lanes, desc, [c.astype(np.int64) for c in coords], layer,
                       as_float)
    sizes = (desc.width, desc.height, desc.depth)
    scaled = [c.astype(np.float64) * (sizes[axis] if desc.normalized_coords else 1.0)
              for axis, c in enumerate(coords)]
    if not (desc.linear_filter and as_float):  # objects filter integers by point only
        return _texels(state, lanes, desc, [np.floor(s).astype(np.int64) for s in scaled],
                       layer, as_float)
    lower = [np.floor(s - 0.5) for s in scaled]
    weight = [np.round((s - 0.5 - lo) * _WEIGHT_STEPS) / _WEIGHT_STEPS
              for s, lo in zip(scaled, lower, strict=True)]
    # All 2, 4 or 8 corners fetched at once: corner k's lanes are the k-th block of n.
    n, corners = len(coords[0]), 1 << len(coords)
    factors = np.ones((corners, n), np.float64)
    indices = [np.empty(corners * n, np.int64) for _ in coords]
    for corner in range(corners):
        for axis in range(len(coords)):
            upper = (corner >> axis) & 1
            indices[axis][corner * n:(corner + 1) * n] = lower[axis].astype(np.int64) + upper
            factors[corner] *= weight[axis] if upper else 1.0 - weight[axis]
    texels = _texels(state, lanes, desc, indices, None if layer is None else np.tile(
        layer, corners), True).reshape(corners, n, 4)
    return (factors[:, :, None] * texels).sum(axis=0)


def _cube_faces(x: np.ndarray, y: np.ndarray, z: np.ndarray):
    """(face, u, v) of direction vectors, as CUDA's cubemap fetch picks them: the face of the
    largest component, (u, v) normalized on it (the programming guide's cubemap table)."""
    ax, ay, az = np.abs(x), np.abs(y), np.abs(z)
    on_x = (ax >= ay) & (ax >= az)
    on_y = ~on_x & (ay >= az)
    on_z = ~on_x & ~on_y
    face = np.where(on_x, np.where(x >= 0, 0, 1), np.where(on_y, np.where(y >= 0, 2, 3),
                                                            np.where(z >= 0, 4, 5)))
    s = np.select([on_x & (x >= 0), on_x, on_z & (z < 0)], [-z, z, -x], x)
    t = np.select([on_y & (y >= 0), on_y], [z, -z], -y)
    m = np.maximum(np.where(on_x, ax, np.where(on_y, ay, az)), np.finfo(np.float64).tiny)
    return face, (s / m + 1) / 2, (t / m + 1) / 2


def _sample_cube(state, lanes, desc: Descriptor, coords, layer, as_float: bool):
    if not desc.cubemap:
        lane = 0 if lanes is None else int(lanes[0])
        raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, "Invalid cubemap fetch",
                    "the texture object is not over a cubemap array", lane)
    face, u, v = _cube_faces(*(c.astype(np.float64) for c in coords[:3]))
    faces = face if layer is None else face + 6 * layer.astype(np.int64)
    on_faces = replace(desc, normalized_coords=True, address_modes=(ADDRESS_CLAMP,) * 3)
    return _sample(state, lanes, on_faces, [u, v], faces, False, as_float)


def _level_descriptor(state, lanes, desc: Descriptor, level: int) -> Descriptor:
    """The descriptor of one mipmap level (level 0 is the object's own)."""
    if level == 0:
        return desc
    try:
        record = state.ctx.memory.read(desc.level_table + level * LEVEL.size, LEVEL.size)
    except IllegalAddress:
        lane = 0 if lanes is None else int(lanes[0])
        raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS, "Invalid mipmapped texture fetch",
                    "the object's level table is not a live allocation", lane) from None
    base, pitch, slice_pitch, width, height, depth = LEVEL.unpack(record)
    return replace(desc, base=base, pitch=pitch, slice_pitch=slice_pitch, width=width,
                   height=height, depth=depth)


def _sample_lod(state, lanes, desc: Descriptor, coords, layer, lod, as_float: bool):
    """Sampling at a level of detail per lane: the nearest level, or a blend of the two
    around it (weights kept to 8 fractional bits, as within a level)."""
    lod = np.clip(lod.astype(np.float64) + desc.level_bias, desc.min_level, desc.max_level)
    lod = np.clip(lod, 0, desc.levels - 1)
    if desc.mip_linear and as_float:  # integer reads take the nearest level
        low = np.floor(lod).astype(np.int64)
        weight = np.round((lod - low) * _WEIGHT_STEPS) / _WEIGHT_STEPS
        picks = [(low, 1.0 - weight), (np.minimum(low + 1, desc.levels - 1), weight)]
    else:
        picks = [(np.floor(lod + 0.5).astype(np.int64), np.ones(len(lod)))]
    out = np.zeros((len(lod), 4), np.float64 if as_float else np.int64)
    for levels, weights in picks:
        for level in np.unique(levels):
            at = np.flatnonzero(levels == level)
            sub = at if lanes is None else lanes[at]
            values = _sample(state, sub, _level_descriptor(state, sub, desc, int(level)),
                             [c[at] for c in coords], None if layer is None else layer[at],
                             False, as_float)
            out[at] += values * weights[at, None] if as_float else values
    return out


def _gradient_lod(desc: Descriptor, dx: list[np.ndarray], dy: list[np.ndarray]) -> np.ndarray:
    """log2 of the longer gradient in texels: the level tex.grad samples."""
    sizes = (desc.width, desc.height, desc.depth)
    scale = [1.0 if not desc.normalized_coords else float(sizes[k]) for k in range(len(dx))]
    length = np.maximum(np.sqrt(sum((d.astype(np.float64) * f) ** 2
                                    for d, f in zip(dx, scale, strict=True))),
                        np.sqrt(sum((d.astype(np.float64) * f) ** 2
                                    for d, f in zip(dy, scale, strict=True))))
    with np.errstate(divide="ignore"):
        return np.log2(np.maximum(length, np.finfo(np.float64).tiny))


@opcode("tex")
def _tex(instr, ctx: CompileContext):
    mods = Modifiers(ctx)
    if mods.take("cube", "acube"):
        return _tex_cube(instr, ctx, mods, "acube" in instr.modifiers)
    detail = mods.take("level", "grad")
    geometry = mods.take(*_GEOMETRIES)
    if geometry is None:
        raise ctx.unsupported("only 1d, 2d, 3d, a1d, a2d, cube and acube textures are "
                              "supported")
    if not mods.has("v4"):
        raise ctx.unsupported("only .v4 fetches are supported")
    if len(mods.types) != 2:
        raise ctx.error("expected a destination and a coordinate type")
    dtype, ctype = mods.types
    mods.done()
    if dtype.name not in ("f32", "s32", "u32") or ctype.name not in ("f32", "s32"):
        raise ctx.unsupported(f"types .{dtype.name}.{ctype.name}")
    ctx.operand_count({None: 2, "level": 3, "grad": 4}[detail])
    dims, layered = _GEOMETRIES[geometry]
    types = ([TYPES["s32"]] if layered else []) + [ctype] * dims
    read_handle, reads = _handle_and_coordinates(ctx, instr.operands[1], len(types), types)
    as_float = dtype.name == "f32"
    integer_coords = ctype.name == "s32"
    if detail is None:
        def sample(state, lanes, desc, coords, layer):
            return _sample(state, lanes, desc, coords, layer, integer_coords, as_float)
        return _fetch_op(ctx, instr, dtype, read_handle, reads, layered, sample)
    if integer_coords:
        raise ctx.error(f"tex.{detail} takes .f32 coordinates")
    # The level of detail (or the gradients) ride along as extra per-lane coordinates.
    if detail == "level":
        extra = [reader(instr.operands[2], TYPES["f32"], ctx)]
    else:
        gradients = instr.operands[2:]
        if not all(isinstance(g, Vector) and len(g.elements) >= dims for g in gradients):
            raise ctx.error(f"expected two gradient vectors of {dims} elements")
        extra = [reader(e, TYPES["f32"], ctx) for g in gradients for e in g.elements[:dims]]

    def sample_detail(state, lanes, desc, values, layer):
        coords, rest = values[:dims], values[dims:]
        lod = rest[0] if detail == "level" else _gradient_lod(desc, rest[:dims], rest[dims:])
        return _sample_lod(state, lanes, desc, coords, layer, lod, as_float)
    return _fetch_op(ctx, instr, dtype, read_handle, reads + extra, layered, sample_detail)


def _float_fetch_operands(instr, ctx: CompileContext, mods: Modifiers, layered: bool,
                          count: int):
    """(destination type, handle reader, readers of the layer and `count` coordinates) of a
    .v4 fetch from .f32 coordinates (tld4, cubemaps)."""
    if not mods.has("v4") or len(mods.types) != 2 or mods.types[1].name != "f32":
        raise ctx.unsupported("only .v4 fetches from .f32 coordinates are supported")
    dtype = mods.types[0]
    mods.done()
    if dtype.name not in ("f32", "s32", "u32"):
        raise ctx.unsupported(f"destination type .{dtype.name}")
    ctx.operand_count(2)
    types = ([TYPES["s32"]] if layered else []) + [TYPES["f32"]] * count
    return (dtype, *_handle_and_coordinates(ctx, instr.operands[1], len(types), types))


def _tex_cube(instr, ctx: CompileContext, mods: Modifiers, layered: bool):
    dtype, read_handle, reads = _float_fetch_operands(instr, ctx, mods, layered, 3)
    as_float = dtype.name == "f32"

    def sample(state, lanes, desc, coords, layer):
        return _sample_cube(state, lanes, desc, coords, layer, as_float)
    return _fetch_op(ctx, instr, dtype, read_handle, reads, layered, sample)


def _fetch_op(ctx: CompileContext, instr, dtype, read_handle, reads, layered: bool, sample):
    """The op of a fetch into four `dtype` destinations: per distinct object, `sample(state,
    lanes, descriptor, coordinates, layer or None)` gives the (n, 4) values of its lanes."""
    if not isinstance(instr.operands[0], Vector) or len(instr.operands[0].elements) != 4:
        raise ctx.error("expected four destinations")
    writes = [writer(d, dtype, ctx) for d in instr.operands[0].elements]
    as_float = dtype.name == "f32"

    def run(state, lanes):
        count = lane_count(state, lanes)
        handles = _broadcast(read_handle(state, lanes), count)
        values = [_broadcast(r(state, lanes), count) for r in reads]
        layer, coords = (values[0], values[1:]) if layered else (None, values)
        out = np.zeros((count, 4), np.float64 if as_float else np.int64)
        for desc, positions in _descriptors(state, lanes, handles, TEXTURE_MAGIC, "texture"):
            out[positions] = sample(state, _sub_lanes(lanes, positions), desc,
                                    [c[positions] for c in coords],
                                    None if layer is None else layer[positions])
        result = out.astype(dtype.dtype) if as_float else out.astype(np.uint32).view(
            dtype.dtype)
        for k, write in enumerate(writes):
            write(state, lanes, result[:, k])
    return ctx.op(run)


_GATHER_CORNERS = ((0, 1), (1, 1), (1, 0), (0, 0))  # (dx, dy) of d.x, d.y, d.z, d.w
_COMPONENTS = {"r": 0, "g": 1, "b": 2, "a": 3}


@opcode("tld4")
def _tld4(instr, ctx: CompileContext):
    """tex2Dgather: one component of the four texels bilinear filtering would blend, in the
    order (x0, y1), (x1, y1), (x1, y0), (x0, y0)."""
    mods = Modifiers(ctx)
    component = mods.take(*_COMPONENTS)
    geometry = mods.take("2d", "a2d")
    if component is None or geometry is None:
        raise ctx.unsupported("only tld4.{r,g,b,a}.2d/.a2d is supported")
    layered = geometry == "a2d"
    dtype, read_handle, reads = _float_fetch_operands(instr, ctx, mods, layered, 2)
    as_float, channel = dtype.name == "f32", _COMPONENTS[component]

    def sample(state, lanes, desc, coords, layer):
        sizes = (desc.width, desc.height)
        lower = [np.floor(c.astype(np.float64) * (sizes[axis] if desc.normalized_coords
                                                  else 1.0) - 0.5).astype(np.int64)
                 for axis, c in enumerate(coords)]
        out = np.zeros((len(lower[0]), 4), np.float64 if as_float else np.int64)
        for k, (dx, dy) in enumerate(_GATHER_CORNERS):
            out[:, k] = _texels(state, lanes, desc, [lower[0] + dx, lower[1] + dy], layer,
                                as_float)[:, channel]
        return out
    return _fetch_op(ctx, instr, dtype, read_handle, reads, layered, sample)


# ----------------------------------------------------------------- queries

_TEXTURE_QUERIES = {
    "width": lambda d: d.width, "height": lambda d: d.height, "depth": lambda d: d.depth,
    "normalized_coords": lambda d: int(d.normalized_coords),
    "filter_mode": lambda d: int(d.linear_filter), "array_size": lambda d: d.layers,
    "addr_mode_0": lambda d: d.address_modes[0], "addr_mode_1": lambda d: d.address_modes[1],
    "addr_mode_2": lambda d: d.address_modes[2],
}
_SURFACE_QUERIES = {"width": lambda d: d.width, "height": lambda d: d.height,
                    "depth": lambda d: d.depth, "array_size": lambda d: d.layers}


def _query(instr, ctx: CompileContext, queries: dict, magic: bytes, what: str):
    mods = Modifiers(ctx)
    attribute = mods.take(*queries)
    if attribute is None:
        raise ctx.unsupported(f"only the {', '.join(queries)} queries are supported")
    ptype = mods.type({"b32"})
    mods.done()
    ctx.operand_count(2)
    write = writer(instr.operands[0], ptype, ctx)
    address = instr.operands[1]
    if not isinstance(address, Address) or not isinstance(address.base, RegisterOperand) \
            or address.offset or address.coordinates is not None:
        raise ctx.unsupported("only queries of objects ([handle]) are supported")
    read_handle = reader(address.base, TYPES["u64"], ctx)
    answer = queries[attribute]

    def run(state, lanes):
        count = lane_count(state, lanes)
        handles = _broadcast(read_handle(state, lanes), count)
        out = np.zeros(count, np.uint32)
        for desc, positions in _descriptors(state, lanes, handles, magic, what):
            out[positions] = answer(desc)
        write(state, lanes, out)
    return ctx.op(run)


@opcode("txq")
def _txq(instr, ctx: CompileContext):
    return _query(instr, ctx, _TEXTURE_QUERIES, TEXTURE_MAGIC, "texture")


@opcode("suq")
def _suq(instr, ctx: CompileContext):
    return _query(instr, ctx, _SURFACE_QUERIES, SURFACE_MAGIC, "surface")


# ----------------------------------------------------------------- surfaces

_CLAMP_MODES = ("trap", "clamp", "zero")


def _surface_offsets(state, lanes, desc: Descriptor, coords: list[np.ndarray], layer,
                     size: int, mode: str, access: str):
    """Byte offsets of each lane's access, and which lanes are inside the surface."""
    limits = (desc.width * desc.texel_bytes, desc.height, desc.depth)
    inside = np.ones(len(coords[0]), bool)
    offset = np.zeros(len(coords[0]), np.int64)
    strides = (1, desc.pitch, desc.slice_pitch)
    for axis, coord in enumerate(coords):
        coord = coord.astype(np.int64)
        limit = limits[axis] - (size - 1 if axis == 0 else 0)
        ok = (coord >= 0) & (coord < limit)
        if mode == "clamp":
            coord = np.clip(coord, 0, limit - 1)
        else:
            inside &= ok
        offset += coord * strides[axis]
    if layer is not None:
        layer = layer.astype(np.int64)
        ok = (layer >= 0) & (layer < desc.layers)
        inside &= ok | (mode == "clamp")
        offset += np.clip(layer, 0, desc.layers - 1) * desc.slice_pitch
    if mode == "trap" and not inside.all():
        k = int(np.flatnonzero(~inside)[0])
        lane = k if lanes is None else int(lanes[k])
        raise Fault(CUDA_ERROR_ILLEGAL_ADDRESS,
                    f"Invalid surface {access} of size {size} at x={int(coords[0][k])} bytes",
                    "the coordinates are outside the surface", lane)
    return np.where(inside, offset, 0).astype(np.uint64), inside


def _surface_instruction(instr, ctx: CompileContext, loading: bool):
    mods = Modifiers(ctx)
    if not mods.has("b"):
        raise ctx.unsupported("only .b (byte-addressed) surface accesses are supported")
    geometry = mods.take(*_GEOMETRIES)
    if geometry is None:
        raise ctx.unsupported("only 1d, 2d, 3d, a1d and a2d surfaces are supported")
    width = mods.take("v2", "v4")
    count = int(width[1:]) if width else 1
    mode = mods.take(*_CLAMP_MODES) or "trap"
    ptype = mods.type({"b8", "b16", "b32", "b64"})
    mods.done()
    ctx.operand_count(2)
    dims, layered = _GEOMETRIES[geometry]
    values_operand, address_operand = instr.operands if loading else instr.operands[::-1]
    elements = values_operand.elements if isinstance(values_operand, Vector) else [
        values_operand]
    if len(elements) != count:
        raise ctx.error(f"expected {count} value(s)")
    types = ([TYPES["s32"]] if layered else []) + [TYPES["s32"]] * dims
    read_handle, reads = _handle_and_coordinates(ctx, address_operand, len(types), types)
    size = ptype.nbytes * count
    element = np.dtype(f"u{ptype.nbytes}")
    if loading:
        writes = [writer(e, ptype, ctx) for e in elements]
    else:
        value_reads = [reader(e, ptype, ctx) for e in elements]

    def run(state, lanes):
        n = lane_count(state, lanes)
        handles = _broadcast(read_handle(state, lanes), n)
        values = [_broadcast(r(state, lanes), n) for r in reads]
        layer, coords = (values[0], values[1:]) if layered else (None, values)
        access = "read" if loading else "write"
        if loading:
            out = np.zeros((n, count), element)
        else:
            data = np.stack([_broadcast(r(state, lanes), n).view(element) for r in value_reads],
                            axis=1)
        for desc, positions in _descriptors(state, lanes, handles, SURFACE_MAGIC, "surface"):
            sub = _sub_lanes(lanes, positions)
            offsets, inside = _surface_offsets(
                state, sub, desc, [c[positions] for c in coords],
                None if layer is None else layer[positions], size, mode, access)
            chosen = positions[inside]
            if not chosen.size:
                continue
            addrs = np.uint64(desc.base) + offsets[inside]
            chosen_lanes = _sub_lanes(lanes, chosen)
            if loading:
                out[chosen] = load(state, "global", addrs, element, count,
                                   chosen_lanes).reshape(-1, count)
            else:
                store(state, "global", addrs, data[chosen] if count > 1 else data[chosen, 0],
                      chosen_lanes)
        if loading:
            for k, write in enumerate(writes):
                write(state, lanes, out[:, k].view(ptype.dtype))
    return ctx.op(run)


@opcode("suld")
def _suld(instr, ctx: CompileContext):
    return _surface_instruction(instr, ctx, loading=True)


@opcode("sust")
def _sust(instr, ctx: CompileContext):
    return _surface_instruction(instr, ctx, loading=False)
