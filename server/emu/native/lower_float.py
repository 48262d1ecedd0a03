"""Floating-point instructions for the native compiler, as the interpreter's ops_float has
them: add sub mul fma mad div rcp sqrt in every rounding mode with .ftz and .sat, the
.approx/.full forms, rsqrt ex2 lg2 sin cos tanh, abs neg min max (.ftz, .NaN), copysign,
testp, and f16/bf16 (x2) add sub mul fma (.sat .relu) min max neg abs ex2 tanh.

The interpreter's approximate functions are float64 libm results rounded once (numpy calls
the C library); here the same libm functions are called, so results agree bit for bit.
Half-precision lanes compute exactly in float64 (products of halves are exact; sums are
rounded to odd first) and round once to the half format, as `float_rounding.half_op`.
"""

from __future__ import annotations

from llvmlite import ir

from ..ops_float import APPROX_INVALID_NAN
from ..ptx_types import TYPES, lookup_type
from .codegen import NotCompiled, ltype
from .rounding import (
    F32,
    F64,
    I16,
    I32,
    directed,
    fabs64,
    flush,
    half_to_f64,
    round_to_half,
    saturate,
    to_odd,
)

__all__ = ["float_handlers"]

_MODES = ("rn", "rz", "rm", "rp")
_HALVES = {"f16": "f16", "bf16": "bf16", "f16x2": "f16", "bf16x2": "bf16"}
_LIBM = {"ex2": "exp2", "lg2": "log2", "sin": "sin", "cos": "cos", "tanh": "tanh"}


def _float_type(instr):
    """The instruction's single float type, or None when it is an integer instruction."""
    types = [t for m in instr.modifiers if (t := lookup_type(m)) is not None]
    if len(types) == 1 and types[0].kind == "f":
        return types[0]
    return None


class _Flags:
    def __init__(self, instr, allowed):
        self.instr = instr
        self.flags = {m for m in instr.modifiers if lookup_type(m) is None}
        extra = self.flags - set(allowed)
        if extra:
            raise NotCompiled(f"{instr.text}: modifier .{sorted(extra)[0]}", instr.line)

    def mode(self):
        modes = [m for m in _MODES if m in self.flags]
        return modes[0] if modes else None

    def __contains__(self, name):
        return name in self.flags


def _operands(c, instr, ptype, count):
    if len(instr.operands) != count + 1:
        raise NotCompiled(f"{instr.text}: operands", instr.line)
    return [c.read(op, ptype, instr) for op in instr.operands[1:]]


def _f32_finish(c, fn, args, ftz, sat):
    """.ftz on inputs and result, then .sat, around `fn` (f32 only, as the interpreter)."""
    b = c.b
    if ftz:
        args = [flush(b, a) for a in args]
    value = fn(*args)
    if ftz:
        value = flush(b, value)
    if sat:
        value = saturate(b, value)
    return value


# -- NaNs ----------------------------------------------------------------------------------------
# LLVM does not keep NaN signs and payloads (it may swap operands or fold a negation into a
# subtraction); the interpreter's NaNs are the CPU's for the operations numpy performs in
# order: the first NaN operand, quieted. Results are fixed up from the operands' bits.

def _width(ty) -> int:
    return {F32: 32, F64: 64}[ty]


def _bits_of(b, x):
    return b.bitcast(x, ir.IntType(_width(x.type)))


def _quiet(b, x):
    width = _width(x.type)
    quiet_bit = 1 << (22 if width == 32 else 51)
    return b.bitcast(b.or_(_bits_of(b, x), ir.Constant(ir.IntType(width), quiet_bit)), x.type)


def _negated(b, x):
    """-x as a sign flip of the bits (also of a NaN's)."""
    width = _width(x.type)
    return b.bitcast(b.xor(_bits_of(b, x), ir.Constant(ir.IntType(width), 1 << (width - 1))),
                     x.type)


