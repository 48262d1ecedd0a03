"""Per-instruction tests: small hand-written PTX files (tests/emu/ptx/*.ptx), run with
chosen inputs, compared with exact Python references."""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from emu_reference import round_exactly

from vgpu.server.emu import LaunchError

PTX = Path(__file__).parent / "ptx"
M32 = 0xFFFFFFFF


def s32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def load(device, name):
    return device.load((PTX / name).read_text())


def run(device, mod, kernel, inputs: np.ndarray, out_words: int, out_dtype=np.uint32,
        threads=None):
    threads = threads or len(inputs)
    out = device.zeros(threads * out_words, out_dtype)
    device.launch(mod, kernel, (1,), (threads,), device.upload(inputs), out)
    return device.download(out, threads * out_words, out_dtype).reshape(threads, out_words)


INT_INPUTS = np.array([
    [7, 3, 11, 0], [0xFFFFFFFF, 2, 5, 1], [0x80000000, 0x80000000, 1, 2],
    [0x7FFFFFFF, 1, 0xFFFFFFFF, 3], [123456789, 987654321, 42, 4],
    [0xFFFFFF00, 0x00FFFFFF, 0x12345678, 5], [0, 0, 0, 6], [0xDEADBEEF, 0xCAFEF00D, 99, 7],
], np.uint32)


def test_integer_arithmetic(device):
    got = run(device, load(device, "integer.ptx"), "arith", INT_INPUTS, 16)
    for row, (a, b, c, _) in zip(got, INT_INPUTS.tolist(), strict=True):
        sa, sb, sc = s32(a), s32(b), s32(c)
        wide = sa * sb
        low24 = lambda v: v & 0xFFFFFF  # noqa: E731
        sext24 = lambda v: (v & 0xFFFFFF) - ((v & 0x800000) << 1)  # noqa: E731
        expected = [
            (a * b) & M32, (a * b) >> 32, ((sa * sb) >> 32) & M32, wide & M32,
            (wide >> 32) & M32, (sa * sb + sc) & M32, (((a * b) >> 32) + c) & M32,
            (low24(a) * low24(b)) & M32, ((sext24(a) * sext24(b)) >> 16) & M32,
            (sext24(a) * sext24(b) + sc) & M32,
            max(-2**31, min(2**31 - 1, sa + sb)) & M32, max(-2**31, min(2**31 - 1, sa - sb)) & M32,
            min(sa, sb) & M32, max(a, b), abs(sa) & M32, (abs(a - b) + c) & M32,
        ]
        np.testing.assert_array_equal(row, expected, err_msg=f"inputs {a, b, c}")


def _packed16(a, b, signed, fn):
    """The reference for a packed 16x2 instruction: fn on each pair of halves, wrapped."""
    def half(v, shift):
        h = (v >> shift) & 0xFFFF
        return h - 0x10000 if signed and h >> 15 else h
    return sum((fn(half(a, s), half(b, s)) & 0xFFFF) << s for s in (0, 16))


def test_packed_16bit_pairs(device):
    got = run(device, load(device, "integer.ptx"), "packed16", INT_INPUTS, 12)
    relu_min = lambda x, y: max(min(x, y), 0)  # noqa: E731
    relu_max = lambda x, y: max(x, y, 0)  # noqa: E731
    for row, (a, b, _, _) in zip(got, INT_INPUTS.tolist(), strict=True):
        expected = [
            _packed16(a, b, False, lambda x, y: x + y), _packed16(a, b, True, lambda x, y: x - y),
            _packed16(a, b, False, min), _packed16(a, b, True, min),
            _packed16(a, b, False, max), _packed16(a, b, True, max),
            _packed16(a, b, True, relu_min), _packed16(a, b, True, relu_max),
            _packed16(a, 0x00017FFF, True, min), _packed16(a, 0x80000001, False, max), 0, 0,
        ]
        np.testing.assert_array_equal(row, expected, err_msg=f"inputs {a, b}")


