"""wmma.load, wmma.store and wmma.mma: nvcuda::wmma's warp-wide matrix fragments.

Shapes and types (PTX ISA 7.x/8.0): m16n16k16, m8n32k16 and m32n8k16 for f16 (f16 or f32
accumulators), bf16 and s8/u8; m16n16k8 tf32; m8n8k4 f64; m8n8k32 s4/u4 and m8n8k128 b1
(.xor.popc or .and.popc). The fragments' distribution over lanes is the emulator's own
(`fragment_layouts.wmma_layout`), as the PTX ISA leaves it to the implementation: loads,
stores and products agree on it, and every lane works on its own elements, so a load or
store is per thread (each thread's address and stride, element by element, checked like
any other access). The product's arithmetic is mma.sync's (`matrix_product.py`).
Floating-point `.satfinite` (deprecated in CUDA's API) is not implemented.
"""

from __future__ import annotations

import numpy as np

from .fragment_layouts import wmma_layout
from .isa import CompileContext, opcode
from .matrix_elements import ELEMENTS
from .operands import reader
from .ops_memory import address_reader
from .ops_mma import Operand, fragment_product, split_modifiers
from .ptx_types import TYPES
from .spaces import load, store

__all__: list[str] = []

_MNK16 = {"m16n16k16", "m8n32k16", "m32n8k16"}
_SHAPES = {"f16": _MNK16, "bf16": _MNK16, "s8": _MNK16, "u8": _MNK16, "tf32": {"m16n16k8"},
           "f64": {"m8n8k4"}, "s4": {"m8n8k32"}, "u4": {"m8n8k32"}, "b1": {"m8n8k128"}}
_ACCUMULATORS = {"f16": {"f16", "f32"}, "bf16": {"f32"}, "tf32": {"f32"}, "f64": {"f64"},
                 "s8": {"s32"}, "u8": {"s32"}, "s4": {"s32"}, "u4": {"s32"}, "b1": {"s32"}}
_SPACES = ("global", "shared", "shared::cta")


def _dimensions(matrix: str, shape) -> tuple[int, int]:
    m, n, k = shape
    return {"a": (m, k), "b": (k, n), "c": (m, n), "d": (m, n)}[matrix]


def _elements_per_lane(matrix: str, element: str, shape) -> int:
    """f16 A and B fragments hold 16 elements per lane whatever the shape (8 registers, as
    the PTX ISA fixes them); the others hold their matrix exactly once."""
    if matrix in "ab" and element == "f16":
        return 16
    rows, cols = _dimensions(matrix, shape)
    return rows * cols // 32


def _check_shape(ctx, element: str, shape_name: str) -> None:
    if element not in _SHAPES or shape_name not in _SHAPES[element]:
        raise ctx.unsupported(f"wmma .{shape_name} with .{element} is not supported")


@opcode("wmma")
def _wmma(instr, ctx: CompileContext):
    (shape, shape_name), layouts, types, flags = split_modifiers(ctx)
    kind = flags[0] if flags else None
    if kind == "mma":
        return _mma(instr, ctx, shape, shape_name, layouts, types, flags[1:])
    if kind not in ("load", "store"):
        raise ctx.error("expected wmma.load, wmma.store or wmma.mma")
    return _memory(instr, ctx, kind, shape, shape_name, layouts, types, flags[1:])