def _nan_order(b, result, operands, branch: bool = True):
    """`result`, or the first NaN among `operands` (quieted) as the CPU gives it. Only a NaN
    result can need it (a NaN operand makes one): the fix is a branch taken for those only,
    which keeps it off the path of ordinary numbers (as selects it made a dependent chain of
    adds 3x slower). Without `branch`, selects on the operands alone (a NaN operand makes a
    NaN result, so the result's own test is left out): in the fast pass's lane loop, which
    has no chains across lanes and where LLVM's vectorizer would turn the branch into
    selects anyway, and more of them (a 1M saxpy: 5% of its time)."""
    def first_nan():
        fixed = result
        for operand in reversed(operands):
            fixed = b.select(b.fcmp_unordered("uno", operand, operand), _quiet(b, operand),
                             fixed)
        return fixed
    if not branch:
        return first_nan()
    fix = b.append_basic_block("nan")
    join = b.append_basic_block("number")
    before = b.block
    b.cbranch(b.fcmp_unordered("uno", result, result), fix, join).set_weights([1, 1 << 20])
    b.position_at_end(fix)
    fixed = first_nan()
    fix_end = b.block
    b.branch(join)
    b.position_at_end(join)
    value = b.phi(result.type)
    value.add_incoming(result, before)
    value.add_incoming(fixed, fix_end)
    return value


def _operation(c, op, args, mode):
    """An f32/f64 operation in `mode` with the interpreter's NaNs: sub in a directed mode is
    computed there as a + (-b), so a NaN b comes out negated."""
    b = c.b
    value = directed(c, op, args, mode)
    order = list(args)
    if op == "fsub" and mode != "rn":
        order[1] = _negated(b, order[1])
    if op == "fdiv" and isinstance(args[0], ir.Constant):
        order = order[1:]      # rcp: 1 / x
    return _nan_order(b, value, order, branch=c.deferred is None)


# -- f32/f64 -----------------------------------------------------------------------------------

def _arithmetic(c, instr, ptype, op):
    flags = _Flags(instr, (*_MODES, "ftz", "sat"))
    mode = flags.mode() or "rn"
    args = _operands(c, instr, ptype, 3 if op == "fma" else 2)
    if ptype.name == "f64" and ("ftz" in flags or "sat" in flags):
        raise NotCompiled(instr.text, instr.line)
    value = _f32_finish(c, lambda *a: _operation(c, op, list(a), mode), args, "ftz" in flags,
                        "sat" in flags)
    c.write(instr.operands[0], ptype, value, instr)


def _fma_like(c, instr, ptype):
    flags = _Flags(instr, (*_MODES, "ftz", "sat"))
    mode = flags.mode()
    if mode is None and not (instr.opcode == "mad" and ptype.name == "f32"):
        raise NotCompiled(instr.text, instr.line)
    _arithmetic(c, instr, ptype, "fma")


def _div(c, instr, ptype):
    flags = _Flags(instr, (*_MODES, "ftz", "approx", "full"))
    approx = "approx" in flags or "full" in flags
    mode = flags.mode()
    if approx == bool(mode) or (ptype.name == "f64" and (approx or "ftz" in flags)):
        raise NotCompiled(instr.text, instr.line)
    args = _operands(c, instr, ptype, 2)
    value = _f32_finish(c, lambda x, y: _operation(c, "fdiv", [x, y], mode or "rn"), args,
                        "ftz" in flags, False)
    c.write(instr.operands[0], ptype, value, instr)


def _rcp_sqrt(c, instr, ptype):
    flags = _Flags(instr, (*_MODES, "ftz", "approx"))
    mode = flags.mode()
    if ("approx" in flags) == bool(mode) or (instr.opcode == "sqrt" and ptype.name == "f64"
                                             and "ftz" in flags):
        raise NotCompiled(instr.text, instr.line)
    (x,) = _operands(c, instr, ptype, 1)
    ftz = "ftz" in flags and ptype.name == "f32"
    if instr.opcode == "rcp":
        def fn(v):
            return _operation(c, "fdiv", [ir.Constant(v.type, 1.0), v], mode or "rn")
    else:
        def fn(v):
            return _operation(c, "sqrt", [v], mode or "rn")
    c.write(instr.operands[0], ptype, _f32_finish(c, fn, [x], ftz, False), instr)


def _libm(c, name):
    function = c.module.globals.get(name)
    return function or ir.Function(c.module, ir.FunctionType(F64, [F64]), name)