def test_carry_chains_and_64bit_high_multiply(device):
    got = run(device, load(device, "integer.ptx"), "carry", INT_INPUTS, 12)
    for row, (lo1, hi1, lo2, hi2) in zip(got, INT_INPUTS.tolist(), strict=True):
        x, y = lo1 | hi1 << 32, lo2 | hi2 << 32
        total, diff, product = (x + y) % 2**64, (x - y) % 2**64, x * y
        words = [total & M32, total >> 32, diff & M32, diff >> 32]
        words += [(product >> (32 * k)) & M32 for k in range(4)]
        sx, sy = x - (x >> 63 << 64), y - (y >> 63 << 64)
        hi_u, hi_s = (x * y) >> 64, ((sx * sy) >> 64) % 2**64
        np.testing.assert_array_equal(row[:8], words)
        assert int(row[8]) | int(row[9]) << 32 == hi_u
        assert int(row[10]) | int(row[11]) << 32 == hi_s


def _bfe(value, pos, length, signed):
    if length == 0:
        return 0
    bits = [(value >> min(pos + i, 31)) & 1 if pos + i <= 31 else (value >> 31) & 1 if signed
            else 0 for i in range(length)]
    if not signed:
        bits = [(value >> (pos + i)) & 1 if pos + i <= 31 else 0 for i in range(length)]
    result = sum(b << i for i, b in enumerate(bits[:32]))
    if signed and bits[min(length, 32) - 1]:
        result |= (M32 << min(length, 32)) & M32
    return result & M32


def _prmt(a, b, c, mode):
    pool = a | b << 32
    out = 0
    for i in range(4):
        if mode == "default":
            sel = (c >> (4 * i)) & 0xF
            byte = (pool >> (8 * (sel & 7))) & 0xFF
            if sel & 8:
                byte = 0xFF if byte & 0x80 else 0
        else:
            s = c & 3
            index = {"f4e": (s + i) & 7, "b4e": (s - i) & 7, "ecl": max(s, i)}[mode]
            byte = (pool >> (8 * index)) & 0xFF
        out |= byte << (8 * i)
    return out


def test_bit_manipulation(device):
    got = run(device, load(device, "integer.ptx"), "bits", INT_INPUTS, 20)
    for row, (a, b, c, d) in zip(got, INT_INPUTS.tolist(), strict=True):
        pos, length = c & 63, d & 63
        sa = s32(a)
        bfind_s = (~sa if sa < 0 else sa).bit_length() - 1
        mask = ((1 << min(length, 32)) - 1) << pos if pos < 32 else 0
        funnel = b << 32 | a
        lop = ((a & b) | (a & c) | (b & c))  # 0xE8 is the majority function
        expected = [
            bin(a).count("1"), 32 - a.bit_length(), int(f"{a:032b}"[::-1], 2),
            a.bit_length() - 1 if a else M32, bfind_s if bfind_s >= 0 else M32,
            31 - (a.bit_length() - 1) if a else M32,
            _bfe(a, pos, length, False), _bfe(a, pos, length, True),
            ((a & ~mask) | ((b << pos) & mask)) & M32,
            _prmt(a, b, c, "default"), _prmt(a, b, c, "f4e"), _prmt(a, b, c, "b4e"),
            _prmt(a, b, c, "ecl"), ((funnel << (c & 31)) >> 32) & M32,
            (funnel >> min(c, 32)) & M32, lop,
            (a << pos) & M32 if pos < 32 else 0, a >> pos if pos < 32 else 0,
            (sa >> min(pos, 31)) & M32, ~a & M32,
        ]
        np.testing.assert_array_equal(row, expected, err_msg=f"inputs {a:#x} {b:#x} {c} {d}")


F32_INPUTS = np.array([
    [1.0, 3.0, 0.5, 0], [-2.5, 1e-3, 7.0, 0], [1e30, 1e30, -1.0, 0], [3.0, -0.0, 1.0, 0],
    [np.nan, 1.0, 2.0, 0], [0.1, 0.2, 0.3, 0], [1.0, 2.0 ** -30, -1.0, 0],
    [-np.inf, 5.0, 0.0, 0], [1e-39, 1e-39, 0, 0], [16777216.0, 1.0, 0.0, 0],
], np.float32)


