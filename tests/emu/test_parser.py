"""Module loading: what is parsed, what is refused (at load, with the line), and linking."""

from __future__ import annotations

import numpy as np
import pytest

from vgpu.server.emu import LaunchError, PtxError, PtxModule, link

HEADER = ".version 7.8\n.target sm_75\n.address_size 64\n"


def kernel(body: str, decls: str = ".reg .b32 %r<4>;") -> str:
    return HEADER + f".visible .entry k(.param .u64 p)\n{{\n{decls}\n{body}\nret;\n}}\n"


@pytest.mark.parametrize("body,fragment,line", [
    ("add.u32 %r1, %r2;", "expected 3 operands", 7),
    ("add.q32 %r1, %r2, %r3;", "expected 1 type modifier(s)", 7),
    ("mov.u32 %r1, %r9x;", "undeclared register '%r9x'", 7),
    ("mov.u32 %r1, %r2;\n.bogus 3;", "unsupported directive '.bogus'", 8),
    ("bra NOWHERE;", "branch target must be a label", 7),
    ("ld.global.u32 %r1, [missing];", "unknown symbol 'missing'", 7),
    ("call.uni nothing, ();", "undeclared function 'nothing'", 7),
    ("add.f32 %r1, %r2, %r3, %r1;", "expected 3 operands, got 4", 7),
    ("cvt.f32.s32 %r1, %r2;", "need .rn, .rz, .rm or .rp", 7),
])
def test_unsupported_constructs_fail_at_load_with_line(body, fragment, line):
    with pytest.raises(PtxError) as info:
        PtxModule.parse(kernel(body))
    assert fragment in str(info.value)
    assert info.value.line == line
    assert str(info.value).startswith(f"line {line}:")


UNSUPPORTED_IN_A_FUNCTION = HEADER + """
.global .align 4 .u32 counter = 5;
.func (.param .b32 r) helper(.param .b32 x)
{
    .reg .b32 %r<3>;
    ld.param.u32 %r1, [x];
    INSTRUCTION
    st.param.b32 [r], %r2;
    ret;
}
.visible .entry reaches(.param .u64 p)
{
    .param .b32 a;
    .param .b32 r;
    st.param.b32 [a], 1;
    call.uni (r), helper, (a);
    ret;
}
.visible .entry elsewhere(.param .u64 p)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    ld.global.u32 %r1, [counter];
    add.u32 %r2, %r1, 1;
    st.global.u32 [%rd1], %r2;
    ret;
}
"""


@pytest.mark.parametrize("instruction,fragment", [
    ("frobnicate.u32 %r2, %r1;", "unsupported instruction 'frobnicate.u32'"),
    ("add.wrap.u32 %r2, %r1, %r1;", "unsupported modifier(s) .wrap"),
    ("vadd.s32.s32.s32.sat %r2, %r1, %r1;", "unsupported instruction"),
])
def test_unsupported_instructions_fail_only_the_launches_that_reach_them(device, instruction,
                                                                         fragment):
    mod = device.load(UNSUPPORTED_IN_A_FUNCTION.replace("INSTRUCTION", instruction))
    out = device.zeros(1, np.uint32)
    device.launch(mod, "elsewhere", (1,), (1,), out)
    assert device.download(out, 1, np.uint32)[0] == 6
    with pytest.raises(LaunchError) as info:
        device.launch(mod, "reaches", (1,), (1,), out)
    assert info.value.code == 801  # CUDA_ERROR_NOT_SUPPORTED
    message = info.value.message
    assert message.startswith("kernel 'reaches' cannot run on the emulator: PTX line 10: ")
    assert instruction.split()[0] in message and fragment in message


def test_labels_are_scoped_by_blocks(device):
    # The same label in sibling blocks (inline PTX inlined twice), a forward branch to the
    # block's own label, and an outer label reached from inside a block.
    body = """
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 0;
    { setp.eq.u32 %p1, %r1, 0; @%p1 bra SKIP; add.u32 %r1, %r1, 100; SKIP: add.u32 %r1, %r1, 1; }
    { setp.eq.u32 %p1, %r1, 1; @%p1 bra SKIP; add.u32 %r1, %r1, 10; SKIP: add.u32 %r1, %r1, 2; }
    { bra OUT; add.u32 %r1, %r1, 1000; }
OUT:
    st.global.u32 [%rd1], %r1;
    """
    mod = device.load(kernel(body, decls=""))
    out = device.zeros(1, np.uint32)
    device.launch(mod, "k", (1,), (1,), out)
    assert device.download(out, 1, np.uint32)[0] == 1 + 2  # both branches taken, forward
    with pytest.raises(PtxError, match="label 'SKIP' defined twice"):
        PtxModule.parse(kernel("{ SKIP: ret; SKIP: ret; }"))


