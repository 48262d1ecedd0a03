"""Rounding for the native compiler: IEEE operations in a directed mode, .ftz and .sat, and
rounding a float64 to f16/bf16 bits in every mode (what `float_rounding` does with numpy).

Directed modes (.rz .rm .rp) run on the CPU's own rounding: a small helper per operation
and mode switches the rounding mode (MXCSR on x86-64, `llvm.set.rounding` elsewhere),
performs the constrained (strictfp) operation and switches back, so the result is IEEE's
exact rounding, as the interpreter's error-free transformations compute it. The helpers
are LLVM IR text the kernel's module links in (`extra_ir`); round to nearest is plain LLVM.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

__all__ = ["directed", "fabs64", "flush", "half_to_f64", "round_to_half", "saturate",
           "to_odd"]

I1, I16, I32, I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
MODE_CODES = {"rz": 0, "rn": 1, "rp": 2, "rm": 3}   # llvm.set.rounding's numbering
_ARITY = {"fadd": 2, "fsub": 2, "fmul": 2, "fdiv": 2, "fma": 3, "sqrt": 1, "fptrunc": 1,
          "sitofp": 1, "uitofp": 1}
_PLAIN = {"fadd": "fadd", "fsub": "fsub", "fmul": "fmul", "fdiv": "fdiv"}
_CONVERSIONS = ("fptrunc", "sitofp", "uitofp")
_X86 = llvm.get_process_triple().startswith("x86_64")
_CONSTRAINED = 'metadata !"round.dynamic", metadata !"fpexcept.ignore"'


def _suffix(ty: ir.Type) -> str:
    return {F32: "f32", F64: "f64"}.get(ty, str(ty))


def directed(c, op: str, args: list, mode: str, result: ir.Type | None = None):
    """`op` (fadd fsub fmul fdiv fma sqrt, or the conversions fptrunc sitofp uitofp to
    `result`) rounded in `mode` (rn rz rm rp)."""
    b = c.b
    result = result or args[0].type
    if mode == "rn":
        if op in _PLAIN:
            return getattr(b, _PLAIN[op])(*args)
        if op in _CONVERSIONS:
            return getattr(b, op)(args[0], result)
        name = {"fma": "llvm.fma", "sqrt": "llvm.sqrt"}[op]
        return b.call(c._intrinsic(name, result, _ARITY[op]), args)
    types = [a.type for a in args]
    suffix = _suffix(result) if op not in _CONVERSIONS else \
        f"{_suffix(result)}.{_suffix(types[0])}"
    name = f"vgpu_{op}_{suffix.replace('.', '_')}_{mode}"
    helper = c.module.globals.get(name) or ir.Function(c.module, ir.FunctionType(result, types),
                                                       name)
    if name not in c.extra_ir:
        intrinsic = f"llvm.experimental.constrained.{op}.{suffix}"
        params = ", ".join(f"{t} %a{k}" for k, t in enumerate(types))
        c.extra_ir.setdefault(intrinsic, f"declare {result} @{intrinsic}("
                              f"{', '.join(str(t) for t in types)}, metadata, metadata)\n")
        enter, leave = _switch(c, mode)
        c.extra_ir[name] = f"""
define internal {result} @{name}({params}) noinline strictfp {{
{enter}
  %r = call {result} @{intrinsic}({params}, {_CONSTRAINED}) strictfp
{leave}
  ret {result} %r
}}
"""
    return b.call(helper, args)


def _switch(c, mode: str) -> tuple[str, str]:
    """IR text entering and leaving `mode`. On x86-64 only the SSE control register (MXCSR)
    changes: llvm.set.rounding also rewrites the x87 control word, which costs as much again
    and is not used by the SSE arithmetic LLVM emits."""
    if _X86:
        c.extra_ir.setdefault("mxcsr", "declare void @llvm.x86.sse.stmxcsr(ptr)\n"
                              "declare void @llvm.x86.sse.ldmxcsr(ptr)\n")
        bits = {"rn": 0, "rm": 1, "rp": 2, "rz": 3}[mode] << 13
        enter = f"""  %saved = alloca i32
  %changed = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %saved) strictfp
  %old = load i32, ptr %saved
  %cleared = and i32 %old, -24577
  %new = or i32 %cleared, {bits}
  store i32 %new, ptr %changed
  call void @llvm.x86.sse.ldmxcsr(ptr %changed) strictfp"""
        return enter, "  call void @llvm.x86.sse.ldmxcsr(ptr %saved) strictfp"
    c.extra_ir.setdefault("rounding", "declare i32 @llvm.get.rounding()\n"
                          "declare void @llvm.set.rounding(i32)\n")
    enter = f"""  %old = call i32 @llvm.get.rounding() strictfp
  call void @llvm.set.rounding(i32 {MODE_CODES[mode]}) strictfp"""
    return enter, "  call void @llvm.set.rounding(i32 %old) strictfp"


def flush(b, x):
    """An f32 subnormal to the zero of its sign (.ftz); other values unchanged."""
    bits = b.bitcast(x, I32)
    subnormal = b.icmp_unsigned("==", b.and_(bits, ir.Constant(I32, 0x7F800000)),
                                ir.Constant(I32, 0))
    return b.bitcast(b.select(subnormal, b.and_(bits, ir.Constant(I32, 0x80000000)), bits),
                     x.type)


def saturate(b, x):
    """.sat: NaN -> +0, below 0 -> +0 (-0 stays), above 1 -> 1, as numpy's clip."""
    zero, one = ir.Constant(x.type, 0.0), ir.Constant(x.type, 1.0)
    value = b.select(b.fcmp_ordered("<", x, zero), zero, x)
    value = b.select(b.fcmp_ordered(">", x, one), one, value)
    return b.select(b.fcmp_unordered("uno", x, x), zero, value)