def test_float_arithmetic_and_rounding(device):
    got = run(device, load(device, "float.ptx"), "arith", F32_INPUTS, 16, np.float32)
    f32 = np.float32
    with np.errstate(all="ignore"):
        for row, (a, b, c, _) in zip(got, F32_INPUTS, strict=True):
            finite = all(np.isfinite([a, b, c])) and b != 0
            if finite:
                A, B, C = Fraction(float(a)), Fraction(float(b)), Fraction(float(c))
                assert row[0] == round_exactly(A + B, "rn", f32)
                assert row[1] == round_exactly(A + B, "rz", f32)
                assert row[2] == round_exactly(A - B, "rm", f32)
                assert row[3] == round_exactly(A * B, "rp", f32)
                assert row[4] == round_exactly(A * B + C, "rn", f32)
                assert row[5] == round_exactly(A * B + C, "rz", f32)
                assert row[6] == round_exactly(A / B, "rn", f32)
                assert row[7] == round_exactly(A / B, "rp", f32)
            np.testing.assert_array_equal(row[8], np.sqrt(a))
            np.testing.assert_array_equal(row[9], f32(1) / b)
            expected_min = b if np.isnan(a) else min(a, b)
            np.testing.assert_array_equal(row[10], expected_min)
            np.testing.assert_array_equal(row[11], b if np.isnan(a) else max(a, b))
            assert row[12].view(np.uint32) == a.view(np.uint32) & 0x7FFFFFFF
            assert row[13].view(np.uint32) == b.view(np.uint32) ^ 0x80000000
            sat = a + b
            np.testing.assert_array_equal(row[14], 0 if np.isnan(sat) else np.clip(sat, 0, 1))
            product = a * b
            if abs(product) < np.finfo(f32).tiny:
                product = f32(math.copysign(0, product))
            np.testing.assert_array_equal(row[15], product)


def test_float_approximate_functions(device):
    x = np.array([[v, 0, 0, 0] for v in (0.5, 1.0, 2.0, 3.75, 10.0, 0.01)], np.float32)
    got = run(device, load(device, "float.ptx"), "approx", x, 8, np.float32)
    v = x[:, 0].astype(np.float64)
    expected = np.stack([2 ** v, np.log2(v), np.sin(v), np.cos(v), 1 / np.sqrt(v), np.tanh(v),
                         1 / v, np.sqrt(v)], 1)
    np.testing.assert_allclose(got, expected, rtol=2e-6)


def test_double_fma_and_directed_rounding(device):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((64, 4)) * np.array([1e3, 1e-3, 1, 0])
    values[0] = [1 + 2 ** -52, 1 - 2 ** -53, -1, 0]   # fma differs from mul+add here
    values[1] = [1e300, 1e10, -np.inf, 0]
    values[2] = [4.0, 0.0, 1.0, 0]
    got = run(device, load(device, "float.ptx"), "double", values, 8, np.float64)
    f64 = np.float64
    for row, (a, b, c, _) in zip(got, values, strict=True):
        if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)) or b == 0:
            continue
        A, B, C = Fraction(a), Fraction(b), Fraction(c)
        assert row[0] == float(A * B + C)
        assert row[1] == round_exactly(A + B, "rz", f64)
        assert row[2] == round_exactly(A * B, "rm", f64)
        assert row[3] == round_exactly(A / B, "rp", f64)
        if a >= 0:
            assert row[4] == np.sqrt(a)
            root = row[5]
            assert Fraction(root) ** 2 <= A < Fraction(np.nextafter(root, np.inf)) ** 2
        assert row[6] == min(a, b)
        assert row[7] == round_exactly(A * B + C, "rp", f64)
    assert got[0, 0] != values[0, 0] * values[0, 1] + values[0, 2]
    assert got[1, 0] == -np.inf


COMPARE_PAIRS = np.array([[1, 2], [2, 1], [3, 3], [np.nan, 1], [1, np.nan], [-0.0, 0.0],
                          [np.inf, np.inf], [-np.inf, 5]], np.float32)


