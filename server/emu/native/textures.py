"""Texture fetches in compiled code: `tex.{1d,2d,3d,a1d,a2d}.v4.{f32,s32,u32}.{f32,s32}`.

Every form samples in LLVM IR (texture_sampling.py) when the handle is a live texture object
with its texels in memory; otherwise the fetch calls back into Python (device_io's
callback), which samples it with the interpreter's own code (ops_texture.py) and so raises
the interpreter's fault. Other texture instructions (tld4, txq, cubemaps, .level and .grad)
leave the kernel to the interpreter. Only the kernel's own body is scanned for fetches and
surface accesses (`uses_textures`): one in a device function it calls is not compiled.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np
from llvmlite import ir

from vgpu.texture_objects import TEXTURE_MAGIC

from ..ir import RegisterOperand
from ..ops_texture import _GEOMETRIES, _descriptors, _sample
from ..ptx_types import TYPES, lookup_type
from .codegen import _HANDLERS, F32, I32, I64, NotCompiled

__all__ = ["DeviceState", "fetch", "uses_textures"]

FETCH = "tex"
_DESTINATIONS = ("f32", "s32", "u32")


def uses_textures(kernel) -> bool:
    """Whether the kernel's body fetches or accesses surfaces (the callback's sink); asked at
    every launch, so the scan is remembered."""
    known = _USES.get(kernel)
    if known is None:
        known = _USES[kernel] = any(instr.opcode in (FETCH, "suld", "sust")
                                    for instr in kernel.function.body)
    return known


_USES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DeviceState:
    """What the interpreter's sampling reads of a warp's state: the device memory."""

    def __init__(self, memory):
        self.ctx = self
        self.memory = memory


def fetch(memory, handle: int, words: int, form: int) -> None:
    """Sample one fetch: `words` is the address of 4 int32 words, the coordinates in (the
    layer first if layered, then x, y, z) and the four results out; `form` packs the
    geometry's dimensions, layered, integer coordinates and the destination type. Raises
    the interpreter's Fault."""
    dims, layered, integer_coords = form & 3, bool(form & 4), bool(form & 8)
    dtype = TYPES[_DESTINATIONS[form >> 4]]
    as_float = dtype.name == "f32"
    cells = np.ctypeslib.as_array((ctypes.c_int32 * 4).from_address(words))
    raw = cells.copy()
    layer = raw[:1].astype(np.int32) if layered else None
    coordinates = raw[int(layered):int(layered) + dims]
    coords = [coordinates[k:k + 1] if integer_coords
              else coordinates[k:k + 1].view(np.float32) for k in range(dims)]
    state = DeviceState(memory)
    for desc, _ in _descriptors(state, None, np.array([handle], np.uint64),
                                    TEXTURE_MAGIC, "texture"):
        out = _sample(state, None, desc, coords, layer, integer_coords, as_float)
    result = out.astype(np.float32) if as_float else out.astype(np.uint32)
    cells[:] = result.view(np.int32)[0]


def lower_fetch(c, instr) -> None:
    """`tex`: the IR sampler (texture_sampling.py), the callback where it does not apply."""
    from . import device_io, texture_sampling
    if len(c.inlining) > 1:
        raise NotCompiled(f"{instr.text}: in a device function", instr.line)
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    types = [lookup_type(m) for m in instr.modifiers if lookup_type(m) is not None]
    geometry = [f for f in flags if f in _GEOMETRIES]
    if sorted(flags) != sorted(geometry + ["v4"]) or len(geometry) != 1 or len(types) != 2 \
            or types[0].name not in _DESTINATIONS or types[1].name not in ("f32", "s32"):
        raise NotCompiled(instr.text, instr.line)
    destinations, address = instr.operands[0], instr.operands[1]
    dims, layered = _GEOMETRIES[geometry[0]]
    elements = getattr(getattr(address, "coordinates", None), "elements", None)
    count = dims + int(layered)
    if len(instr.operands) != 2 or len(getattr(destinations, "elements", ())) != 4 \
            or elements is None or len(elements) < count or address.offset \
            or not isinstance(address.base, RegisterOperand):
        raise NotCompiled(instr.text, instr.line)
    words = c.texture_words
    handle = c.read(address.base, TYPES["u64"], instr)
    values = []
    for k, element in enumerate(elements[:count]):
        ptype = TYPES["s32"] if (layered and k == 0) or types[1].name == "s32" \
            else TYPES["f32"]
        values.append(c.read(element, ptype, instr))
    done = c.fn.append_basic_block("texture_fetched")
    c.b.position_at_end(texture_sampling.sample(c, handle, values[int(layered):], words, done,
                                                types[0].name == "f32",
                                                values[0] if layered else None))
    b = c.b
    for k, value in enumerate(values):
        b.store(b.bitcast(value, I32) if value.type == F32 else value,
                b.gep(words, [ir.Constant(I32, k)]))
    form = dims | layered << 2 | (types[1].name == "s32") << 3 \
        | _DESTINATIONS.index(types[0].name) << 4
    device_io.call(c, device_io.TEXTURE, [handle, b.ptrtoint(words, I64),
                                          ir.Constant(I64, form),
                                          ir.Constant(I64, instr.line)], instr.line)
    c.b.branch(done)
    c.b = ir.IRBuilder(done)
    for k, element in enumerate(destinations.elements):
        value = c.b.load(c.b.gep(words, [ir.Constant(I32, k)]))
        if types[0].name == "f32":
            value = c.b.bitcast(value, F32)
        c.write(element, types[0], value, instr)


_HANDLERS[FETCH] = lower_fetch
