"""Compiled `tex` (1d 2d 3d a1d a2d, .v4 into f32/s32/u32, f32 or s32 coordinates) on texture
objects of every texel format the interpreter reads (8/16/32-bit integers, half, float; 1, 2
or 4 channels): the interpreter's sampling (ops_texture.py) in LLVM IR, step for step in
float64 so that the results are its bits: coordinates scaled by the size when normalized,
point filtering's floor, linear filtering's corners with weights rounded (half to even) to 8
fractional bits and blended corner by corner in the interpreter's order, the address modes
(wrap and mirror with normalized coordinates, clamp, border), integers read as normalized
floats unless the object reads them as integers, missing channels 0 and alpha 1, and NaNs
chosen as numpy's operations give them. `sample` branches elsewhere when the object is
anything else (a handle that is no live texture object, texels outside memory): the caller
then samples through the callback, which also raises the interpreter's faults.
"""

from __future__ import annotations

import struct

from llvmlite import ir

from vgpu.texture_objects import (
    ADDRESS_BORDER,
    ADDRESS_MIRROR,
    ADDRESS_WRAP,
    DESCRIPTOR_SIZE,
    TEXTURE_MAGIC,
    ChannelKind,
)

from .codegen import F32, F64, I1, I8, I32, I64, P8, intrinsic

__all__ = ["descriptor", "field", "sample"]

# Byte offsets of the descriptor's fields (texture_objects._LAYOUT: "<4s12BQQQIIII4f...").
_KIND, _BITS, _CHANNELS, _LINEAR, _AS_INTEGER, _NORMALIZED, _MODES = 6, 7, 8, 9, 10, 11, 12
_BASE, _PITCH, _SLICE = 16, 24, 32
_SIZES, _LAYERS, _BORDER = 40, 52, 56
_WEIGHT_STEPS = 256.0
_INT64_MIN = -(1 << 63)


def descriptor(c, handle, magic: bytes, otherwise):
    """A host pointer to the object descriptor at `handle`, the code going on where it is
    readable and starts with `magic`, and to `otherwise` where not."""
    pointer = c.global_or_null(handle, DESCRIPTOR_SIZE)
    b = c.b
    read = c.fn.append_basic_block("object_descriptor")
    b.cbranch(b.icmp_unsigned("!=", pointer, ir.Constant(P8, None)), read, otherwise)
    b.position_at_end(read)
    valid = c.fn.append_basic_block("object_valid")
    b.cbranch(b.icmp_unsigned("==", field(b, pointer, 0, I32),
                              ir.Constant(I32, struct.unpack("<I", magic)[0])), valid, otherwise)
    b.position_at_end(valid)
    return pointer


def field(b, pointer, offset: int, ty):
    return b.load(b.bitcast(b.gep(pointer, [ir.Constant(I64, offset)]), ty.as_pointer()),
                  align=1)


def _to_int(b, value):
    """numpy's float64 -> int64 cast on x86: INT64_MIN where out of range or NaN."""
    inside = b.fcmp_ordered("<", b.call(intrinsic(b.module, "llvm.fabs", F64), [value]),
                            ir.Constant(F64, 2.0 ** 63))
    return b.select(inside, b.fptosi(value, I64), ir.Constant(I64, _INT64_MIN))


def _address(b, index, size, mode, normalized):
    """(texel index after the axis's address mode, whether it reads the border colour)."""
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)

    def floor_mod(value, modulus):
        rest = b.srem(value, modulus)
        return b.select(b.icmp_signed("<", rest, zero), b.add(rest, modulus), rest)
    wrapped = floor_mod(index, size)
    twice = b.add(size, size)
    folded = floor_mod(index, twice)
    mirrored = b.select(b.icmp_signed("<", folded, size), folded,
                        b.sub(b.sub(twice, one), folded))
    clamped = b.select(b.icmp_signed("<", index, zero), zero,
                       b.select(b.icmp_signed(">", index, b.sub(size, one)),
                                b.sub(size, one), index))
    outside = b.or_(b.icmp_signed("<", index, zero), b.icmp_signed(">=", index, size))
    wrap = b.and_(normalized, b.icmp_unsigned("==", mode, ir.Constant(I8, ADDRESS_WRAP)))
    mirror = b.and_(normalized, b.icmp_unsigned("==", mode, ir.Constant(I8, ADDRESS_MIRROR)))
    border = b.and_(b.not_(b.or_(wrap, mirror)),
                    b.and_(outside, b.icmp_unsigned("==", mode,
                                                    ir.Constant(I8, ADDRESS_BORDER))))
    return b.select(wrap, wrapped, b.select(mirror, mirrored, clamped)), border