# f16: 5 exponent bits, 10 significand bits; bf16: 8 and 7.
HALF_FORMATS = {"f16": (5, 10), "bf16": (8, 7)}


def _shared(b, name: str, ret: ir.Type, arg: ir.Type, body):
    """`name`, an internal function of the module whose body `body(builder,
    argument)` builds once: the half conversions are long, and inlining them at every use
    made big kernels take seconds to compile."""
    module = b.module
    function = module.globals.get(name)
    if function is None:
        function = ir.Function(module, ir.FunctionType(ret, [arg]), name)
        function.linkage = "internal"
        function.attributes.add("noinline")
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        builder.ret(body(builder, function.args[0]))
    return function


def round_to_half(b, value, fmt: str, mode: str):
    """A float64 (exact, or rounded to odd with bits to spare) rounded to f16/bf16 bits (i16)
    in `mode`, as the interpreter's f64_to_f16_bits / f64_to_bf16_bits: IEEE rounding,
    overflow to infinity or the largest finite number as the mode says; a NaN keeps the
    top of its payload (f16, as numpy) or becomes 0x7FFF (bf16)."""
    function = _shared(b, f"vgpu_round_{fmt}_{mode}", I16, F64,
                       lambda builder, v: _round_to_half(builder, v, fmt, mode))
    return b.call(function, [value])


def _round_to_half(b, value, fmt: str, mode: str):
    exp_bits, man_bits = HALF_FORMATS[fmt]
    bias = (1 << (exp_bits - 1)) - 1
    emin = 1 - bias
    bits = b.bitcast(value, I64)
    sign = b.trunc(b.lshr(bits, ir.Constant(I64, 48)), I16)
    sign = b.and_(sign, ir.Constant(I16, 0x8000))
    negative = b.icmp_unsigned("!=", sign, ir.Constant(I16, 0))
    magnitude = b.call(fabs64(b), [value])
    field = b.trunc(b.lshr(bits, ir.Constant(I64, 52)), I32)
    field = b.and_(field, ir.Constant(I32, 0x7FF))
    exponent = b.sub(field, ir.Constant(I32, 1023))
    low = b.icmp_signed("<", exponent, ir.Constant(I32, emin))
    exponent = b.select(low, ir.Constant(I32, emin), exponent)
    big = b.icmp_signed(">", exponent, ir.Constant(I32, bias))   # overflows in any mode
    exponent = b.select(big, ir.Constant(I32, bias), exponent)
    # magnitude / 2**(exponent - man_bits): exact (a power of two in range)
    scale_field = b.sub(ir.Constant(I32, 1023 + man_bits), exponent)
    scale = b.bitcast(b.shl(b.zext(scale_field, I64), ir.Constant(I64, 52)), F64)
    scaled = b.select(big, ir.Constant(F64, 0.0), b.fmul(magnitude, scale))
    whole = b.call(_unary(b, "llvm.trunc"), [scaled])
    fraction = b.fsub(scaled, whole)
    count = b.fptoui(whole, I64)
    inexact = b.fcmp_ordered("!=", fraction, ir.Constant(F64, 0.0))
    if mode == "rn":
        half = ir.Constant(F64, 0.5)
        odd = b.trunc(count, I1)
        up = b.or_(b.fcmp_ordered(">", fraction, half),
                   b.and_(b.fcmp_ordered("==", fraction, half), odd))
    elif mode == "rz":
        up = ir.Constant(I1, 0)
    elif mode == "rm":
        up = b.and_(inexact, negative)
    else:
        up = b.and_(inexact, b.not_(negative))
    count = b.add(count, b.zext(up, I64))
    encoded = b.add(b.shl(b.zext(b.sub(exponent, ir.Constant(I32, emin)), I64),
                          ir.Constant(I64, man_bits)), count)
    infinity = ((1 << exp_bits) - 1) << man_bits
    overflow = b.or_(big, b.icmp_unsigned(">=", encoded, ir.Constant(I64, infinity)))
    to_infinity = {"rn": ir.Constant(I1, 1), "rz": ir.Constant(I1, 0), "rm": negative,
                   "rp": b.not_(negative)}[mode]
    clamped = b.select(to_infinity, ir.Constant(I64, infinity), ir.Constant(I64, infinity - 1))
    encoded = b.trunc(b.select(overflow, clamped, encoded), I16)
    finite = b.or_(sign, encoded)
    is_inf = b.fcmp_ordered("==", magnitude, ir.Constant(F64, float("inf")))
    result = b.select(is_inf, b.or_(sign, ir.Constant(I16, infinity)), finite)
    if fmt == "bf16":
        nan = ir.Constant(I16, 0x7FFF)
    else:
        payload = b.trunc(b.lshr(b.and_(bits, ir.Constant(I64, (1 << 52) - 1)),
                                 ir.Constant(I64, 52 - man_bits)), I16)
        payload = b.select(b.icmp_unsigned("==", payload, ir.Constant(I16, 0)),
                           ir.Constant(I16, 1), payload)
        nan = b.or_(sign, b.or_(ir.Constant(I16, infinity), payload))
    return b.select(b.fcmp_unordered("uno", value, value), nan, result)