def test_comparisons(device):
    got = run(device, load(device, "compare.ptx"), "compare", COMPARE_PAIRS, 4)
    for row, (a, b) in zip(got, COMPARE_PAIRS, strict=True):
        nan = bool(np.isnan(a) or np.isnan(b))
        ordered = [a == b, (a != b) and not nan, a < b, a <= b, a > b, a >= b]
        unordered = [o or nan for o in [a == b, a != b, a < b, a <= b, a > b, a >= b]]
        bits = ordered + unordered + [not nan, nan]
        bits += [(a < b) and not nan, (not (a < b)) and not nan, (a > b) or nan]
        mask = sum(1 << k for k, v in enumerate(bits) if v)
        assert row[0] == mask, (a, b, bin(int(row[0])), bin(mask))
        assert row[1] == (M32 if a > b else 0)
        assert row[2].view(np.float32) == (1.0 if a <= b else 0.0)
        # slct: a where c (= a) >= 0, -0 included; b where it is not, NaN included.
        assert row[3] == np.float32(a if a >= 0 else b).view(np.uint32)


def test_integer_comparisons(device):
    pairs = np.array([[1, 2], [0xFFFFFFFF, 1], [5, 5], [0x80000000, 0x7FFFFFFF]], np.uint32)
    got = run(device, load(device, "compare.ptx"), "icompare", pairs, 1)
    for value, (a, b) in zip(got[:, 0], pairs.astype(np.int64), strict=True):
        sa, sb = s32(a), s32(b)
        bits = [sa < sb, a < b, a >= b, not sa >= sb, a != b]
        assert value == sum(1 << k for k, v in enumerate(bits) if v)


def test_float_to_int_conversions(device):
    x = np.array([2.5, -2.5, 3.7, -3.7, 1e10, -1e10, np.nan, 300.6, -129.5, 0.49999997],
                 np.float32)
    got = run(device, load(device, "convert.ptx"), "float_to_int", x, 8).view(np.int32)
    for row, v in zip(got, x.astype(np.float64), strict=True):
        def sat(r, lo, hi):
            return 0 if math.isnan(r) else int(min(max(r, lo), hi))
        rn = np.rint(v)
        expected = [sat(rn, -2**31, 2**31 - 1), sat(np.trunc(v), -2**31, 2**31 - 1),
                    sat(np.floor(v), -2**31, 2**31 - 1), sat(np.ceil(v), -2**31, 2**31 - 1),
                    s32(sat(np.trunc(v), 0, M32)), sat(rn, -128, 127),
                    sat(np.trunc(v), 0, 65535), max(-128, min(127, sat(np.trunc(v), -2**31,
                                                                          2**31 - 1)))]
        np.testing.assert_array_equal(row, expected, err_msg=str(v))


def test_int_to_float_conversions(device):
    values = np.array([0, 1, -1, 2**24 + 1, -(2**24 + 1), 2**53 + 1, -(2**62) - 12345,
                       2**63 - 1, -2**63, 123456789012345], np.int64)
    got = run(device, load(device, "convert.ptx"), "int_to_float", values, 8, np.float32)
    for row, v in zip(got, values, strict=True):
        exact = Fraction(int(v))
        for k, mode in enumerate(("rn", "rz", "rm", "rp")):
            assert row[k] == round_exactly(exact, mode, np.float32), (v, mode)
        assert row[4] == round_exactly(Fraction(int(v) % 2**64), "rn", np.float32)
        as_f64 = round_exactly(exact, "rz", np.float64)
        assert row[6] == round_exactly(Fraction(float(as_f64)), "rn", np.float32)
        assert row[7] == round_exactly(Fraction(float(as_f64)), "rm", np.float32)


def test_half_conversions(device):
    x = np.array([1.0, 0.1, -3.14159, 65519.0, 70000.0, 1e-7, np.inf, -0.0], np.float32)
    got = run(device, load(device, "convert.ptx"), "halves", x, 4)
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16)
    for row, v, h in zip(got, x, f16, strict=True):
        rz = round_exactly(Fraction(float(v)), "rz", np.float16) if np.isfinite(v) and v else h
        assert row[0] & 0xFFFF == h.view(np.uint16)
        assert row[0] >> 16 == np.float16(rz).view(np.uint16)
        bits = int(v.view(np.uint32))
        rn_bf = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        up_bf = (bits >> 16) + (1 if bits & 0xFFFF and not bits >> 31 else 0)
        assert row[1] & 0xFFFF == rn_bf
        assert row[1] >> 16 == up_bf
        assert row[2] >> 16 == row[2] & 0xFFFF == h.view(np.uint16)
        assert np.uint32(row[3]).view(np.float32) == np.float32(h)