def _element(b, pointer, kind, bits):
    """One channel's value as float64 and the largest value of its integer type (for the
    normalized read), by the channel's bits: a branch each, so no load reads past it."""
    function = b.function
    join = function.append_basic_block("texel_read")
    cases = []
    signed = b.icmp_unsigned("==", kind, ir.Constant(I8, ChannelKind.SIGNED))
    start = b.block
    for width, half_type in ((8, None), (16, ir.HalfType()), (32, F32)):
        block = function.append_basic_block(f"texel_b{width}")
        b.position_at_end(block)
        raw = b.load(b.bitcast(pointer, ir.IntType(width).as_pointer()), align=1)
        value = b.select(signed, b.sitofp(raw, F64), b.uitofp(raw, F64))
        if half_type is not None:
            floating = b.fpext(b.bitcast(raw, half_type), F64)
            value = b.select(b.icmp_unsigned("==", kind, ir.Constant(I8, ChannelKind.FLOAT)),
                             floating, value)
        top = b.select(signed, ir.Constant(F64, float((1 << width - 1) - 1)),
                       ir.Constant(F64, float((1 << width) - 1)))
        b.branch(join)
        cases.append((width, block, value, top))
    b.position_at_end(start)
    switch = b.switch(bits, cases[2][1])
    for width, block, *_ in cases[:2]:
        switch.add_case(ir.Constant(I8, width), block)
    b.position_at_end(join)
    value, top = b.phi(F64), b.phi(F64)
    for _, block, v, t in cases:
        value.add_incoming(v, block)
        top.add_incoming(t, block)
    return value, top


def _texel(b, desc, texels, indices, texel_format, as_float: bool = True):
    """The four float64 values of the texel at integer `indices` (read mode and border
    applied), or with `as_float` false its four int64 values (a float's truncated), as
    ops_texture._texels gives them. `texel_format`: (channel kind, bits)."""
    kind, bits = texel_format
    channels = field(b, desc, _CHANNELS, I8)
    element = b.zext(b.lshr(bits, ir.Constant(I8, 3)), I64)
    offset = ir.Constant(I64, 0)
    border = ir.Constant(I1, 0)
    strides = [b.mul(b.zext(channels, I64), element),
               field(b, desc, _PITCH, I64), field(b, desc, _SLICE, I64)]
    normalized = b.icmp_unsigned("!=", field(b, desc, _NORMALIZED, I8), ir.Constant(I8, 0))
    for axis, index in enumerate(indices):
        size = b.zext(field(b, desc, _SIZES + 4 * axis, I32), I64)
        at, outside = _address(b, index, size, field(b, desc, _MODES + axis, I8), normalized)
        border = b.or_(border, outside)
        offset = b.add(offset, b.mul(at, strides[axis]))
    # integer texels read as normalized floats unless the object reads them as integers
    scaled = b.and_(b.icmp_unsigned("!=", kind, ir.Constant(I8, ChannelKind.FLOAT)),
                    b.icmp_unsigned("==", field(b, desc, _AS_INTEGER, I8), ir.Constant(I8, 0)))
    values = []
    for k in range(4):
        present = b.icmp_unsigned(">", channels, ir.Constant(I8, k))
        # A missing channel's load would read the next texel: load the first instead.
        at = b.add(offset, b.mul(b.select(present, ir.Constant(I64, k), ir.Constant(I64, 0)),
                                 element))
        loaded, top = _element(b, b.gep(texels, [at]), kind, bits)
        colour = b.fpext(field(b, desc, _BORDER + 4 * k, F32), F64)
        if not as_float:
            value = b.select(present, _to_int(b, loaded), ir.Constant(I64, int(k == 3)))
            values.append(b.select(border, _to_int(b, colour), value))
            continue
        quotient = b.fdiv(loaded, top)
        quotient = b.select(b.fcmp_ordered("<", quotient, ir.Constant(F64, -1.0)),
                            ir.Constant(F64, -1.0), quotient)
        loaded = b.select(scaled, quotient, loaded)
        value = b.select(present, loaded, ir.Constant(F64, 1.0 if k == 3 else 0.0))
        values.append(b.select(border, colour, value))
    return values


