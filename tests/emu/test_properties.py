"""Property tests (Hypothesis): instruction semantics against exact Python references.

Each property compiles one instruction into a tiny kernel (`d = op(a, b, c)` per thread)
and checks every lane. Semantics the ISA leaves to the implementation follow the GPU:
integer division by zero gives all ones (`div.u`), the dividend (`rem`), -1 or 1 (`div.s`);
shifts clamp at the width; float->int conversions saturate with NaN -> 0; min/max return
the non-NaN operand.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from emu_reference import round_exactly
from hypothesis import given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=60, deadline=None)
TEMPLATE = """
.version 7.8
.target sm_75
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd,
                  .param .u32 n)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    .reg .{ra} %a;
    .reg .{rb} %b;
    .reg .{rc} %c;
    .reg .{rd} %d;
    mov.u32 %r0, %tid.x;
    ld.param.u32 %r1, [n];
    setp.ge.u32 %p1, %r0, %r1;
    @%p1 ret;
    ld.param.u64 %rd0, [pa];
    mul.wide.u32 %rd4, %r0, {sa};
    add.s64 %rd0, %rd0, %rd4;
    ld.global.{ra} %a, [%rd0];
    ld.param.u64 %rd1, [pb];
    mul.wide.u32 %rd5, %r0, {sb};
    add.s64 %rd1, %rd1, %rd5;
    ld.global.{rb} %b, [%rd1];
    ld.param.u64 %rd2, [pc];
    mul.wide.u32 %rd6, %r0, {sc};
    add.s64 %rd2, %rd2, %rd6;
    ld.global.{rc} %c, [%rd2];
    {op};
    ld.param.u64 %rd3, [pd];
    mul.wide.u32 %rd7, %r0, {sd};
    add.s64 %rd3, %rd3, %rd7;
    st.global.{rd} [%rd3], %d;
}}
"""
_DTYPES = {"u16": np.uint16, "s16": np.int16, "u32": np.uint32, "s32": np.int32,
           "u64": np.uint64, "s64": np.int64, "f32": np.float32, "f64": np.float64,
           "b32": np.uint32, "b64": np.uint64}
_modules: dict[str, object] = {}


def run_op(device, op: str, types: tuple[str, str, str, str], a, b=None, c=None):
    """Run `op` (operands %d, %a, %b, %c) with register types (d, a, b, c)."""
    rd, ra, rb, rc = types
    n = len(a)
    b = b if b is not None else [0] * n
    c = c if c is not None else [0] * n
    key = f"{op}|{types}"
    mod = _modules.get(key)
    if mod is None:
        text = TEMPLATE.format(op=op, ra=ra, rb=rb, rc=rc, rd=rd,
                               **{f"s{k}": np.dtype(_DTYPES[t]).itemsize
                                  for k, t in zip("abcd", (ra, rb, rc, rd), strict=True)})
        mod = _modules[key] = device.load(text)
    arrays = [np.array(v, dtype=_DTYPES[t]) for v, t in ((a, ra), (b, rb), (c, rc))]
    out = device.zeros(n, _DTYPES[rd])
    device.launch(mod, "k", (1,), (max(n, 1),), *(device.upload(x) for x in arrays), out, n)
    return device.download(out, n, _DTYPES[rd])


def wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


INT_TYPES = [("u32", 32, False), ("s32", 32, True), ("u64", 64, False), ("s64", 64, True)]


def ints(bits, signed, size=None):
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    edge = st.sampled_from([lo, hi, 0, 1, -1 if signed else hi - 1, lo + 1])
    return st.lists(st.one_of(st.integers(lo, hi), edge), min_size=1, max_size=32)


@pytest.mark.parametrize("name,bits,signed", INT_TYPES)
@SETTINGS
@given(data=st.data())
def test_integer_wraparound(module_device, name, bits, signed, data):
    a = data.draw(ints(bits, signed))
    b = data.draw(st.lists(st.integers(-(1 << (bits - 1)) if signed else 0,
                                       (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1),
                           min_size=len(a), max_size=len(a)))
    t = (name, name, name, name)
    for op, ref in [("add", lambda x, y: x + y), ("sub", lambda x, y: x - y),
                    ("mul.lo", lambda x, y: x * y),
                    ("mul.hi", lambda x, y: (x * y) >> bits)]:
        got = run_op(module_device, f"{op}.{name} %d, %a, %b", t, a, b)
        expected = [wrap(ref(x, y), bits, signed) for x, y in zip(a, b, strict=True)]
        assert [int(v) for v in got] == expected, op


@pytest.mark.parametrize("name,bits,signed", [("u32", 32, False), ("s32", 32, True)])
@SETTINGS
@given(data=st.data())
def test_mul_wide(module_device, name, bits, signed, data):
    a = data.draw(ints(bits, signed))
    b = data.draw(ints(bits, signed).filter(lambda v: True), label="b")[:len(a)]
    a = a[:len(b)]
    wide = name[0] + "64"
    got = run_op(module_device, f"mul.wide.{name} %d, %a, %b", (wide, name, name, name), a, b)
    assert [int(v) for v in got] == [wrap(x * y, 64, signed) for x, y in zip(a, b, strict=True)]


def _div_ref(x, y, bits, signed):
    if y == 0:
        return ((1 if x < 0 else -1) if signed else (1 << bits) - 1), x
    q = abs(x) // abs(y)
    if (x < 0) != (y < 0):
        q = -q
    return wrap(q, bits, signed), wrap(x - q * y, bits, signed)


@pytest.mark.parametrize("name,bits,signed", INT_TYPES)
@SETTINGS
@given(data=st.data())
def test_division_including_zero_and_overflow(module_device, name, bits, signed, data):
    a = data.draw(ints(bits, signed))
    b = data.draw(st.lists(st.one_of(st.just(0), st.just(-1 if signed else 1),
                                     st.integers(-(1 << (bits - 1)) if signed else 0,
                                                 (1 << (bits - 1)) - 1)),
                           min_size=len(a), max_size=len(a)))
    t = (name,) * 4
    q = run_op(module_device, f"div.{name} %d, %a, %b", t, a, b)
    r = run_op(module_device, f"rem.{name} %d, %a, %b", t, a, b)
    for x, y, gq, gr in zip(a, b, q, r, strict=True):
        assert (int(gq), int(gr)) == _div_ref(x, y, bits, signed), (x, y)


@pytest.mark.parametrize("bits", [32, 64])
@SETTINGS
@given(data=st.data())
def test_shifts_clamp_at_width(module_device, bits, data):
    a = data.draw(ints(bits, True))
    n = data.draw(st.lists(st.one_of(st.integers(0, 2 * bits), st.integers(0, 2**32 - 1)),
                           min_size=len(a), max_size=len(a)))
    s, u, b = f"s{bits}", f"u{bits}", f"b{bits}"
    shl = run_op(module_device, f"shl.{b} %d, %a, %b", (s, s, "u32", s), a, n)
    shr_u = run_op(module_device, f"shr.u{bits} %d, %a, %b", (u, s, "u32", s), a, n)
    shr_s = run_op(module_device, f"shr.s{bits} %d, %a, %b", (s, s, "u32", s), a, n)
    mask = (1 << bits) - 1
    for x, k, g1, g2, g3 in zip(a, n, shl, shr_u, shr_s, strict=True):
        assert int(g1) == (wrap(x << k, bits, True) if k < bits else 0)
        assert int(g2) == ((x & mask) >> k if k < bits else 0)
        assert int(g3) == x >> min(k, bits - 1)


def _negative(v) -> bool:
    return math.copysign(1.0, float(v)) < 0


def _zero_sum_is_negative(p_negative: bool, p_zero: bool, q_negative: bool, q_zero: bool,
                          mode: str) -> bool:
    """IEEE 754: the sign of p + q when it is exactly zero. Zeros of one sign keep it;
    otherwise (opposite zeros, or cancellation) +0, but -0 when rounding down."""
    if p_zero and q_zero and p_negative == q_negative:
        return p_negative
    return mode == "rm"


def exact_zero(op: str, mode: str, x, y, z) -> float:
    """The signed zero IEEE 754 gives when the exact result of `op` is 0."""
    if op in ("mul", "div"):
        negative = _negative(x) != _negative(y)
    elif op == "fma":
        negative = _zero_sum_is_negative(_negative(x) != _negative(y), x == 0 or y == 0,
                                         _negative(z), z == 0, mode)
    else:
        other = y if op == "add" else -y
        negative = _zero_sum_is_negative(_negative(x), x == 0, _negative(other), other == 0,
                                         mode)
    return -0.0 if negative else 0.0


def assert_same_float(got, expected, context) -> None:
    """Equal values, zeros of the same sign included."""
    assert got == expected and np.signbit(got) == np.signbit(expected), (context, got, expected)


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any32 = st.floats(width=32)


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
@SETTINGS
@given(data=st.data())
def test_f32_rounding_modes(module_device, mode, data):
    a = data.draw(st.lists(finite32, min_size=1, max_size=16))
    b = data.draw(st.lists(finite32.filter(lambda v: v != 0), min_size=len(a),
                           max_size=len(a)))
    c = data.draw(st.lists(finite32, min_size=len(a), max_size=len(a)))
    t = ("f32",) * 4
    ops = {
        "add": lambda x, y, z: x + y, "sub": lambda x, y, z: x - y,
        "mul": lambda x, y, z: x * y, "div": lambda x, y, z: x / y,
        "fma": lambda x, y, z: x * y + z,
    }
    for op, ref in ops.items():
        got = run_op(module_device, f"{op}.{mode}.f32 %d, %a, %b, %c" if op == "fma"
                     else f"{op}.{mode}.f32 %d, %a, %b", t, a, b, c)
        for x, y, z, g in zip(a, b, c, got, strict=True):
            exact = ref(Fraction(x), Fraction(y), Fraction(z))
            expected = exact_zero(op, mode, x, y, z) if exact == 0 else \
                round_exactly(exact, mode, np.float32)
            assert_same_float(g, expected, (op, mode, x, y, z))


finite64 = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_f64_zero_products_keep_their_sign(module_device, mode):
    """Zero times a number too large for the emulator's fast path is a zero whose sign is
    the exclusive or of the operands' signs, as every product's."""
    a = [0.0, -0.0, 0.0, -0.0]
    b = [-3.348464397457086e299, 3e299, 3e299, -3e299]
    got = run_op(module_device, f"mul.{mode}.f64 %d, %a, %b", ("f64",) * 4, a, b)
    assert list(got) == [0.0] * 4
    assert [bool(np.signbit(g)) for g in got] == [True, True, False, False]


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
@SETTINGS
@given(data=st.data())
def test_f64_fma_and_rounding(module_device, mode, data):
    a = data.draw(st.lists(finite64, min_size=1, max_size=16))
    b = data.draw(st.lists(finite64.filter(lambda v: abs(v) > 1e-300), min_size=len(a),
                           max_size=len(a)))
    c = data.draw(st.lists(finite64, min_size=len(a), max_size=len(a)))
    t = ("f64",) * 4
    for op, ref in {"fma": lambda x, y, z: x * y + z, "add": lambda x, y, z: x + y,
                    "mul": lambda x, y, z: x * y, "div": lambda x, y, z: x / y}.items():
        text = f"{op}.{mode}.f64 %d, %a, %b, %c" if op == "fma" else f"{op}.{mode}.f64 %d, %a, %b"
        got = run_op(module_device, text, t, a, b, c)
        for x, y, z, g in zip(a, b, c, got, strict=True):
            exact = ref(Fraction(x), Fraction(y), Fraction(z))
            expected = exact_zero(op, mode, x, y, z) if exact == 0 else \
                round_exactly(exact, mode, np.float64)
            assert_same_float(g, expected, (op, mode, x, y, z))


@SETTINGS
@given(a=st.lists(st.floats(min_value=0, allow_infinity=False, allow_nan=False),
                  min_size=1, max_size=16))
def test_f64_sqrtround_exactly(module_device, a):
    for mode in ("rn", "rz", "rp"):
        got = run_op(module_device, f"sqrt.{mode}.f64 %d, %a", ("f64",) * 4, a)
        for x, g in zip(a, got, strict=True):
            root = Fraction(float(g))
            if mode == "rn":
                assert g == math.sqrt(x)
            elif mode == "rz":
                assert root ** 2 <= Fraction(x) < Fraction(float(np.nextafter(g, np.inf))) ** 2
            else:
                assert root ** 2 >= Fraction(x) > Fraction(float(np.nextafter(g, 0))) ** 2 \
                    or x == 0


_RANGES = {"s32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "s64": (-2**63, 2**63 - 1),
           "u64": (0, 2**64 - 1), "s16": (-2**15, 2**15 - 1), "u16": (0, 2**16 - 1)}
_ROUND = {"rni": lambda v: round(v), "rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil}


@pytest.mark.parametrize("dst", list(_RANGES))
@pytest.mark.parametrize("src", ["f32", "f64"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_float_to_int_saturates_and_nan_is_zero(module_device, dst, src, data):
    width = 32 if src == "f32" else 64
    a = data.draw(st.lists(st.one_of(st.floats(width=width),
                                     st.sampled_from([2.5, -2.5, 0.5, -0.5, 1e30, -1e30])),
                           min_size=1, max_size=16))
    lo, hi = _RANGES[dst]
    for mode, fn in _ROUND.items():
        got = run_op(module_device, f"cvt.{mode}.{dst}.{src} %d, %a", (dst, src, src, src), a)
        for x, g in zip(a, got, strict=True):
            if math.isnan(x):
                expected = 0
            elif math.isinf(x):
                expected = hi if x > 0 else lo
            else:
                expected = min(max(fn(Fraction(x)), lo), hi)
            assert int(g) == expected, (mode, x)


@pytest.mark.parametrize("dst,src", [("s16", "s32"), ("u16", "s32"), ("s32", "s64"),
                                     ("u32", "s64"), ("u32", "u64"), ("s64", "u64"),
                                     ("u64", "s64"), ("u16", "u32")])
@SETTINGS
@given(data=st.data())
def test_int_conversions(module_device, dst, src, data):
    bits = int(src[1:])
    a = data.draw(ints(bits, src[0] == "s"))
    lo, hi = _RANGES[dst]
    dbits = int(dst[1:])
    plain = run_op(module_device, f"cvt.{dst}.{src} %d, %a", (dst, src, src, src), a)
    sat = run_op(module_device, f"cvt.sat.{dst}.{src} %d, %a", (dst, src, src, src), a)
    for x, g, gs in zip(a, plain, sat, strict=True):
        assert int(g) == wrap(x, dbits, dst[0] == "s")
        assert int(gs) == min(max(x, lo), hi)


@pytest.mark.parametrize("ptype", ["f32", "f64"])
@SETTINGS
@given(data=st.data())
def test_min_max_return_the_non_nan_operand(module_device, ptype, data):
    width = 32 if ptype == "f32" else 64
    a = data.draw(st.lists(st.floats(width=width), min_size=1, max_size=16))
    b = data.draw(st.lists(st.floats(width=width), min_size=len(a), max_size=len(a)))
    t = (ptype,) * 4
    low = run_op(module_device, f"min.{ptype} %d, %a, %b", t, a, b)
    high = run_op(module_device, f"max.{ptype} %d, %a, %b", t, a, b)
    for x, y, lo, hi in zip(a, b, low, high, strict=True):
        if math.isnan(x) and math.isnan(y):
            assert math.isnan(lo) and math.isnan(hi)
        elif math.isnan(x) or math.isnan(y):
            other = y if math.isnan(x) else x
            assert lo == other and hi == other
        elif x == 0 and y == 0:
            assert math.copysign(1, lo) == (-1 if math.copysign(1, x) < 0
                                            or math.copysign(1, y) < 0 else 1)
            assert math.copysign(1, hi) == (1 if math.copysign(1, x) > 0
                                            or math.copysign(1, y) > 0 else -1)
        else:
            assert lo == min(x, y) and hi == max(x, y)


@SETTINGS
@given(a=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=16))
def test_int64_to_float_rounding(module_device, a):
    for mode in ("rn", "rz", "rm", "rp"):
        got = run_op(module_device, f"cvt.{mode}.f32.s64 %d, %a", ("f32", "s64", "s64", "s64"),
                     a)
        gotd = run_op(module_device, f"cvt.{mode}.f64.s64 %d, %a", ("f64", "s64", "s64", "s64"),
                      a)
        for x, g, gd in zip(a, got, gotd, strict=True):
            assert g == round_exactly(Fraction(x), mode, np.float32)
            assert gd == round_exactly(Fraction(x), mode, np.float64)


@pytest.mark.parametrize("mode", ["rz", "rm", "rp"])
def test_division_by_zero_is_an_exact_infinity(module_device, mode):
    """x / 0 is an exact infinity, which no directed mode rounds to the largest finite number
    as it does an overflow."""
    a = [1.5, -2.0, 3e38]
    b = [0.0, 0.0, -0.0]
    for ptype in ("f32", "f64"):
        quotient = run_op(module_device, f"div.{mode}.{ptype} %d, %a, %b", (ptype,) * 4, a, b)
        reciprocal = run_op(module_device, f"rcp.{mode}.{ptype} %d, %a", (ptype,) * 4, b)
        assert list(quotient) == [math.inf, -math.inf, -math.inf]
        assert list(reciprocal) == [math.inf, math.inf, -math.inf]
