"""mma.sync, ldmatrix, movmatrix and cvt.tf32 as single PTX instructions: every thread of a
warp loads its fragment registers from memory, the instruction runs, every thread stores
its result registers. The host builds the fragments with the layouts the PTX ISA's tables
give for each shape (written out here shape by shape) and checks D = A x B + C against
exact arithmetic: f16/bf16/tf32 products summed exactly and rounded once (the inputs keep
every sum within float64's precision, where the emulator's float64 sum is exact), f64 as a
chain of fused multiply-adds, integers exactly (wrapped, or clamped by .satfinite).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from emu_reference import round_exactly

from vgpu.server.emu import LaunchError, PtxError, PtxModule

HEADER = ".version 7.8\n.target sm_80\n.address_size 64\n"
REGISTER = {"f16": ".b32", "bf16": ".b32", "tf32": ".b32", "s8": ".b32", "u8": ".b32",
            "s4": ".b32", "u4": ".b32", "b1": ".b32", "f32": ".f32", "s32": ".s32",
            "f64": ".f64"}
BITS = {"f16": 16, "bf16": 16, "tf32": 32, "f32": 32, "s32": 32, "f64": 64, "s8": 8, "u8": 8,
        "s4": 4, "u4": 4, "b1": 1}


# -- the PTX ISA's fragment layouts, one table per shape ("Matrix Fragments for mma.m*n*k*")

def a_position(shape: str, kind: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    bits = BITS[kind]
    if shape == "m8n8k4":                                          # f64
        return g, t
    if bits == 16:
        row = g if i in (0, 1, 4, 5) else g + 8
        return row, t * 2 + (i & 1) + (8 if i >= 4 else 0)
    if kind == "tf32":
        row = g if i in (0, 2) else g + 8
        return row, t if i < 2 else t + 4
    per = 32 // bits                                              # 8-bit, 4-bit, 1-bit
    if shape.startswith("m8"):
        return g, t * per + i
    row = g if (i // per) % 2 == 0 else g + 8
    return row, t * per + (i % per) + (4 * per if i >= 2 * per else 0)


def b_position(shape: str, kind: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    bits = BITS[kind]
    if shape == "m8n8k4":
        return t, g
    if bits == 16:
        return t * 2 + (i & 1) + (8 if i >= 2 else 0), g
    if kind == "tf32":
        return (t if i == 0 else t + 4), g
    per = 32 // bits
    return t * per + (i % per) + (4 * per if i >= per else 0), g


def c_position(shape: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if shape.startswith("m8"):
        return g, t * 2 + i
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


# -- element encodings -----------------------------------------------------------------------

def to_bits(kind: str, value) -> int:
    if kind == "f16":
        return int(np.float16(value).view(np.uint16))
    if kind == "bf16":
        return int(np.float32(value).view(np.uint32)) >> 16
    if kind in ("tf32", "f32"):
        return int(np.float32(value).view(np.uint32))
    if kind == "f64":
        return int(np.float64(value).view(np.uint64))
    return int(value) & ((1 << BITS[kind]) - 1)


def from_bits(kind: str, bits: int):
    """An element's exact value (a Fraction; a float for infinities and NaN)."""
    value = _decoded(kind, bits)
    return value if not isinstance(value, float) or not np.isfinite(value) else Fraction(value)


def _decoded(kind: str, bits: int):
    if kind == "f16":
        return float(np.uint16(bits).view(np.float16))
    if kind == "bf16":
        return float(np.uint32(bits << 16).view(np.float32))
    if kind == "tf32":   # the tensor cores read tf32's 19 bits: the low 13 are ignored
        return float(np.uint32(bits & 0xFFFFE000).view(np.float32))
    if kind == "f32":
        return float(np.uint32(bits).view(np.float32))
    if kind == "f64":
        return float(np.uint64(bits).view(np.float64))
    width = BITS[kind]
    if kind[0] == "s" and bits >> (width - 1):
        return bits - (1 << width)
    return bits


