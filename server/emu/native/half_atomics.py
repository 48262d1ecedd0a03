"""atom/red .add.noftz on f16, bf16, f16x2 and bf16x2: a compare-and-swap loop around the
half-precision sum (codegen's `_atom` takes every other form).

Each half is widened to f32 exactly, added in f32 and rounded once to its format, to
nearest even: the f32 sum of two f16 (11-bit) or bf16 (8-bit) values rounded again to 11 or
8 bits is the exactly rounded sum (24 >= 2p + 2 bits), which is the interpreter's exact
addition rounded. Subnormals are kept (noftz). f16 conversions use the CPU's F16C
instructions; without them the kernel runs on the interpreter (LLVM would call runtime
library helpers that are not loaded).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from ..ptx_types import TYPES
from .codegen import _HANDLERS, F32, I32, NotCompiled, _memory_mods

__all__: list[str] = []

I16 = ir.IntType(16)

_HALVES = {"f16": 16, "bf16": 16, "f16x2": 32, "bf16x2": 32}
_whole_atom = _HANDLERS["atom"]


def _atom(c, instr) -> None:
    names = [m for m in instr.modifiers if m in _HALVES]
    if not names or "add" not in instr.modifiers:
        _whole_atom(c, instr)
        return
    mods, space, count = _memory_mods(instr)
    mods.take("add")
    mods.take("noftz")
    name = names[0]
    mods.types = [t for t in mods.types if t.name != name]
    mods.done()
    is_red = instr.opcode == "red"
    operands = instr.operands if is_red else instr.operands[1:]
    if space not in ("global", "shared", "generic") or count != 1 or len(operands) != 2 \
            or "noftz" not in instr.modifiers or mods.types:
        raise NotCompiled(instr.text, instr.line)
    if name.startswith("f16") and "+f16c" not in llvm.get_host_cpu_features().flatten():
        raise NotCompiled(f"{instr.text}: no F16C on this CPU", instr.line)
    bits = _HALVES[name]
    whole = ir.IntType(bits)
    value = c.read(operands[1], TYPES[f"b{bits}"], instr)
    where, address = c.address(operands[0], space, instr)
    pointer = c.access(where, address, bits // 8, True, instr.line)
    b = c.b
    typed = b.bitcast(pointer, whole.as_pointer())
    first = b.load_atomic(typed, "monotonic", bits // 8)
    before = b.block
    loop = c.fn.append_basic_block("half_atom")
    done = c.fn.append_basic_block("half_atom_done")
    b.branch(loop)
    b = c.b = ir.IRBuilder(loop)
    current = b.phi(whole)
    current.add_incoming(first, before)
    new = _sum(b, current, value, name.startswith("bf16"), bits // 16)
    swapped = b.cmpxchg(typed, current, new, "monotonic", "monotonic")
    current.add_incoming(b.extract_value(swapped, 0), loop)
    b.cbranch(b.extract_value(swapped, 1), done, loop)
    c.b = ir.IRBuilder(done)
    if not is_red:
        c.write(instr.operands[0], TYPES[f"b{bits}"], current, instr)


def _sum(b, x, y, brain: bool, lanes: int):
    """The packed halves of x + y (lanes of 16 bits each)."""
    result = ir.Constant(x.type, 0)
    for k in range(lanes):
        shift = ir.Constant(x.type, 16 * k)
        parts = [b.trunc(b.lshr(v, shift), I16) for v in (x, y)]
        total = b.fadd(*(_widen(b, p, brain) for p in parts))
        half = _narrow(b, total, brain)
        result = b.or_(result, b.shl(b.zext(half, x.type), shift))
    return result


def _widen(b, bits, brain: bool):
    if brain:
        return b.bitcast(b.shl(b.zext(bits, I32), ir.Constant(I32, 16)), F32)
    return b.fpext(b.bitcast(bits, ir.HalfType()), F32)


def _narrow(b, value, brain: bool):
    if not brain:
        return b.bitcast(b.fptrunc(value, ir.HalfType()), I16)
    bits = b.bitcast(value, I32)
    odd = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(bits, b.add(ir.Constant(I32, 0x7FFF), odd)), ir.Constant(I32, 16))
    quiet = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
    is_nan = b.fcmp_unordered("uno", value, value)
    return b.trunc(b.select(is_nan, quiet, rounded), I16)


_HANDLERS.update({"atom": _atom, "red": _atom})
