"""Big modules (CuPy's CUB modules: tens of MB of PTX, hundreds of kernels) are loaded lazily:
a scan of each function body gives the kernels' attributes at load, and a kernel's functions
are parsed and compiled at its first launch. A lazy load must report what a whole load
reports, and its kernels must compute what a whole load's compute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vgpu.server.emu import LaunchError, PtxError, PtxModule

PTX = Path(__file__).parent / "ptx"
HEADER = ".version 7.8\n.target sm_75\n.address_size 64\n"


def report(module: PtxModule) -> dict:
    """What a load tells the driver API: kernels, their layouts and attributes, variables,
    and which kernels print."""
    return {
        "kernels": {name: (info.params, info.param_size, info.attributes,
                           module.uses(name, "vprintf"))
                    for name, info in module.kernels.items()},
        "variables": {name: (v.space, v.size, v.align, v.init, v.relocations)
                      for name, v in module.variables.items()},
    }


@pytest.mark.parametrize("name", sorted(p.name for p in PTX.glob("*.ptx")))
def test_lazy_load_reports_what_a_whole_load_does(name):
    text = (PTX / name).read_text()
    assert report(PtxModule.parse(text, lazy=True)) == report(PtxModule.parse(text, lazy=False))


def run_every_kernel(device, text: str, lazy: bool) -> dict:
    """Launch each kernel of the module once (2 blocks of 32 threads) on a fresh `device`
    with the same inputs, each 8-byte parameter a pointer to a buffer of its own, others
    bytes: what the buffers hold afterwards, or the launch's error code."""
    module = PtxModule.parse(text, lazy=lazy)
    device.map_variables(module)
    rng = np.random.default_rng(7)
    outcome = {}
    for name, info in module.kernels.items():
        buffers, args = [], []
        for param in info.params:
            if param.size == 8:
                buffers.append(device.upload(rng.integers(0, 256, 4096, np.uint8)))
                args.append(buffers[-1])
            else:
                args.append(rng.integers(0, 256, param.size, np.uint8).tobytes())
        try:
            device.launch(module, name, (2,), (32,), *args)
            outcome[name] = [device.download(b, 4096, np.uint8).tobytes() for b in buffers]
        except LaunchError as exc:
            outcome[name] = exc.code
    return outcome


@pytest.mark.parametrize("name", ["control.ptx", "memory.ptx", "syntax.ptx", "warp.ptx"])
def test_lazily_loaded_kernels_compute_what_whole_ones_do(device, name):
    """Calls with parameters and results, shared, local and parameter memory, module
    variables, labels in blocks, warps. (Two fresh devices: the same addresses.)"""
    text = (PTX / name).read_text()
    assert run_every_kernel(device, text, lazy=True) == \
        run_every_kernel(type(device)(), text, lazy=False)


TWO_KERNELS = HEADER + """
.global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
.visible .entry good(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    ld.global.u32 %r1, [table+4];
    st.global.u32 [%rd1], %r1;
    ret;
}
.visible .entry bad(.param .u64 out)
{
    .reg .b32 %r<3>;
    add.u32 %r1, %r2;
    ret;
}
"""


def test_a_malformed_kernel_of_a_lazy_module_fails_its_own_launch_only(device):
    with pytest.raises(PtxError, match="line 18: add.u32: expected 3 operands"):
        PtxModule.parse(TWO_KERNELS, lazy=False)
    module = PtxModule.parse(TWO_KERNELS, lazy=True)
    device.map_variables(module)
    out = device.zeros(1, np.uint32)
    device.launch(module, "good", (1,), (1,), out)
    assert device.download(out, 1, np.uint32)[0] == 0x08070605
    for _ in range(2):  # and again: it stays refused
        with pytest.raises(LaunchError) as info:
            device.launch(module, "bad", (1,), (1,), out)
        assert info.value.code == 218  # CUDA_ERROR_INVALID_PTX
        assert "line 18" in str(info.value) and "expected 3 operands" in str(info.value)
    device.launch(module, "good", (1,), (1,), out)


COMPILE_ERROR = TWO_KERNELS.replace("add.u32 %r1, %r2;", "call.uni nothing, ();")


def test_a_kernel_whose_compile_fails_stays_refused(device):
    """An error found compiling (not parsing) a pending body: no half-compiled kernel is
    launched the second time."""
    module = PtxModule.parse(COMPILE_ERROR, lazy=True)
    device.map_variables(module)
    out = device.zeros(1, np.uint32)
    for _ in range(2):
        with pytest.raises(LaunchError) as info:
            device.launch(module, "bad", (1,), (1,), out)
        assert info.value.code == 218
        assert "undeclared function 'nothing'" in str(info.value)


def test_big_modules_load_lazily_by_default():
    """A module of more than 1 MiB of PTX: a kernel's body with an error fails only when
    launched, and a flat integer table (curand's, in CuPy) keeps its values."""
    filler = "\n".join(f"// {'x' * 100}" for _ in range(11000))
    module = PtxModule.parse(TWO_KERNELS + filler)
    assert module.variables["table"].init == bytes(range(1, 9))
    assert module.kernels["bad"].attributes["num_regs"] == 3


def test_braces_in_comments_do_not_end_a_lazy_body(device):
    text = TWO_KERNELS.replace("ret;\n}\n.visible .entry bad",
                               "// }\n/* } { */\n{ ret; }\n}\n.visible .entry bad")
    module = PtxModule.parse(text, lazy=True)
    assert set(module.kernels) == {"good", "bad"}
    device.map_variables(module)
    out = device.zeros(1, np.uint32)
    device.launch(module, "good", (1,), (1,), out)
    assert device.download(out, 1, np.uint32)[0] == 0x08070605
