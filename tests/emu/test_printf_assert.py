"""Device printf (compared with the host C library's printf) and device assert."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from vgpu.server.emu import LaunchError, prepare

# (format, C argument list): the same calls run on the device and in a host C program.
CALLS = [
    ('"int %d %i %5d|%-5d|%05d %+d\\n"', "t, -t, t * 7, t, t, t"),
    ('"unsigned %u %x %X %o %#x %#o %08x\\n"',
     "(unsigned)(t - 2), 255u + t, 48879u, 8u + t, 255u, 8u, t"),
    ('"long %ld %lld %lu %llu %lx\\n"',
     "-(long)t * 3000000000L, 1LL << 40, 5000000000UL, ~0ULL, 0xabcdef12345UL"),
    ('"float %f %.2f %10.3f %e %.3E %g %G %g\\n"',
     "1.5 * t, 3.14159, -2.5, 12345.678, 0.000123, 0.0001, 1e20, 100000.0"),
    ('"char %c%c %s [%8s] [%-6s] %.2s\\n"',
     "'A' + t, 'z', \"str\", \"right\", \"left\", \"truncate\""),
    ('"percent 100%% width %*d prec %.*f\\n"', "6, t, 3, 2.0 / 3.0"),
    ('"short %hd %hu %hhd\\n"', "(short)-2, (unsigned short)65535, (signed char)-1"),
]


def _source(device: bool) -> str:
    body = "\n".join(f"    printf({fmt}, {args});" for fmt, args in CALLS)
    if device:
        return ("#include <cstdio>\nextern \"C\" __global__ void k() {\n"
                "    int t = threadIdx.x + 10 * blockIdx.x;\n" + body + "\n}\n")
    return ("#include <stdio.h>\nint main(void) {\n  for (int b = 0; b < 2; ++b)\n"
            "  for (int x = 0; x < 3; ++x) {\n    int t = x + 10 * b;\n" + body + "\n  }\n"
            "  return 0;\n}\n")


def test_printf_matches_c_printf(device, toolkit, tmp_path):
    mod = device.load(toolkit.ptx(_source(device=True)))
    result = device.launch(mod, "k", (2,), (3,))
    source = tmp_path / "host.c"
    source.write_text(_source(device=False))
    exe = tmp_path / "host"
    subprocess.run(["gcc", "-w", "-o", str(exe), str(source)], check=True)
    expected = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert result.printf == expected


def test_printf_order_is_block_then_thread(device, toolkit):
    src = r"""
    #include <cstdio>
    extern "C" __global__ void k(int rounds) {
        for (int r = 0; r < rounds; ++r)
            if ((threadIdx.x + r) % 2 == 0) printf("b%d t%d r%d\n", blockIdx.x, threadIdx.x, r);
    }"""
    mod = device.load(toolkit.ptx(src))
    out = device.launch(mod, "k", (2,), (4,), 3).printf
    expected = "".join(f"b{b} t{t} r{r}\n" for b in range(2) for t in range(4) for r in range(3)
                       if (t + r) % 2 == 0)
    assert out == expected


ASSERT_SOURCE = r"""
#include <cassert>
#include <cstdio>
extern "C" __global__ void check(const int* v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        printf("checking %d\n", i);
        assert(v[i] >= 0);
    }
}
"""


def test_assert_fails_launch_with_code_710(device, toolkit):
    mod = device.load(toolkit.ptx(ASSERT_SOURCE))
    values = np.zeros(64, np.int32)
    values[37] = -1
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "check", (2,), (32,), device.upload(values), 64)
    err = info.value
    assert err.code == 710
    assert "block: [1,0,0], thread: [5,0,0] Assertion `v[i] >= 0` failed." in err.message
    assert "check" in err.message and ".cu:" in err.message
    assert err.output == "".join(f"checking {i}\n" for i in range(64))  # all, none lost
    assert err.diagnostics.endswith(  # for stderr, CUDA's line per failing thread
        ": void check(const int *, int): block: [1,0,0], thread: [5,0,0] "
        "Assertion `v[i] >= 0` failed.\n")
    assert err.diagnostics.count("\n") == 1


def test_every_failing_thread_gets_its_assert_line_in_order(device, toolkit):
    mod = device.load(toolkit.ptx(ASSERT_SOURCE))
    values = np.ones(64, np.int32)
    values[[40, 3, 9]] = -1
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "check", (2,), (32,), device.upload(values), 64)
    lines = info.value.diagnostics.splitlines()
    assert [line.split(": ", 2)[2] for line in lines] == [
        f"block: [{i // 32},0,0], thread: [{i % 32},0,0] Assertion `v[i] >= 0` failed."
        for i in (3, 9, 40)]
    assert all(line.split(": ")[0].endswith(".cu:8") for line in lines)  # file:line


def test_printf_fifo_keeps_the_first_records_that_fit(device, toolkit):
    src = r"""
    #include <cstdio>
    extern "C" __global__ void k() { printf("line %d\n", threadIdx.x); }"""
    mod = device.load(toolkit.ptx(src))
    prepared = prepare(mod, "k", (1,), (100,), symbols=device.symbols[id(mod)])
    everything = prepared.run(b"", device.memory).printf
    assert everything == "".join(f"line {t}\n" for t in range(100))
    # A record: 16 bytes of header and format address, one int argument rounded to 8.
    assert prepared.run(b"", device.memory, printf_fifo_bytes=24 * 10).printf == \
        "".join(f"line {t}\n" for t in range(10))
    assert prepared.run(b"", device.memory, printf_fifo_bytes=24 * 10 - 1).printf == \
        "".join(f"line {t}\n" for t in range(9))


def test_passing_asserts_do_not_fail(device, toolkit):
    mod = device.load(toolkit.ptx(ASSERT_SOURCE))
    result = device.launch(mod, "check", (1,), (8,), device.upload(np.arange(8, dtype=np.int32)),
                           8)
    assert result.printf == "".join(f"checking {i}\n" for i in range(8))
