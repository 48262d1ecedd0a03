"""Surface loads and stores in compiled code: `suld.b` and `sust.b` on 1D, 2D and 3D surface
objects (.b8 to .b64, scalar, .v2, .v4; .trap, .clamp, .zero).

The thread reads the object's descriptor (texture_objects.py) and computes the byte offset
as the interpreter does (ops_texture.py: x in bytes, y rows, z slices; outside the surface a
.zero load reads 0 and a .zero store is dropped, .clamp clamps each coordinate to the edge);
the access itself is a checked global access, so its faults are ld's and st's. A handle that
is no live surface object, and a .trap access outside the surface, call back into Python
(device_io's callback), which raises the interpreter's fault. Layered surfaces and other
surface instructions (suq, sured) leave the kernel to the interpreter.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from vgpu.texture_objects import SURFACE_MAGIC

from ..ir import RegisterOperand, Vector
from ..ops_texture import _GEOMETRIES, _descriptors, _surface_offsets
from ..ptx_types import TYPES, lookup_type
from .codegen import _HANDLERS, I1, I8, I32, I64, NotCompiled
from .texture_sampling import _BASE, _BITS, _CHANNELS, _PITCH, _SIZES, _SLICE, descriptor, field
from .textures import DeviceState

__all__ = ["fault"]

_MODES = ("trap", "clamp", "zero")


def fault(memory, handle: int, words: int, form: int) -> None:
    """Raise the interpreter's fault of a surface access the compiled code found bad: the
    handle, or a .trap access outside (`words`: x, y, z; `form`: dimensions, the access's
    size << 2, a store << 10)."""
    dims, size, access = form & 3, form >> 2 & 0xFF, "write" if form >> 10 else "read"
    cells = np.ctypeslib.as_array((ctypes.c_int32 * 4).from_address(words)).copy()
    state = DeviceState(memory)
    for desc, _ in _descriptors(state, None, np.array([handle], np.uint64), SURFACE_MAGIC,
                                "surface"):
        _surface_offsets(state, None, desc, [cells[k:k + 1] for k in range(dims)], None,
                         size, "trap", access)


def _lower(c, instr) -> None:
    from . import device_io
    if len(c.inlining) > 1:   # (as texture fetches: the callback is set up per kernel)
        raise NotCompiled(f"{instr.text}: in a device function", instr.line)
    loading = instr.opcode == "suld"
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    types = [lookup_type(m) for m in instr.modifiers if lookup_type(m) is not None]
    geometry = [f for f in flags if f in _GEOMETRIES and not _GEOMETRIES[f][1]]
    width = [f for f in flags if f in ("v2", "v4")]
    explicit = [f for f in flags if f in _MODES]
    if sorted(flags) != sorted(["b", *geometry, *width, *explicit]) or len(explicit) > 1 \
            or len(geometry) != 1 or len(types) != 1 \
            or types[0].name not in ("b8", "b16", "b32", "b64") or len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    ptype, count = types[0], int(width[0][1:]) if width else 1
    mode = explicit[0] if explicit else "trap"
    dims = _GEOMETRIES[geometry[0]][0]
    values, address = instr.operands if loading else instr.operands[::-1]
    elements = values.elements if isinstance(values, Vector) else [values]
    coordinates = getattr(getattr(address, "coordinates", None), "elements", None)
    if len(elements) != count or coordinates is None or len(coordinates) < dims \
            or address.offset or not isinstance(address.base, RegisterOperand):
        raise NotCompiled(instr.text, instr.line)
    size = ptype.nbytes * count
    handle = c.read(address.base, TYPES["u64"], instr)
    coords = [c.read(e, TYPES["s32"], instr) for e in coordinates[:dims]]
    stored = [] if loading else [c.read(e, ptype, instr) for e in elements]
    b = c.b
    bad = c.fn.append_basic_block("surface_bad")
    skip = c.fn.append_basic_block("surface_skip")
    done = c.fn.append_basic_block("surface_done")
    desc = descriptor(c, handle, SURFACE_MAGIC, bad)
    b = c.b
    texel = b.mul(b.zext(b.lshr(field(b, desc, _BITS, I8), ir.Constant(I8, 3)), I64),
                  b.zext(field(b, desc, _CHANNELS, I8), I64))
    strides = [ir.Constant(I64, 1), field(b, desc, _PITCH, I64), field(b, desc, _SLICE, I64)]
    inside = ir.Constant(I1, 1)
    offset = ir.Constant(I64, 0)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    for axis, coordinate in enumerate(coords):
        coordinate = b.sext(coordinate, I64)
        limit = b.zext(field(b, desc, _SIZES + 4 * axis, I32), I64)
        if axis == 0:
            limit = b.sub(b.mul(limit, texel), ir.Constant(I64, size - 1))
        if mode == "clamp":   # numpy's clip: max with 0, then min with limit - 1
            coordinate = b.select(b.icmp_signed("<", coordinate, zero), zero, coordinate)
            top = b.sub(limit, one)
            coordinate = b.select(b.icmp_signed(">", coordinate, top), top, coordinate)
        else:
            inside = b.and_(inside, b.and_(b.icmp_signed(">=", coordinate, zero),
                                           b.icmp_signed("<", coordinate, limit)))
        offset = b.add(offset, b.mul(coordinate, strides[axis]))
    access = c.fn.append_basic_block("surface_access")
    b.cbranch(inside, access, bad if mode == "trap" else skip)
    b.position_at_end(access)
    pointer = c.access("global", b.add(field(c.b, desc, _BASE, I64), offset), size,
                       not loading, instr.line)
    b = c.b
    element = ir.IntType(ptype.bits)
    slots = b.bitcast(pointer, element.as_pointer())
    loaded = []
    for k in range(count):
        at = b.gep(slots, [ir.Constant(I64, k)])
        if loading:
            loaded.append(b.load(at, align=1))
        else:
            b.store(stored[k], at, align=1)
    access_end = b.block
    b.branch(done)
    b.position_at_end(bad)
    words = c.texture_words
    for k, coordinate in enumerate(coords):
        b.store(coordinate, b.gep(words, [ir.Constant(I32, k)]))
    form = dims | size << 2 | (not loading) << 10
    device_io.call(c, device_io.SURFACE, [handle, b.ptrtoint(words, I64),
                                          ir.Constant(I64, form),
                                          ir.Constant(I64, instr.line)], instr.line)
    c.b.branch(skip)
    c.b.position_at_end(skip)
    c.b.branch(done)
    c.b.position_at_end(done)
    if loading:
        merged = []
        for k in range(count):   # the phis first: writing may add instructions
            merged.append(c.b.phi(element))
            merged[k].add_incoming(loaded[k], access_end)
            merged[k].add_incoming(ir.Constant(element, 0), skip)
        for operand, value in zip(elements, merged, strict=True):
            c.write(operand, ptype, value, instr)


_HANDLERS.update({"suld": _lower, "sust": _lower})