def test_unresolved_externals_fail_at_load():
    text = HEADER + ".extern .func (.param .b32 r) helper(.param .b32 x);\n" + \
        ".visible .entry k()\n{\n.param .b32 a;\n.param .b32 r;\n" \
        "call.uni (r), helper, (a);\nret;\n}\n"
    with pytest.raises(PtxError, match="helper"):
        PtxModule.parse(text)
    with pytest.raises(PtxError, match="unresolved external variable 'shared_counter'"):
        PtxModule.parse(HEADER + ".extern .global .align 4 .u32 shared_counter;\n")


def test_module_metadata():
    text = HEADER + """
.global .align 8 .b8 blob[10] = {1, 2, 3};
.const .align 4 .f32 scale = 0f40000000;
.global .align 8 .u64 ptr = generic(blob)+2;
.visible .entry k(.param .u8 a, .param .align 16 .b8 s[24], .param .f64 d, .param .u32 n)
.reqntid 32, 2
{
    .reg .b32 %r<3>;
    .shared .align 4 .b8 tile[100];
    .local .align 8 .b8 depot[40];
    ret;
}
"""
    mod = PtxModule.parse(text)
    info = mod.kernels["k"]
    assert [(p.name, p.offset, p.size, p.align) for p in info.params] == [
        ("a", 0, 1, 1), ("s", 16, 24, 16), ("d", 40, 8, 8), ("n", 48, 4, 4)]
    assert info.param_size == 52
    assert info.attributes == {
        "num_regs": 3, "shared_size_bytes": 100, "const_size_bytes": 4,
        "local_size_bytes": 40, "max_threads_per_block": 64, "ptx_version": 75}
    blob = mod.variables["blob"]
    assert (blob.space, blob.size, blob.align, blob.init) == ("global", 10, 8,
                                                              b"\1\2\3" + bytes(7))
    assert mod.variables["scale"].init == np.float32(2).tobytes()
    ptr = mod.variables["ptr"]
    assert ptr.relocations == [(0, "blob", 2)]
    assert ptr.initial_bytes({"blob": 0x1000, "ptr": 0x2000, "scale": 0x3000}) == \
        (0x1002).to_bytes(8, "little")


def test_nvcc_module_with_many_kernels_and_libdevice_loads(toolkit):
    source = """
    extern "C" __global__ void a(double* x) { x[threadIdx.x] = erf(x[0]) + lgamma(x[1]); }
    extern "C" __global__ void b(float* x) { x[threadIdx.x] = erfcinvf(x[0]) * j0f(x[1]); }
    """
    mod = PtxModule.parse(toolkit.ptx(source))
    assert set(mod.kernels) == {"a", "b"}


LIB = r"""
#include <cstdio>
__device__ int bias = 5;
__device__ int scaled(int x) { printf("lib %d\n", x); return x * 3 + bias; }
"""
APP = r"""
#include <cstdio>
extern __device__ int bias;
extern __device__ int scaled(int x);
extern "C" __global__ void run(int* out) {
    printf("app %d\n", threadIdx.x);
    out[threadIdx.x] = scaled(threadIdx.x) + bias;
}
"""


def test_link_resolves_externals_across_modules(toolkit, device):
    lib = toolkit.ptx(LIB, flags=["-rdc=true"])
    app = toolkit.ptx(APP, flags=["-rdc=true"])
    assert "$str" in lib and "$str" in app
    with pytest.raises(PtxError):
        PtxModule.parse(app)
    mod = link([app, lib])
    device.map_variables(mod)
    out = device.zeros(4, np.int32)
    result = device.launch(mod, "run", (1,), (4,), out)
    np.testing.assert_array_equal(device.download(out, 4, np.int32), np.arange(4) * 3 + 10)
    assert result.printf == "".join(f"app {t}\nlib {t}\n" for t in range(4))


def test_link_refuses_duplicate_definitions():
    text = HEADER + ".visible .func f()\n{\nret;\n}\n"
    with pytest.raises(PtxError, match="more than one module"):
        link([text, text])


def test_predefined_warp_size_identifier(device):
    mod = device.load(kernel("mov.u32 %r1, WARP_SZ;\nld.param.u64 %rd1, [p];\n"
                             "st.global.u32 [%rd1], %r1;",
                             ".reg .b32 %r<4>;\n.reg .b64 %rd<2>;"))
    out = device.zeros(1, np.uint32)
    device.launch(mod, "k", (1,), (1,), out)
    assert device.download(out, 1, np.uint32)[0] == 32