def _approx_f64(c, opcode, x):
    """The interpreter's float64 formula for an approximate function, with its NaNs
    (APPROX_INVALID_NAN): a NaN argument comes back quieted (tanh: that same NaN)."""
    b = c.b
    if opcode == "rsqrt":
        root = b.call(c._intrinsic("llvm.sqrt", F64), [x])
        value = b.fdiv(ir.Constant(F64, 1.0), root)
    else:
        value = b.call(_libm(c, _LIBM[opcode]), [x])
    invalid = b.bitcast(ir.Constant(ir.IntType(64), APPROX_INVALID_NAN[opcode]), F64)
    value = b.select(b.fcmp_unordered("uno", value, value), invalid, value)
    nan = invalid if opcode == "tanh" else _quiet(b, x)
    return b.select(b.fcmp_unordered("uno", x, x), nan, value)


def _approx(c, instr, ptype):
    flags = _Flags(instr, ("approx", "ftz"))
    if "approx" not in flags:
        raise NotCompiled(instr.text, instr.line)
    if ptype.name in _HALVES:
        if instr.opcode not in ("ex2", "tanh"):
            raise NotCompiled(instr.text, instr.line)
        _half_lanes(c, instr, ptype, 1, lambda x: _approx_f64(c, instr.opcode, x), "rn")
        return
    if ptype.name == "f64" and instr.opcode != "rsqrt":
        raise NotCompiled(instr.text, instr.line)
    (x,) = _operands(c, instr, ptype, 1)
    b = c.b

    def fn(v):
        value = _approx_f64(c, instr.opcode, v if ptype.name == "f64" else b.fpext(v, F64))
        return value if ptype.name == "f64" else b.fptrunc(value, F32)
    ftz = "ftz" in flags and ptype.name == "f32"
    c.write(instr.operands[0], ptype, _f32_finish(c, fn, [x], ftz, False), instr)


def _sign_mask(ptype):
    bits = 16 if ptype.name in _HALVES else ptype.bits
    mask = 1 << (bits - 1)
    if ptype.name.endswith("x2"):
        mask |= mask << 16
    return mask


def _abs_neg(c, instr, ptype):
    flags = _Flags(instr, ("ftz",))
    (x,) = _operands(c, instr, ptype, 1)
    b = c.b
    if "ftz" in flags and ptype.name == "f32":
        x = flush(b, x)
    width = ir.IntType(ptype.bits)
    bits = b.bitcast(x, width) if ptype.name in ("f32", "f64") else x
    sign = ir.Constant(width, _sign_mask(ptype))
    bits = b.and_(bits, b.not_(sign)) if instr.opcode == "abs" else b.xor(bits, sign)
    value = b.bitcast(bits, ltype(ptype)) if ptype.name in ("f32", "f64") else bits
    c.write(instr.operands[0], ptype, value, instr)


def _min_max_value(b, x, y, is_min: bool, propagate: bool):
    """numpy's fmin/fmax (the non-NaN operand; x when both are NaN) or, with .NaN,
    minimum/maximum (a NaN operand, x first); zeros ordered -0 < +0."""
    ordered = b.select(b.fcmp_ordered("<=" if is_min else ">=", x, y), x, y)
    width = ir.IntType(x.type.width if isinstance(x.type, ir.IntType) else
                       (32 if x.type == F32 else 64))
    xi, yi = b.bitcast(x, width), b.bitcast(y, width)
    zeros = b.and_(b.fcmp_ordered("==", x, ir.Constant(x.type, 0.0)),
                   b.fcmp_ordered("==", y, ir.Constant(x.type, 0.0)))
    signed_zero = b.bitcast(b.or_(xi, yi) if is_min else b.and_(xi, yi), x.type)
    value = b.select(zeros, signed_zero, ordered)
    x_nan = b.fcmp_unordered("uno", x, x)
    y_nan = b.fcmp_unordered("uno", y, y)
    if propagate:
        return b.select(x_nan, x, b.select(y_nan, y, value))
    value = b.select(x_nan, y, value)
    return b.select(y_nan, x, value)


def _min_max(c, instr, ptype):
    flags = _Flags(instr, ("ftz", "NaN"))
    is_min = instr.opcode == "min"
    propagate = "NaN" in flags
    args = _operands(c, instr, ptype, 2)
    ftz = "ftz" in flags and ptype.name == "f32"
    value = _f32_finish(c, lambda x, y: _min_max_value(c.b, x, y, is_min, propagate), args,
                        ftz, False)
    c.write(instr.operands[0], ptype, value, instr)