def test_memory_spaces_and_generic_addressing(device):
    mod = load(device, "memory.ptx")
    out = device.zeros(32 * 16, np.uint32)
    blob = struct.pack("<IIII", 1, 22, 333, 4444)
    device.launch(mod, "spaces", (1,), (32,), out, blob)
    got = device.download(out, 32 * 16, np.uint32).reshape(32, 16)
    t = np.arange(32)
    np.testing.assert_array_equal(got[:, 0], (t ^ 1) + 100)
    np.testing.assert_array_equal(got[:, 1], (t ^ 1) + 200)
    np.testing.assert_array_equal(got[:, 2], 3 * t)
    np.testing.assert_array_equal(got[:, 3], [10, 20, 30, 40] * 8)
    assert (got[:, 4] == 20).all()
    assert (got[:, 5] == 7).all()
    assert (got[:, 6] == 22).all() and (got[:, 7] == 333).all() and (got[:, 8] == 4444).all()
    assert sorted(got[:, 9]) == list(range(32))  # atom.add: each lane saw a different count
    assert (got[:, 10] == 32).all()
    assert (got[:, 11] == 30).all()


def test_warp_operations(device):
    mod = load(device, "warp.ptx")
    x = np.array([5, 9, 2, 7, 7, 1, 3, 8, 6, 4, 0, 11] + list(range(20, 40)) +
                 list(range(100, 116)), np.uint32)   # 48 threads: a full and a half warp
    got = run(device, mod, "warp", x, 8)
    n = len(x)
    for i in range(n):
        warp, lane = divmod(i, 32)
        size = min(32, n - 32 * warp)
        base = 32 * warp
        seg = lane & ~7
        members = x[base:base + size]
        assert got[i, 0] == x[base + seg + 3] if seg + 3 < size else got[i, 0] == x[i]
        up_src = lane - 1
        up_ok = up_src >= (lane & 0x18)
        assert got[i, 1] == (x[base + up_src] if up_ok else x[i])
        bf = lane ^ 16
        assert got[i, 2] == (x[base + bf] if bf < size else x[i])
        ballot = sum(1 << k for k in range(size) if members[k] & 1)
        assert got[i, 3] == ballot
        assert got[i, 4] == int(ballot == 0 or ballot == (1 << size) - 1)
        same = sum(1 << k for k in range(size) if members[k] & 3 == x[i] & 3)
        assert got[i, 5] == same
        assert got[i, 6] == (1 if seg + 3 < size else 0) | (2 if up_ok else 0)
        assert got[i, 7] == np.bitwise_xor.reduce(members)


def test_votes_count_only_lanes_executing_together(device):
    mod = load(device, "warp.ptx")
    out = device.zeros(32, np.uint32)
    device.launch(mod, "diverged", (1,), (32,), out)
    got = device.download(out, 32, np.uint32)
    odd_mask = 0xAAAAAAAA
    even_ballot = sum(1 << k for k in range(0, 8, 2))
    np.testing.assert_array_equal(got, [even_ballot if t % 2 == 0 else odd_mask
                                        for t in range(32)])


def test_calls_jump_tables_exit_and_loops(device):
    mod = load(device, "control.ptx")
    pairs = np.array([[17, 5], [3, 0], [99, 4], [22, 7], [23, 9], [4, 2], [5, 3], [6, 1]],
                     np.uint32)
    got = run(device, mod, "control", pairs, 4)
    for row, (a, b) in zip(got, pairs.astype(int), strict=True):
        q, r = (a // b, a % b) if b else (0, a)
        assert list(row[:3]) == [q, r, (a % 17) * b]
        if a == 99:
            assert row[3] == 0xDEAD   # the thread exited inside `pick`
        else:
            k = a & 3
            expected = [100, 200, 300, 7 if a > 20 else 400][k]
            assert row[3] == expected


def test_recursion_without_end_overflows_the_call_stack(device):
    mod = load(device, "control.ptx")
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "recursion", (1,), (1,))
    assert info.value.code == 700
    assert "call stack overflow" in info.value.message


