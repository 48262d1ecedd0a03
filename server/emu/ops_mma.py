"""mma.sync: a warp's matrix multiply-accumulate on register fragments (tensor cores), with
the fragment layouts of the PTX ISA (`fragment_layouts.py`) and each type's arithmetic
(`matrix_product.py`).

Shapes and types (PTX ISA 7.x/8.0, sm_80): m16n8k8/m16n8k16 f16 (f16 or f32 accumulators)
and bf16, m16n8k4/m16n8k8 tf32, m8n8k4 f64, m8n8k16/m16n8k16/m16n8k32 s8/u8,
m8n8k32/m16n8k32/m16n8k64 s4/u4 (.satfinite on the integer forms), m8n8k128/m16n8k128/
m16n8k256 b1 with .and.popc or .xor.popc. Volta's m8n8k4 f16 and the fp8 types of later
targets are not implemented.
"""

from __future__ import annotations

import re

import numpy as np

from .fragment_layouts import mma_layout
from .ir import Vector
from .isa import CompileContext, opcode
from .matrix_elements import ELEMENTS, ElementType
from .matrix_product import multiply_accumulate
from .operands import reader, writer
from .warp_fragments import WarpLanes

__all__ = ["Operand", "fragment_product", "split_modifiers"]

_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)$")
_FLOAT16 = {"m16n8k8", "m16n8k16"}
_SHAPES = {   # input type -> shapes
    "f16": _FLOAT16, "bf16": _FLOAT16, "tf32": {"m16n8k4", "m16n8k8"}, "f64": {"m8n8k4"},
    "s8": {"m8n8k16", "m16n8k16", "m16n8k32"}, "u8": {"m8n8k16", "m16n8k16", "m16n8k32"},
    "s4": {"m8n8k32", "m16n8k32", "m16n8k64"}, "u4": {"m8n8k32", "m16n8k32", "m16n8k64"},
    "b1": {"m8n8k128", "m16n8k128", "m16n8k256"},
}
_ACCUMULATORS = {"f16": {"f16", "f32"}, "bf16": {"f32"}, "tf32": {"f32"}, "f64": {"f64"},
                 "s8": {"s32"}, "u8": {"s32"}, "s4": {"s32"}, "u4": {"s32"}, "b1": {"s32"}}
_INTEGER_PARTNERS = {"s8": "su8", "u8": "su8", "s4": "su4", "u4": "su4", "b1": "b1"}


def split_modifiers(ctx: CompileContext):
    """(shape (m, n, k) and its name, layouts, element type names in order, other flags)."""
    shape = None
    layouts, types, flags = [], [], []
    for mod in ctx.instr.modifiers:
        match = _SHAPE.match(mod)
        if match:
            shape = (tuple(int(x) for x in match.groups()), mod)
        elif mod in ("row", "col"):
            layouts.append(mod)
        elif mod in ELEMENTS:
            types.append(mod)
        else:
            flags.append(mod)
    if shape is None:
        raise ctx.error("expected a shape .mMnNkK")
    return shape, layouts, types, flags


class Operand:
    """One fragment operand of a warp-wide instruction: its registers and element type."""

    def __init__(self, ctx: CompileContext, operand, element: ElementType, registers: int,
                 destination: bool = False):
        regs = operand.elements if isinstance(operand, Vector) else [operand]
        if len(regs) != registers:
            raise ctx.error(f"expected {registers} register(s) for a .{element.name} "
                            f"fragment, got {len(regs)}")
        self.element = element
        make = writer if destination else reader
        self.access = [make(r, element.register, ctx) for r in regs]


def fragment_product(ctx, a: Operand, b: Operand, c: Operand, d: Operand, shape, layouts,
                     satfinite=False, bit_op=None):
    """The op computing D = A x B + C over every executing warp. `layouts` maps 'a', 'b',
    'c' to (rows, cols) index arrays of shape (32, elements)."""
    m, n, k = shape

    def matrix(values, operand, rows, cols, key):
        elements = operand.element.decode(values)
        row_index, col_index = layouts[key]
        out = np.zeros((len(values), rows, cols), elements.dtype)
        out[:, row_index, col_index] = elements
        return out

    def run(state, lanes):
        warps = WarpLanes(state, lanes)
        ma = matrix(warps.gather(state, a.access), a, m, k, "a")
        mb = matrix(warps.gather(state, b.access), b, k, n, "b")
        mc = matrix(warps.gather(state, c.access), c, m, n, "c")
        result = multiply_accumulate(ma, mb, mc, a.element.name, d.element.name, satfinite, bit_op)
        row_index, col_index = layouts["c"]
        words = d.element.encode(result[:, row_index, col_index])
        warps.scatter(state, lanes, d.access, words)
    return ctx.op(run)


def _registers(elements: int, element: ElementType) -> int:
    return elements // element.per_register


@opcode("mma")
def _mma(instr, ctx: CompileContext):
    (shape, shape_name), layouts, types, flags = split_modifiers(ctx)
    sync = [f for f in flags if f in ("sync", "aligned")]
    rest = [f for f in flags if f not in ("sync", "aligned")]
    satfinite = "satfinite" in rest
    bit_op = next((op for op in ("and", "xor") if op in rest), None)
    extra = set(rest) - {"satfinite", "popc", "and", "xor", "rn"}
    if len(sync) != 2 or extra:
        raise ctx.unsupported(f"unsupported modifiers {', '.join('.' + f for f in rest)}")
    if len(types) != 4:
        raise ctx.error("mma needs .dtype.atype.btype.ctype")
    dtype, atype, btype, ctype = types
    if atype not in _SHAPES or shape_name not in _SHAPES[atype]:
        raise ctx.unsupported(f"mma .{shape_name} with .{atype} inputs is not supported")
    partner = _INTEGER_PARTNERS.get(atype)
    if (btype != atype and (partner is None or _INTEGER_PARTNERS.get(btype) != partner)) \
            or dtype not in _ACCUMULATORS[atype] or ctype not in _ACCUMULATORS[atype]:
        raise ctx.error(f"mma .{dtype}.{atype}.{btype}.{ctype} is not a valid combination")
    if atype != "f16" and dtype != ctype:
        raise ctx.error("mma's C and D types must match")
    if layouts != ["row", "col"]:
        raise ctx.error(f"mma .{shape_name} takes .row.col layouts")
    if (atype == "b1") != (bit_op is not None and "popc" in rest):
        raise ctx.error("b1 mma needs .and.popc or .xor.popc (and only b1 takes them)")
    if satfinite and dtype != "s32":
        raise ctx.error(".satfinite applies to integer mma")
    ctx.operand_count(4)
    m, n, k = shape
    ea, eb, ec, ed = (ELEMENTS[t] for t in (atype, btype, ctype, dtype))
    a = Operand(ctx, instr.operands[1], ea, _registers(m * k // 32, ea))
    b = Operand(ctx, instr.operands[2], eb, _registers(k * n // 32, eb))
    c = Operand(ctx, instr.operands[3], ec, _registers(m * n // 32, ec))
    d = Operand(ctx, instr.operands[0], ed, _registers(m * n // 32, ed), destination=True)
    layouts_of = {"a": mma_layout("a", ea.per_register, m * k // 32),
                  "b": mma_layout("b", eb.per_register, k * n // 32),
                  "c": mma_layout("c", 1, m * n // 32)}
    return fragment_product(ctx, a, b, c, d, shape, layouts_of, satfinite, bit_op)
