"""Comparisons for the native compiler, as the interpreter's ops_compare: setp and set on
integers, f32/f64 (.ftz) and f16/bf16 and their x2 pairs (compared as the values they
encode), with .and/.or/.xor, and slct."""

from __future__ import annotations

from llvmlite import ir

from ..ptx_types import TYPES, lookup_type
from .codegen import NotCompiled
from .rounding import fabs64, flush, half_to_f64

__all__ = ["compare_handlers"]

_ORDERED = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_UNORDERED = {"equ": "==", "neu": "!=", "ltu": "<", "leu": "<=", "gtu": ">", "geu": ">="}
_UNSIGNED = {"lo": "<", "ls": "<=", "hi": ">", "hs": ">="}
_COMBINE = ("and", "or", "xor")
_PRED = TYPES["pred"]
_PACKED = {"f16x2": "f16", "bf16x2": "bf16"}
I16, I32, F64 = ir.IntType(16), ir.IntType(32), ir.DoubleType()
_SET_TRUE = {"u32": 0xFFFFFFFF, "s32": 0xFFFFFFFF, "f32": 0x3F800000, "f16": 0x3C00,
             "bf16": 0x3F80}


def _parse(instr, count):
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    types = [lookup_type(m) for m in instr.modifiers if lookup_type(m) is not None]
    ops = [f for f in flags if f in _ORDERED or f in _UNORDERED or f in _UNSIGNED
           or f in ("num", "nan")]
    combine = [f for f in flags if f in _COMBINE]
    rest = set(flags) - set(ops) - set(combine) - {"ftz"}
    if len(ops) != 1 or len(combine) > 1 or rest or len(types) != count:
        raise NotCompiled(instr.text, instr.line)
    return ops[0], (combine[0] if combine else None), "ftz" in flags, types


def _decoded(b, bits, fmt, ftz):
    """A half as float64; .ftz flushes what is below f32's normal range (bf16 subnormals;
    f16 has none that small), as the interpreter's flush of the decoded value."""
    value = half_to_f64(b, bits, fmt)
    if ftz and fmt == "bf16":
        tiny = b.fcmp_ordered("<", b.call(fabs64(b), [value]), ir.Constant(F64, 2.0 ** -126))
        value = b.select(tiny, ir.Constant(F64, 0.0), value)
    return value


def _compare(c, instr, op, ptype, ftz, halves=None):
    """The i1 result of comparing the instruction's operands 1 and 2 as `ptype`; for a
    packed pair, `halves` (0 low, 16 high) says which."""
    x, y = (c.read(o, ptype, instr) for o in instr.operands[1:3])
    b = c.b
    if halves is not None:
        fmt = ptype.name[:-2]
        x, y = (_decoded(b, b.trunc(b.lshr(v, ir.Constant(I32, halves)), I16), fmt, ftz)
                for v in (x, y))
    elif ptype.name in ("f16", "bf16"):
        x, y = (_decoded(b, v, ptype.name, ftz) for v in (x, y))
    elif ftz and ptype.name == "f32":
        x, y = flush(b, x), flush(b, y)
    if ptype.kind == "f":
        if op in _ORDERED:
            return b.fcmp_ordered(_ORDERED[op], x, y)
        if op in _UNORDERED:
            return b.fcmp_unordered(_UNORDERED[op], x, y)
        return b.fcmp_ordered("ord", x, y) if op == "num" else b.fcmp_unordered("uno", x, y)
    if op in _UNSIGNED:
        relation, signed = _UNSIGNED[op], False
    elif op in _ORDERED:
        relation, signed = _ORDERED[op], ptype.is_signed
    else:
        raise NotCompiled(instr.text, instr.line)
    result = (b.icmp_signed if signed else b.icmp_unsigned)(relation, x, y)
    if c.rows is not None and halves is None:   # the fast pass: a row may know it whole
        result = c.rows.uniform_compare(instr, relation, ptype.bits, signed, result)
    return result