def _copysign(c, instr, ptype):
    _Flags(instr, ())
    a, b_ = _operands(c, instr, ptype, 2)
    c.write(instr.operands[0], ptype, c.b.call(c._intrinsic("llvm.copysign", ltype(ptype), 2),
                                                [b_, a]), instr)


def _testp(c, instr):
    tests = ("finite", "infinite", "number", "notanumber", "normal", "subnormal")
    found = [m for m in instr.modifiers if m in tests]
    types = [t for m in instr.modifiers if (t := lookup_type(m)) is not None]
    if len(found) != 1 or len(types) != 1 or types[0].name not in ("f32", "f64") \
            or len(instr.operands) != 2:
        raise NotCompiled(instr.text, instr.line)
    ptype = types[0]
    x = c.read(instr.operands[1], ptype, instr)
    b = c.b
    magnitude = b.call(c._intrinsic("llvm.fabs", x.type), [x])
    inf = ir.Constant(x.type, float("inf"))
    tiny = ir.Constant(x.type, 2.0 ** (-126 if ptype.name == "f32" else -1022))
    result = {
        "finite": lambda: b.fcmp_ordered("<", magnitude, inf),
        "infinite": lambda: b.fcmp_ordered("==", magnitude, inf),
        "number": lambda: b.fcmp_ordered("ord", x, x),
        "notanumber": lambda: b.fcmp_unordered("uno", x, x),
        "normal": lambda: b.and_(b.fcmp_ordered("<", magnitude, inf),
                                 b.fcmp_ordered(">=", magnitude, tiny)),
        "subnormal": lambda: b.and_(b.fcmp_ordered("<", magnitude, tiny),
                                    b.fcmp_ordered("!=", x, ir.Constant(x.type, 0.0))),
    }[found[0]]()
    c.write(instr.operands[0], TYPES["pred"], result, instr)


# -- half precision ----------------------------------------------------------------------------

def _half_lanes(c, instr, ptype, count, fn, mode, finish=None):
    """d = fn(lanes as float64) rounded to the half format in `mode`, lane by lane for the
    packed forms; `finish(bits) -> bits` after rounding (sat, relu). fn may return a pair
    (value, error) for sums that are not exact in float64; they are rounded to odd."""
    fmt = _HALVES[ptype.name]
    args = _operands(c, instr, ptype, count)
    b = c.b
    packed = ptype.name.endswith("x2")
    results = []
    for shift in ((0, 16) if packed else (0,)):
        lanes = []
        for a in args:
            bits = b.trunc(b.lshr(a, ir.Constant(a.type, shift)), I16) if packed else a
            lanes.append(half_to_f64(b, bits, fmt))
        bits = round_to_half(b, fn(*lanes), fmt, mode)
        if finish is not None:
            bits = finish(bits)
        results.append(bits)
    if packed:
        low, high = (b.zext(r, I32) for r in results)
        value = b.or_(low, b.shl(high, ir.Constant(I32, 16)))
    else:
        value = results[0]
    c.write(instr.operands[0], ptype, value, instr)


def _exact_sum(b, x, y):
    """x + y rounded to odd (TwoSum's error), exact enough to round once to a half."""
    s = b.fadd(x, y)
    bb = b.fsub(s, x)
    err = b.fadd(b.fsub(x, b.fsub(s, bb)), b.fsub(y, bb))
    finite = b.fcmp_ordered("<", b.call(fabs64(b), [s]), ir.Constant(F64, float("inf")))
    return b.select(finite, to_odd(b, s, err), s)


def _half_clamp(c, fmt, kind):
    """.sat (clamp to [0, 1], NaN -> 0) or .relu (negative -> +0, NaN -> 0x7FFF) on half
    bits, as the interpreter's _half_sat / _half_relu."""
    b = c.b

    def sat(bits):
        value = saturate(b, half_to_f64(b, bits, fmt))
        return round_to_half(b, value, fmt, "rn")

    def relu(bits):
        zeroed = b.select(b.icmp_unsigned("!=", b.and_(bits, ir.Constant(I16, 0x8000)),
                                          ir.Constant(I16, 0)), ir.Constant(I16, 0), bits)
        value = half_to_f64(b, bits, fmt)
        return b.select(b.fcmp_unordered("uno", value, value), ir.Constant(I16, 0x7FFF),
                        zeroed)
    return sat if kind == "sat" else relu