def sample(c, handle, coordinates: list, words, done, as_float: bool, layer=None):
    """Sample a fetch at `coordinates` (one per dimension: f32, or i32 for element fetches)
    from the object `handle`, of `layer` (an i32) if layered, into the four i32 `words`
    (f32, or with `as_float` false the integers' low 32 bits) and branch to `done`; returns
    the block the code goes to instead when the object is not one this path samples."""
    other = c.fn.append_basic_block("texture_other")
    desc = descriptor(c, handle, TEXTURE_MAGIC, other)
    b = c.b
    channels = field(b, desc, _CHANNELS, I8)
    kind, bits = field(b, desc, _KIND, I8), field(b, desc, _BITS, I8)
    fits = b.icmp_unsigned("<=", kind, ir.Constant(I8, ChannelKind.FLOAT))
    # the interpreter's formats: 8, 16 and 32-bit integers, half and float
    for_bits = [b.icmp_unsigned("==", bits, ir.Constant(I8, n)) for n in (8, 16, 32)]
    fits = b.and_(fits, b.or_(b.or_(for_bits[1], for_bits[2]), b.and_(
        for_bits[0], b.icmp_unsigned("!=", kind, ir.Constant(I8, ChannelKind.FLOAT)))))
    fits = b.and_(fits, b.or_(b.icmp_unsigned("==", channels, ir.Constant(I8, 1)),
                              b.or_(b.icmp_unsigned("==", channels, ir.Constant(I8, 2)),
                                    b.icmp_unsigned("==", channels, ir.Constant(I8, 4)))))
    texture = c.fn.append_basic_block("texture_texels")
    b.cbranch(fits, texture, other)
    b.position_at_end(texture)
    depth = b.zext(field(b, desc, _SIZES + 8, I32), I64)
    layers = b.zext(field(b, desc, _LAYERS, I32), I64)
    extent = b.mul(field(b, desc, _SLICE, I64),
                   b.select(b.icmp_unsigned(">", depth, layers), depth, layers))
    texels = c.global_or_null(field(c.b, desc, _BASE, I64), extent)
    b = c.b
    found = c.fn.append_basic_block("texture_sample")
    b.cbranch(b.icmp_unsigned("!=", texels, ir.Constant(P8, None)), found, other)
    b.position_at_end(found)
    if layer is not None:   # clamped to the layers; its texels as the object's
        top = b.sub(b.zext(field(b, desc, _LAYERS, I32), I64), ir.Constant(I64, 1))
        index = b.sext(layer, I64)
        index = b.select(b.icmp_signed("<", index, ir.Constant(I64, 0)), ir.Constant(I64, 0),
                         index)
        index = b.select(b.icmp_signed(">", index, top), top, index)
        texels = b.gep(texels, [b.mul(index, field(b, desc, _SLICE, I64))])
    normalized = b.icmp_unsigned("!=", field(b, desc, _NORMALIZED, I8), ir.Constant(I8, 0))
    scaled = []
    for axis, coordinate in enumerate(coordinates):
        if coordinate.type == I32:   # element fetches: no scaling, no filtering
            continue
        size = b.uitofp(field(b, desc, _SIZES + 4 * axis, I32), F64)
        scaled.append(b.fmul(b.fpext(coordinate, F64),
                             b.select(normalized, size, ir.Constant(F64, 1.0))))
    # 32-bit floats, the common format, in code of their own (LLVM folds their reads)
    float32 = c.fn.append_basic_block("texture_float32")
    general = c.fn.append_basic_block("texture_any_format")
    b.cbranch(b.and_(b.icmp_unsigned("==", kind, ir.Constant(I8, ChannelKind.FLOAT)),
                     b.icmp_unsigned("==", bits, ir.Constant(I8, 32))), float32, general)
    for block, texel_format in ((float32, (ir.Constant(I8, ChannelKind.FLOAT),
                                           ir.Constant(I8, 32))), (general, (kind, bits))):
        b.position_at_end(block)
        elements = [b.sext(x, I64) for x in coordinates if x.type == I32] or None
        _filter(c, desc, texels, texel_format, scaled, words, done, as_float, elements)
    return other