def _memory(instr, ctx, kind, shape, shape_name, layouts, types, flags):
    matrix = flags[0] if flags else None
    if (kind == "load") != (matrix in ("a", "b", "c")) or (kind == "store") != (matrix == "d"):
        raise ctx.error(f"wmma.{kind} takes matrix {'a, b or c' if kind == 'load' else 'd'}")
    space = next((f for f in flags[1:] if f in _SPACES), "generic")
    extra = set(flags[1:]) - {"sync", "aligned", space}
    if extra or not {"sync", "aligned"} <= set(flags):
        raise ctx.unsupported(f"unsupported modifiers {', '.join('.' + f for f in flags)}")
    if len(layouts) != 1 or len(types) != 1:
        raise ctx.error(f"wmma.{kind} needs one layout (.row/.col) and one type")
    element = ELEMENTS[types[0]]
    if matrix in ("c", "d"):
        if not any(types[0] in accs for accs in _ACCUMULATORS.values()):
            raise ctx.error(f".{types[0]} is not an accumulator type")
    else:
        _check_shape(ctx, types[0], shape_name)
    ctx.operand_count(2, 3)
    rows, cols = _dimensions(matrix, shape)
    count = _elements_per_lane(matrix, types[0], shape)
    lane_rows, lane_cols = wmma_layout(rows, cols, count)
    row_major = layouts[0] == "row"
    fragment_at, address_at = (0, 1) if kind == "load" else (1, 0)
    registers = count // element.per_register
    fragment = Operand(ctx, instr.operands[fragment_at], element, registers,
                       destination=kind == "load")
    where, address = address_reader(instr.operands[address_at],
                                    "shared" if space == "shared::cta" else space, ctx)
    default_stride = cols if row_major else rows
    read_stride = (reader(instr.operands[2], TYPES["u32"], ctx) if len(instr.operands) == 3
                   else (lambda state, lanes: np.uint32(default_stride)))
    bits = element.bits
    field = np.dtype(f"uint{max(bits, 8)}")

    def element_addresses(state, lanes):
        """(lanes, bit offsets) of each executing lane's elements, one row per lane."""
        ids = state.lane_ids(lanes)
        laneid = state.layout.laneid[ids]
        stride = np.asarray(read_stride(state, lanes), np.uint64)
        r = lane_rows[laneid].astype(np.uint64)
        c = lane_cols[laneid].astype(np.uint64)
        offset = (r * stride[..., None] + c) if row_major else (c * stride[..., None] + r)
        base = np.asarray(address(state, lanes), np.uint64)
        bit_offset = offset * np.uint64(bits)
        where_bytes = base[..., None] + bit_offset // np.uint64(8)
        return np.repeat(ids, count), where_bytes.ravel(), (bit_offset % np.uint64(8)).ravel()

    def run_load(state, lanes):
        per_lane, addrs, shifts = element_addresses(state, lanes)
        values = load(state, where, addrs, field, 1, per_lane).astype(np.uint64)
        if bits < 8:
            values = (values >> shifts) & np.uint64((1 << bits) - 1)
        fields = values.reshape(-1, registers, element.per_register)
        shift = np.arange(element.per_register, dtype=np.uint64) * np.uint64(bits)
        words = np.bitwise_or.reduce(fields << shift, axis=2)
        dtype = element.register.dtype
        words = words.astype(np.uint64 if dtype.itemsize == 8 else np.uint32).view(dtype)
        for r, write in enumerate(fragment.access):
            write(state, lanes, np.ascontiguousarray(words[:, r]))

    def run_store(state, lanes):
        per_lane, addrs, _ = element_addresses(state, lanes)
        dtype = element.register.dtype
        words = np.stack([np.asarray(read(state, lanes), dtype) for read in fragment.access],
                         axis=-1)
        words = np.broadcast_to(words, (len(per_lane) // count, registers))
        words = words.view(np.uint64 if dtype.itemsize == 8 else np.uint32).astype(np.uint64)
        shift = np.arange(element.per_register, dtype=np.uint64) * np.uint64(bits)
        fields = (words[..., None] >> shift) & np.uint64((1 << bits) - 1)
        store(state, where, addrs, fields.reshape(-1).astype(field), per_lane)

    return ctx.op(run_load if kind == "load" else run_store)


def _mma(instr, ctx, shape, shape_name, layouts, types, flags):
    satfinite = "satfinite" in flags
    bit_op = next((op for op in ("and", "xor") if op in flags), None)
    extra = set(flags) - {"sync", "aligned", "satfinite", "popc", "and", "xor", "rn"}
    if extra or not {"sync", "aligned"} <= set(flags):
        raise ctx.unsupported(f"unsupported modifiers {', '.join('.' + f for f in flags)}")
    if len(types) == 2:
        dtype, ctype = types
        atype = btype = "f16"
    elif len(types) == 4:
        dtype, atype, btype, ctype = types
    else:
        raise ctx.error("wmma.mma needs .dtype.ctype or .dtype.atype.btype.ctype")
    _check_shape(ctx, atype, shape_name)
    integer_pair = {atype, btype} <= {"s8", "u8"}
    if (btype != atype and not integer_pair) or dtype not in _ACCUMULATORS[atype] \
            or ctype not in _ACCUMULATORS[atype]:
        raise ctx.error(f"wmma.mma .{dtype}.{atype}.{btype}.{ctype} is not a valid combination")
    if len(layouts) != 2:
        raise ctx.error("wmma.mma needs the layouts of A and B")
    if (atype == "b1") != (bit_op is not None and "popc" in flags):
        raise ctx.error("b1 wmma.mma needs .and.popc or .xor.popc (and only b1 takes them)")
    if satfinite and dtype != "s32":
        raise ctx.unsupported("floating-point .satfinite is not supported")
    ctx.operand_count(4)
    operands = {}
    layouts_of = {}
    for key, name, operand, destination in (("a", atype, 1, False), ("b", btype, 2, False),
                                            ("c", ctype, 3, False), ("d", dtype, 0, True)):
        element = ELEMENTS[name]
        count = _elements_per_lane(key, name, shape)
        operands[key] = Operand(ctx, instr.operands[operand], element,
                                count // element.per_register, destination)
        layouts_of[key] = wmma_layout(*_dimensions(key, shape), count)
    return fragment_product(ctx, operands["a"], operands["b"], operands["c"], operands["d"],
                            shape, layouts_of, satfinite, bit_op)