def _join(c, instr, combine, value):
    if combine is None:
        return value
    other = c.read(instr.operands[3], _PRED, instr)
    return {"and": c.b.and_, "or": c.b.or_, "xor": c.b.xor}[combine](value, other)


def _setp(c, instr):
    op, combine, ftz, (ptype,) = _parse(instr, 1)
    if len(instr.operands) != (4 if combine else 3) or ptype.kind == "pred":
        raise NotCompiled(instr.text, instr.line)
    if ptype.name in _PACKED:   # p: the low halves' result, q: the high halves'
        if instr.pair is None:
            raise NotCompiled(instr.text, instr.line)
        for halves, destination in ((0, instr.operands[0]), (16, instr.pair)):
            result = _join(c, instr, combine, _compare(c, instr, op, ptype, ftz, halves))
            c.write(destination, _PRED, result, instr)
        return
    result = _compare(c, instr, op, ptype, ftz)
    c.write(instr.operands[0], _PRED, _join(c, instr, combine, result), instr)
    if instr.pair is not None:
        c.write(instr.pair, _PRED, _join(c, instr, combine, c.b.not_(result)), instr)


def _set(c, instr):
    op, combine, ftz, (dtype, stype) = _parse(instr, 2)
    if len(instr.operands) != (4 if combine else 3):
        raise NotCompiled(instr.text, instr.line)
    if stype.name in _PACKED:
        _set_packed(c, instr, op, combine, ftz, dtype, stype)
        return
    if dtype.name not in _SET_TRUE:
        raise NotCompiled(instr.text, instr.line)
    result = _join(c, instr, combine, _compare(c, instr, op, stype, ftz))
    width = ir.IntType(dtype.bits)
    bits = c.b.select(result, ir.Constant(width, _SET_TRUE[dtype.name]), ir.Constant(width, 0))
    c.write(instr.operands[0], TYPES[f"b{dtype.bits}"], bits, instr)


def _set_packed(c, instr, op, combine, ftz, dtype, stype):
    """Each half of d: 1.0 in the destination's half format (all ones for .u32/.s32) where
    that half's comparison holds, else 0."""
    if dtype.name == stype.name:
        true_half = _SET_TRUE[_PACKED[dtype.name]]
    elif dtype.name in ("u32", "s32"):
        true_half = 0xFFFF
    else:
        raise NotCompiled(instr.text, instr.line)
    b = c.b
    word = ir.Constant(I32, 0)
    for halves in (0, 16):
        result = _join(c, instr, combine, _compare(c, instr, op, stype, ftz, halves))
        half = b.select(result, ir.Constant(I32, true_half << halves), ir.Constant(I32, 0))
        word = b.or_(word, half)
    c.write(instr.operands[0], TYPES["b32"], word, instr)


def _slct(c, instr):
    flags = [m for m in instr.modifiers if lookup_type(m) is None]
    types = [lookup_type(m) for m in instr.modifiers if lookup_type(m) is not None]
    if set(flags) - {"ftz"} or len(types) != 2 or types[1].name not in ("s32", "f32") \
            or len(instr.operands) != 4:
        raise NotCompiled(instr.text, instr.line)
    dtype, ctype = types
    x, y = (c.read(o, dtype, instr) for o in instr.operands[1:3])
    selector = c.read(instr.operands[3], ctype, instr)
    b = c.b
    if ctype.name == "f32":
        if "ftz" in flags:
            selector = flush(b, selector)
        chosen = b.fcmp_ordered(">=", selector, ir.Constant(selector.type, 0.0))
    else:
        chosen = b.icmp_signed(">=", selector, ir.Constant(selector.type, 0))
    c.write(instr.operands[0], dtype, b.select(chosen, x, y), instr)


def compare_handlers(_existing: dict) -> dict:
    """setp, set and slct are lowered here whole."""
    return {"setp": _setp, "set": _set, "slct": _slct}