def to_odd(b, value, error):
    """value with the sign of the error folded into its last bit (round to odd)."""
    bits = b.bitcast(value, ir.IntType(64))
    even = b.icmp_unsigned("==", b.and_(bits, ir.Constant(bits.type, 1)),
                           ir.Constant(bits.type, 0))
    inexact = b.fcmp_ordered("!=", error, ir.Constant(F64, 0.0))
    away = b.icmp_unsigned("==", b.fcmp_ordered(">", error, ir.Constant(F64, 0.0)),
                           b.fcmp_ordered(">", value, ir.Constant(F64, 0.0)))
    step = b.select(away, ir.Constant(bits.type, 1), ir.Constant(bits.type, -1))
    moved = b.add(bits, step)
    return b.bitcast(b.select(b.and_(even, inexact), moved, bits), F64)


def half_to_f64(b, bits, fmt: str):
    """f16/bf16 bits (i16) as an exact float64 (a NaN keeps its payload, as numpy's)."""
    function = _shared(b, f"vgpu_widen_{fmt}", F64, I16,
                       lambda builder, v: _half_to_f64(builder, v, fmt))
    return b.call(function, [bits])


def _half_to_f64(b, bits, fmt: str):
    if fmt == "bf16":
        word = b.shl(b.zext(bits, I32), ir.Constant(I32, 16))
        return b.fpext(b.bitcast(word, F32), F64)
    wide = b.zext(bits, I64)
    sign = b.shl(b.and_(wide, ir.Constant(I64, 0x8000)), ir.Constant(I64, 48))
    field = b.and_(b.lshr(wide, ir.Constant(I64, 10)), ir.Constant(I64, 31))
    significand = b.and_(wide, ir.Constant(I64, 0x3FF))
    moved = b.shl(significand, ir.Constant(I64, 42))
    normal = b.or_(b.shl(b.add(field, ir.Constant(I64, 1008)), ir.Constant(I64, 52)), moved)
    special = b.or_(ir.Constant(I64, 0x7FF << 52), moved)
    tiny = b.bitcast(b.fmul(b.uitofp(significand, F64), ir.Constant(F64, 2.0 ** -24)), I64)
    magnitude = b.select(b.icmp_unsigned("==", field, ir.Constant(I64, 0)), tiny,
                         b.select(b.icmp_unsigned("==", field, ir.Constant(I64, 31)), special,
                                  normal))
    return b.bitcast(b.or_(sign, magnitude), F64)


def fabs64(b):
    """llvm.fabs.f64, declared in the builder's module."""
    return _unary(b, "llvm.fabs")


def _unary(b, name):
    module = b.module
    full = f"{name}.f64"
    return module.globals.get(full) or ir.Function(module, ir.FunctionType(F64, [F64]), full)