def _half_arithmetic(c, instr, ptype):
    op = instr.opcode
    flags = _Flags(instr, (*_MODES, "sat", "relu", "ftz"))   # .ftz: ignored, as there
    mode = flags.mode()
    fused = op in ("fma", "mad")
    if fused and mode is None:
        raise NotCompiled(instr.text, instr.line)
    mode = mode or "rn"
    if "relu" in flags and ("sat" in flags or mode != "rn" or not fused):
        raise NotCompiled(instr.text, instr.line)
    fmt = _HALVES[ptype.name]
    b = c.b

    def fn(*x):
        x = list(x)
        if op == "sub":
            x[1] = _negated(b, x[1])
        if op in ("add", "sub"):
            value = _exact_sum(b, x[0], x[1])
        elif op == "mul":
            value = b.fmul(x[0], x[1])              # exact: 2 x 11 bits
        else:
            value = _exact_sum(b, b.fmul(x[0], x[1]), x[2])
        return _nan_order(b, value, x, branch=c.deferred is None)
    finish = None
    if "sat" in flags:
        finish = _half_clamp(c, fmt, "sat")
    elif "relu" in flags:
        finish = _half_clamp(c, fmt, "relu")
    _half_lanes(c, instr, ptype, 3 if fused else 2, fn, mode, finish)


def _half_min_max(c, instr, ptype):
    flags = _Flags(instr, ("NaN", "ftz"))
    is_min = instr.opcode == "min"

    def fn(x, y):
        # the interpreter rounds the float64 result back to the half format (rn), which
        # keeps every value, and turns a NaN into the format's NaN encoding
        return _min_max_value(c.b, x, y, is_min, "NaN" in flags)
    _half_lanes(c, instr, ptype, 2, fn, "rn")


# -- dispatch ----------------------------------------------------------------------------------

def _floating(handler, original):
    """A handler for the float forms of an opcode, the original one for the others."""
    def dispatch(c, instr):
        ptype = _float_type(instr)
        if ptype is None:
            return original(c, instr)
        return handler(c, instr, ptype)
    return dispatch


def _arith_op(op):
    def handler(c, instr, ptype):
        if ptype.name in _HALVES:
            return _half_arithmetic(c, instr, ptype)
        if op == "fma":
            return _fma_like(c, instr, ptype)
        return _arithmetic(c, instr, ptype, op)
    return handler


def _min_max_any(c, instr, ptype):
    if ptype.name in _HALVES:
        return _half_min_max(c, instr, ptype)
    return _min_max(c, instr, ptype)


def _only_f32_f64(handler):
    def checked(c, instr, ptype):
        if ptype.name not in ("f32", "f64"):
            raise NotCompiled(instr.text, instr.line)
        return handler(c, instr, ptype)
    return checked


def _no_handler(c, instr):
    raise NotCompiled(instr.text, instr.line)


def float_handlers(existing: dict) -> dict:
    """The handlers this module adds or extends, given the compiler's table."""
    def original(name):
        return existing.get(name, _no_handler)
    table = {
        "add": _floating(_arith_op("fadd"), original("add")),
        "sub": _floating(_arith_op("fsub"), original("sub")),
        "mul": _floating(_arith_op("fmul"), original("mul")),
        "fma": _floating(_arith_op("fma"), original("fma")),
        "mad": _floating(_arith_op("fma"), original("mad")),
        "div": _floating(_only_f32_f64(_div), original("div")),
        "rcp": _floating(_only_f32_f64(_rcp_sqrt), original("rcp")),
        "sqrt": _floating(_only_f32_f64(_rcp_sqrt), original("sqrt")),
        "abs": _floating(_abs_neg, original("abs")),
        "neg": _floating(_abs_neg, original("neg")),
        "min": _floating(_min_max_any, original("min")),
        "max": _floating(_min_max_any, original("max")),
        "copysign": _floating(_only_f32_f64(_copysign), original("copysign")),
        "testp": _testp,
    }
    for name in ("rsqrt", *_LIBM):
        table[name] = _floating(_approx, original(name))
    return table