def test_special_registers(device):
    mod = load(device, "special.ptx")
    out = device.zeros(2 * 12 * 16, np.uint32)
    device.launch(mod, "special", (2,), (4, 3), out, shared=96)
    got = device.download(out, 2 * 12 * 16, np.uint32).reshape(24, 16)
    for block in range(2):
        for ty in range(3):
            for tx in range(4):
                row = got[block * 12 + ty * 4 + tx]
                linear = ty * 4 + tx
                lane = linear % 32
                assert list(row[:8]) == [tx, ty, 4, 3, block, 2, lane, linear // 32]
                assert row[8] == (1 << lane) - 1
                assert row[9] == (M32 << lane) & M32
                assert row[10] == 1 << lane
                assert row[11] == 96
                assert list(row[12:14]) == [1, 0]
                assert row[14:16].view(np.uint64)[0] > 1_600_000_000 * 10**9


def test_syntax_forms(device):
    mod = load(device, "syntax.ptx")
    assert mod.kernels["syntax"].attributes["max_threads_per_block"] == 64
    assert mod.variables["nested"].init == struct.pack("<4i", 1, -2, 3, -4)
    out = device.zeros(4 * 16, np.uint32)
    device.launch(mod, "syntax", (1,), (4,), out)
    got = device.download(out, 4 * 16, np.uint32).reshape(4, 16)
    for t, row in enumerate(got):
        expected = [0xFF, 0o17, 0b101, (-5) & M32, M32, 0x3FC00000,
                    np.float32(3.5).view(np.uint32), 3, (-4) & M32, 9, 1000 + t, 0xFF + t,
                    int(t < 2), 2 * t, ord("i"), ord("i")]
        np.testing.assert_array_equal(row, expected, err_msg=f"thread {t}")


BMSK_PTX = """
.version 7.8
.target sm_75
.address_size 64
.visible .entry k(.param .u64 in, .param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    mov.u32 %r0, %tid.x;
    ld.param.u64 %rd0, [in];
    ld.param.u64 %rd1, [out];
    mul.wide.u32 %rd2, %r0, 8;
    add.s64 %rd3, %rd0, %rd2;
    add.s64 %rd4, %rd1, %rd2;
    mul.wide.u32 %rd2, %r0, 16;
    add.s64 %rd4, %rd1, %rd2;
    ld.global.v2.u32 {%r1, %r2}, [%rd3];
    bmsk.clamp.b32 %r3, %r1, %r2;
    bmsk.wrap.b32 %r4, %r1, %r2;
    szext.clamp.s32 %r5, %r1, %r2;
    szext.wrap.u32 %r6, %r1, %r2;
    st.global.v4.u32 [%rd4], {%r3, %r4, %r5, %r6};
    ret;
}
"""


def test_bit_masks_and_extensions(device):
    pairs = np.array([[1, 2], [4, 0], [30, 5], [40, 3], [3, 40], [0, 32], [0xF5, 4],
                      [0x80, 8], [0x7F, 8]], np.uint32)
    got = run(device, device.load(BMSK_PTX), "k", pairs, 4)

    def bmsk(a, b, clamp):
        a1, b1 = a & 31, b & 31
        mask0 = (M32 << a1) & M32
        if clamp and a >= 32:
            mask0 = 0
        overflow = a1 + b1 >= 32 or (clamp and (a >= 32 or b >= 32))
        mask1 = 0 if overflow else (M32 if b1 == 0 else (M32 << (a1 + b1)) & M32)
        return mask0 & ~mask1 & M32

    def szext(a, b, clamp, signed):
        n = min(b, 32) if clamp else b & 31
        value = a & ((1 << n) - 1)
        if signed and 0 < n < 32 and value >> (n - 1):
            value -= 1 << n
        return value & M32
    for row, (a, b) in zip(got, pairs.tolist(), strict=True):
        assert list(row) == [bmsk(a, b, True), bmsk(a, b, False), szext(a, b, True, True),
                             szext(a, b, False, False)], (a, b)