def fragments(kind: str, matrix: dict, positions, elements: int) -> np.ndarray:
    """(32, registers) register words holding each lane's elements of `matrix` (element
    bits by (row, col))."""
    per = max(1, 32 // BITS[kind]) if BITS[kind] < 32 else 1
    words = np.zeros((32, elements // per), np.uint64)
    for lane in range(32):
        for i in range(elements):
            bits = matrix[positions(lane, i)]
            words[lane, i // per] |= np.uint64(bits << (BITS[kind] * (i % per)))
    return words


def elements_of(words: np.ndarray, kind: str, count: int) -> list[list[int]]:
    per = max(1, 32 // BITS[kind]) if BITS[kind] < 32 else 1
    mask = (1 << BITS[kind]) - 1
    return [[(int(words[lane, i // per]) >> (BITS[kind] * (i % per))) & mask
             for i in range(count)] for lane in range(32)]


# -- the kernel ------------------------------------------------------------------------------

def mma_kernel(instruction: str, counts: dict[str, int], kinds: dict[str, str]) -> str:
    """A kernel(pa, pb, pc, pd) in which thread t loads its registers of A, B, C from
    p + t * (registers * size) and stores D's likewise."""
    lines = [HEADER, ".visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, "
             ".param .u64 pd)\n{", ".reg .b32 %t;", ".reg .b64 %p<9>;"]
    for name in "abcd":
        lines.append(f".reg {REGISTER[kinds[name]]} %{name}<{counts[name]}>;")
    lines.append("mov.u32 %t, %tid.x;")
    for n, name in enumerate("abcd"):
        size = 8 if kinds[name] == "f64" else 4
        lines += [f"ld.param.u64 %p{n}, [p{name}];",
                  f"mul.wide.u32 %p{n + 4}, %t, {counts[name] * size};",
                  f"add.u64 %p{n}, %p{n}, %p{n + 4};"]
    for n, name in enumerate("abc"):
        size = 8 if kinds[name] == "f64" else 4
        suffix = REGISTER[kinds[name]]
        lines += [f"ld.global{suffix} %{name}{r}, [%p{n}+{r * size}];"
                  for r in range(counts[name])]
    regs = {name: "{" + ", ".join(f"%{name}{r}" for r in range(counts[name])) + "}"
            for name in "abcd"}
    lines.append(f"{instruction} {regs['d']}, {regs['a']}, {regs['b']}, {regs['c']};")
    size = 8 if kinds["d"] == "f64" else 4
    lines += [f"st.global{REGISTER[kinds['d']]} [%p3+{r * size}], %d{r};"
              for r in range(counts["d"])]
    lines.append("ret;\n}")
    return "\n".join(lines)


def random_values(rng, kind: str, count: int, wide: bool = False) -> list:
    if kind in ("f16", "bf16"):
        if wide:  # arbitrary values: the sums need the final rounding
            return [float(np.float16(v)) if kind == "f16" else
                    float(np.uint32(int(np.float32(v).view(np.uint32)) & 0xFFFF0000)
                          .view(np.float32)) for v in rng.uniform(-2, 2, count)]
        return list(rng.integers(-8, 9, count) / 4)
    if kind == "tf32":   # f32 values whose low 13 bits the instruction must ignore
        return list(rng.uniform(-2, 2, count).astype(np.float32))
    if kind == "f64":
        return list(rng.uniform(-2, 2, count))
    if kind == "f32":
        return list(rng.uniform(-8, 8, count).astype(np.float32))
    if kind == "s32":
        return list(rng.integers(-1000, 1000, count))
    width = BITS[kind]
    if kind[0] == "s":
        return list(rng.integers(-(1 << (width - 1)), 1 << (width - 1), count))
    return list(rng.integers(0, 1 << width, count))


def run_mma(device, shape, dtype, atype, btype, ctype, modifiers="", rng_seed=0, wide=False,
            c_override=None, a_override=None):
    m, n, k = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
    rng = np.random.default_rng(rng_seed)
    a_values = random_values(rng, atype, m * k, wide)
    a = dict(zip([(r, c) for r in range(m) for c in range(k)],
                 (to_bits(atype, v) for v in (a_override(a_values) if a_override else a_values)),
                 strict=True))
    b = dict(zip([(r, c) for r in range(k) for c in range(n)],
                 (to_bits(btype, v) for v in random_values(rng, btype, k * n, wide)),
                 strict=True))
    c_values = c_override(rng, m * n) if c_override else random_values(rng, ctype, m * n)
    c = dict(zip([(r, col) for r in range(m) for col in range(n)],
                 (to_bits(ctype, v) for v in c_values), strict=True))
    per = {kind: (32 // BITS[kind] if BITS[kind] < 32 else 1) for kind in BITS}
    count = {"a": m * k // 32, "b": k * n // 32, "c": m * n // 32}
    regs = {"a": count["a"] // per[atype], "b": count["b"] // per[btype],
            "c": count["c"] // per[ctype], "d": count["c"] // per[dtype]}
    kinds = {"a": atype, "b": btype, "c": ctype, "d": dtype}
    words = {
        "a": fragments(atype, a, lambda lane, i: a_position(shape, atype, lane, i), count["a"]),
        "b": fragments(btype, b, lambda lane, i: b_position(shape, btype, lane, i), count["b"]),
        "c": fragments(ctype, c, lambda lane, i: c_position(shape, lane, i), count["c"]),
    }
    instruction = (f"mma.sync.aligned.{shape}.row.col{modifiers}.{dtype}.{atype}.{btype}."
                   f"{ctype}")
    if atype == "b1":
        instruction += ".xor.popc" if "xor" in modifiers else ".and.popc"
        instruction = instruction.replace(".xor.s32", ".s32")
    module = device.load(mma_kernel(instruction, regs, kinds))
    word_type = {kind: (np.uint64 if kind == "f64" else np.uint32) for kind in BITS}
    pointers = [device.upload(words[name].astype(word_type[kinds[name]])) for name in "abc"]
    out = device.zeros(32 * regs["d"], word_type[dtype])
    device.launch(module, "k", (1,), (32,), *pointers, out)
    got = device.download(out, 32 * regs["d"], word_type[dtype]).reshape(32, regs["d"])
    result = {}
    for lane, values in enumerate(elements_of(got, dtype, count["c"])):
        for i, bits in enumerate(values):
            result[c_position(shape, lane, i)] = bits
    return m, n, k, {key: from_bits(atype, v) for key, v in a.items()}, \
        {key: from_bits(btype, v) for key, v in b.items()}, \
        {key: from_bits(ctype, v) for key, v in c.items()}, result


FLOAT_CASES = [
    ("m16n8k16", "f32", "f16", "f16", "f32"), ("m16n8k16", "f16", "f16", "f16", "f16"),
    ("m16n8k16", "f32", "f16", "f16", "f16"), ("m16n8k16", "f16", "f16", "f16", "f32"),
    ("m16n8k8", "f32", "f16", "f16", "f32"), ("m16n8k8", "f16", "f16", "f16", "f16"),
    ("m16n8k16", "f32", "bf16", "bf16", "f32"), ("m16n8k8", "f32", "bf16", "bf16", "f32"),
    ("m16n8k8", "f32", "tf32", "tf32", "f32"), ("m16n8k4", "f32", "tf32", "tf32", "f32"),
]


@pytest.mark.parametrize("wide", [False, True], ids=["exact", "rounded"])
@pytest.mark.parametrize("shape,dtype,atype,btype,ctype", FLOAT_CASES,
                         ids=[".".join(case) for case in FLOAT_CASES])
def test_floating_point_mma_matches_the_exact_product_rounded_once(
        device, shape, dtype, atype, btype, ctype, wide):
    m, n, k, a, b, c, got = run_mma(device, shape, dtype, atype, btype, ctype, wide=wide)
    target = np.float16 if dtype == "f16" else np.float32
    for row in range(m):
        for col in range(n):
            exact = c[row, col] + sum(a[row, j] * b[j, col] for j in range(k))
            expected = round_exactly(exact, "rn", target)
            assert from_bits(dtype, got[row, col]) == Fraction(float(expected)), (row, col)


def test_infinities_and_nans_propagate_as_in_ieee_arithmetic(device):
    def specials(values):   # row 0 holds +inf, row 1 a NaN, row 2 both infinities
        values = list(values)
        values[0 * 16 + 3] = float("inf")
        values[1 * 16 + 5] = float("nan")
        values[2 * 16 + 0], values[2 * 16 + 1] = float("inf"), float("-inf")
        return values
    m, n, k, a, b, c, got = run_mma(device, "m16n8k16", "f32", "f16", "f16", "f32",
                                    a_override=specials)
    result = {key: float(np.uint32(bits).view(np.float32)) for key, bits in got.items()}
    for col in range(n):
        b3, b0, b1 = b[3, col], b[0, col], b[1, col]
        if b3 == 0:
            assert np.isnan(result[0, col]), col              # inf * 0
        else:
            assert result[0, col] == (np.inf if b3 > 0 else -np.inf), col
        assert np.isnan(result[1, col])
        if b0 == 0 or b1 == 0 or b0 * b1 > 0:                 # inf * 0, or inf - inf
            assert np.isnan(result[2, col]), col
        else:
            assert result[2, col] == (np.inf if b0 > 0 else -np.inf), col
    finite = [(r, col) for r in range(3, m) for col in range(n)]
    assert all(np.isfinite(result[key]) for key in finite)


def test_f64_mma_is_a_chain_of_fused_multiply_adds(device):
    m, n, k, a, b, c, got = run_mma(device, "m8n8k4", "f64", "f64", "f64", "f64")
    for row in range(m):
        for col in range(n):
            d = c[row, col]
            for j in range(k):
                d = Fraction(float(a[row, j] * b[j, col] + d))   # each step rounded once
            assert from_bits("f64", got[row, col]) == d, (row, col)


INTEGER_CASES = [
    ("m8n8k16", "s8", "s8"), ("m16n8k16", "u8", "s8"), ("m16n8k32", "s8", "u8"),
    ("m16n8k32", "u8", "u8"), ("m8n8k32", "s4", "s4"), ("m16n8k32", "u4", "s4"),
    ("m16n8k64", "s4", "u4"),
]


def _wrap32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


@pytest.mark.parametrize("shape,atype,btype", INTEGER_CASES,
                         ids=[".".join(case) for case in INTEGER_CASES])
def test_integer_mma_is_exact(device, shape, atype, btype):
    m, n, k, a, b, c, got = run_mma(device, shape, "s32", atype, btype, "s32")
    for row in range(m):
        for col in range(n):
            exact = c[row, col] + sum(a[row, j] * b[j, col] for j in range(k))
            assert from_bits("s32", got[row, col]) == _wrap32(exact), (row, col)


@pytest.mark.parametrize("satfinite", [False, True])
def test_integer_mma_wraps_or_saturates(device, satfinite):
    def near_limits(rng, count):   # accumulators that the products push past the s32 range
        return [(2**31 - 10) if i % 2 else -(2**31) + 10 for i in range(count)]
    m, n, k, a, b, c, got = run_mma(device, "m16n8k32", "s32", "u8", "u8", "s32",
                                    ".satfinite" if satfinite else "", c_override=near_limits)
    moved = 0
    for row in range(m):
        for col in range(n):
            exact = c[row, col] + sum(a[row, j] * b[j, col] for j in range(k))
            expected = max(-2**31, min(2**31 - 1, exact)) if satfinite else _wrap32(exact)
            assert from_bits("s32", got[row, col]) == expected, (row, col)
            moved += not -2**31 <= exact < 2**31
    assert moved > 0   # the inputs did leave the range


@pytest.mark.parametrize("shape", ["m8n8k128", "m16n8k128", "m16n8k256"])
@pytest.mark.parametrize("op", ["and", "xor"])
def test_single_bit_mma_counts_bits(device, shape, op):
    m, n, k, a, b, c, got = run_mma(device, shape, "s32", "b1", "b1", "s32",
                                    ".xor" if op == "xor" else "")
    for row in range(m):
        for col in range(n):
            bits = sum((a[row, j] & b[j, col]) if op == "and" else (a[row, j] ^ b[j, col])
                       for j in range(k))
            assert from_bits("s32", got[row, col]) == c[row, col] + bits, (row, col)


@pytest.mark.parametrize("instruction,message", [
    ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f64", "not a valid combination"),
    ("mma.sync.aligned.m16n8k16.col.col.f32.f16.f16.f32", ".row.col"),
    ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32.and.popc", "only b1"),
])
def test_malformed_mma_fails_at_load(instruction, message):
    kinds = {"a": "f16", "b": "f16", "c": "f32", "d": "f32"}
    counts = {"a": 4, "b": 2, "c": 4, "d": 4}
    with pytest.raises(PtxError, match=message):
        PtxModule.parse(mma_kernel(instruction, counts, kinds))


def test_unimplemented_mma_shapes_fail_the_launch_naming_them(device):
    # Volta's m8n8k4 f16 shape (quad-pair fragments) is not implemented.
    kinds = {"a": "f16", "b": "f16", "c": "f16", "d": "f16"}
    counts = {"a": 2, "b": 2, "c": 4, "d": 4}
    module = device.load(mma_kernel("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16",
                                    counts, kinds))
    pointers = [device.zeros(32 * 4, np.uint32) for _ in range(4)]
    with pytest.raises(LaunchError) as info:
        device.launch(module, "k", (1,), (32,), *pointers)
    assert info.value.code == 801 and "m8n8k4" in info.value.message


# -- ldmatrix, movmatrix ---------------------------------------------------------------------

LDMATRIX = HEADER + """
.visible .entry k(.param .u64 src, .param .u64 dst)
{
    .shared .align 16 .b16 tile[256];
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    .reg .pred %p;
    mov.u32 %r1, %tid.x;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    // copy the four 8x8 matrices (256 halves) into shared memory, 8 per thread
    mul.wide.u32 %rd3, %r1, 16;
    add.u64 %rd4, %rd1, %rd3;
    ld.global.v4.b32 {%r2, %r3, %r4, %r5}, [%rd4];
    mov.u32 %r6, tile;
    mul.lo.u32 %r7, %r1, 16;
    add.u32 %r8, %r6, %r7;
    st.shared.v4.b32 [%r8], {%r2, %r3, %r4, %r5};
    bar.sync 0;
    // thread t names row t % 8 of matrix t / 8, rows stored in reverse order
    and.b32 %r9, %r1, 7;
    sub.u32 %r9, 7, %r9;
    shr.u32 %r10, %r1, 3;
    shl.b32 %r10, %r10, 3;
    add.u32 %r9, %r9, %r10;
    mul.lo.u32 %r9, %r9, 16;
    add.u32 %r9, %r6, %r9;
    ldmatrix.sync.aligned.m8n8.x4TRANS.shared.b16 {%r2, %r3, %r4, %r5}, [%r9];
    add.u64 %rd5, %rd2, %rd3;
    st.global.v4.b32 [%rd5], {%r2, %r3, %r4, %r5};
    ret;
}
"""


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_gives_each_thread_its_fragment_of_four_matrices(device, trans):
    halves = np.arange(256, dtype=np.uint16) * 3 + 1
    module = device.load(LDMATRIX.replace("TRANS", ".trans" if trans else ""))
    src = device.upload(halves)
    out = device.zeros(32 * 4, np.uint32)
    device.launch(module, "k", (1,), (32,), src, out)
    got = device.download(out, 128, np.uint32).reshape(32, 4)
    for j in range(4):
        rows = halves[64 * j:64 * j + 64].reshape(8, 8)[::-1]   # row r came from thread 7-r
        matrix = rows.T if trans else rows
        for lane in range(32):
            g, t = lane // 4, lane % 4
            expected = int(matrix[g, 2 * t]) | int(matrix[g, 2 * t + 1]) << 16
            assert got[lane, j] == expected, (j, lane)


# Thread t reads word t of `src` into %r2, then BODY runs (with %rd2 = dst, %rd3 = 4 * t).
PER_THREAD = HEADER + """
.visible .entry k(.param .u64 src, .param .u64 dst)
{
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;
    mov.u32 %r1, %tid.x;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd1, %rd3;
    ld.global.b32 %r2, [%rd4];
    BODY
    ret;
}
"""
MOVMATRIX = PER_THREAD.replace("BODY", """
    movmatrix.sync.aligned.m8n8.trans.b16 %r3, %r2;
    add.u64 %rd4, %rd2, %rd3;
    st.global.b32 [%rd4], %r3;""")


def test_movmatrix_transposes_a_fragment(device):
    matrix = (np.arange(64, dtype=np.uint16) * 7 + 5).reshape(8, 8)
    lanes = np.arange(32)
    words = (matrix[lanes // 4, 2 * (lanes % 4)].astype(np.uint32)
             | matrix[lanes // 4, 2 * (lanes % 4) + 1].astype(np.uint32) << 16)
    module = device.load(MOVMATRIX)
    out = device.zeros(32, np.uint32)
    device.launch(module, "k", (1,), (32,), device.upload(words), out)
    transposed = matrix.T
    expected = (transposed[lanes // 4, 2 * (lanes % 4)].astype(np.uint32)
                | transposed[lanes // 4, 2 * (lanes % 4) + 1].astype(np.uint32) << 16)
    np.testing.assert_array_equal(device.download(out, 32, np.uint32), expected)


# -- cvt to tf32 -----------------------------------------------------------------------------

CVT_TF32 = PER_THREAD.replace("BODY", """
    cvt.rna.tf32.f32 %r3, %r2;
    cvt.rn.tf32.f32 %r4, %r2;
    cvt.rz.satfinite.tf32.f32 %r5, %r2;
    mul.wide.u32 %rd3, %r1, 12;
    add.u64 %rd4, %rd2, %rd3;
    st.global.b32 [%rd4], %r3;
    st.global.b32 [%rd4+4], %r4;
    st.global.b32 [%rd4+8], %r5;""")


def _tf32_reference(bits: int, mode: str) -> int:
    """An f32 rounded to 10 significand bits, by exact arithmetic on its value."""
    value = float(np.uint32(bits).view(np.float32))
    if np.isnan(value):
        return 0x7FFFFFFF
    if np.isinf(value) or value == 0:
        return bits
    sign = bits & 0x80000000
    magnitude = abs(Fraction(value))
    step = Fraction(2) ** (max(int(np.frexp(value)[1]) - 1, -126) - 10)
    units, rest = divmod(magnitude, step)
    if mode == "rz":
        up = False
    elif mode == "rna":
        up = rest * 2 >= step
    else:
        up = rest * 2 > step or (rest * 2 == step and units % 2 == 1)
    result = (units + up) * step
    if result >= 2 ** 128:
        return sign | 0x7F800000
    return sign | int(np.float32(float(result)).view(np.uint32))


def test_cvt_to_tf32_rounds_to_ten_significand_bits(device):
    samples = [0x3F800000, 0x3F801000, 0x3F803000, 0x3F802FFF, 0xBF801000, 0xBF803000,
               0x00001000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0x3FFFF000,
               0x40490FDB, 0xC0490FDB]
    module = device.load(CVT_TF32)
    out = device.zeros(3 * len(samples), np.uint32)
    device.launch(module, "k", (1,), (len(samples),),
                  device.upload(np.array(samples, np.uint32)), out)
    got = device.download(out, 3 * len(samples), np.uint32).reshape(-1, 3)
    for row, bits in zip(got.tolist(), samples, strict=True):
        rz = _tf32_reference(bits, "rz")
        if (rz & 0x7FFFFFFF) == 0x7F800000 and (bits & 0x7FFFFFFF) == 0x7F800000:
            rz = (bits & 0x80000000) | 0x7F7FE000        # .satfinite: the largest finite
        assert row == [_tf32_reference(bits, "rna"), _tf32_reference(bits, "rn"), rz], \
            hex(bits)