def _filter(c, desc, texels, texel_format, scaled: list, words, done, as_float: bool,
            elements=None):
    """Point or linear filtering at the scaled coordinates (or the texel at `elements`),
    into the words."""
    b = c.b
    floor = intrinsic(b.module, "llvm.floor", F64)
    point = elements or [_to_int(b, b.call(floor, [s])) for s in scaled]
    if not as_float:   # objects filter integer reads by point only
        for k, value in enumerate(_texel(b, desc, texels, point, texel_format, False)):
            b.store(b.trunc(value, I32), b.gep(words, [ir.Constant(I32, k)]))
        b.branch(done)
        return
    if elements:
        _store(b, _texel(b, desc, texels, point, texel_format), words)
        b.branch(done)
        return
    by_point = c.fn.append_basic_block("texture_point")
    linear = c.fn.append_basic_block("texture_linear")
    b.cbranch(b.icmp_unsigned("!=", field(b, desc, _LINEAR, I8), ir.Constant(I8, 0)),
              linear, by_point)
    b.position_at_end(by_point)
    _store(b, _texel(b, desc, texels, point, texel_format), words)
    b.branch(done)
    b.position_at_end(linear)
    half, steps = ir.Constant(F64, 0.5), ir.Constant(F64, _WEIGHT_STEPS)
    lower, weight = [], []
    for s in scaled:
        low = b.call(floor, [b.fsub(s, half)])
        lower.append(_to_int(b, low))
        weight.append(b.fdiv(b.call(intrinsic(b.module, "llvm.roundeven", F64),
                                    [b.fmul(b.fsub(b.fsub(s, half), low), steps)]), steps))
    # LLVM keeps no NaN's bits (it may swap a product's operands, or merge selects of
    # floats), so NaNs are chosen on the integer bits: numpy's blend (x86: an operation
    # returns its first NaN operand) gives the first NaN weight in axis order in every
    # channel, and otherwise the first NaN term, in corner order, of the sum.
    weight_nan = ir.Constant(I1, 0)
    first_nan = ir.Constant(I64, 0)
    for w in reversed(weight):
        bits = b.bitcast(w, I64)
        is_nan = _is_nan(b, bits)
        first_nan = b.select(is_nan, bits, first_nan)
        weight_nan = b.or_(weight_nan, is_nan)
    nan_weight = c.fn.append_basic_block("texture_nan_weight")
    blend = c.fn.append_basic_block("texture_blend")
    b.cbranch(weight_nan, nan_weight, blend)
    b.position_at_end(nan_weight)
    _store(b, [first_nan] * 4, words)
    b.branch(done)
    b.position_at_end(blend)
    total = None
    for corner in range(1 << len(scaled)):
        factor = ir.Constant(F64, 1.0)
        indices = []
        for axis in range(len(scaled)):
            upper = (corner >> axis) & 1
            indices.append(b.add(lower[axis], ir.Constant(I64, upper)))
            factor = b.fmul(factor, weight[axis] if upper
                            else b.fsub(ir.Constant(F64, 1.0), weight[axis]))
        terms = [b.bitcast(b.fmul(factor, v), I64)
                 for v in _texel(b, desc, texels, indices, texel_format)]
        total = terms if total is None else [_add(b, t, u) for t, u in zip(total, terms,
                                                                           strict=True)]
    _store(b, total, words)
    b.branch(done)


def _is_nan(b, bits):
    return b.icmp_unsigned(">", b.and_(bits, ir.Constant(I64, (1 << 63) - 1)),
                           ir.Constant(I64, 0x7FF0 << 48))


def _add(b, x, y):
    """x + y on float64 bits, the first NaN operand when there is one (x86's addsd)."""
    total = b.bitcast(b.fadd(b.bitcast(x, F64), b.bitcast(y, F64)), I64)
    return b.select(_is_nan(b, x), x, b.select(_is_nan(b, y), y, total))


def _store(b, values, words) -> None:
    """float64 values (or their bits) as float32 into the words; a NaN keeps its sign and
    the top of its payload, as the CPU's conversion does (LLVM's may not)."""
    for k, value in enumerate(values):
        bits = value if value.type == I64 else b.bitcast(value, I64)
        nan = b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32)
        nan = b.or_(b.and_(nan, ir.Constant(I32, 1 << 31)),
                    b.or_(ir.Constant(I32, 0x7FC00000),
                          b.and_(b.trunc(b.lshr(bits, ir.Constant(I64, 29)), I32),
                                 ir.Constant(I32, 0x7FFFFF))))
        single = b.bitcast(b.fptrunc(b.bitcast(bits, F64), F32), I32)
        b.store(b.select(_is_nan(b, bits), nan, single), b.gep(words, [ir.Constant(I32, k)]))
