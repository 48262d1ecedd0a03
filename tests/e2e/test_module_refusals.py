"""A module vgpu cannot load is refused with CUDA's code and, on stderr, the reason in words,
whether or not VGPU_TRACE is set."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from e2e_support import vgpu_run

HERE = Path(__file__).resolve().parent
KERNEL = 'extern "C" __global__ void k(float *v) { v[threadIdx.x] *= 2.0f; }\n'
# A texture reference, as CUDA 11's texture<> compiled (CUDA 12 removed them).
TEXTURE_REFERENCE = """.version 6.0
.target sm_50
.address_size 64
.global .texref legacy;
.visible .entry fetch(.param .u64 out)
{
    .reg .f32 %f<5>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, 0;
    tex.1d.v4.f32.s32 {%f1, %f2, %f3, %f4}, [legacy, {%r1}];
    st.global.f32 [%rd1], %f1;
    ret;
}
"""


@pytest.fixture(scope="module")
def modules(toolkit, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("modules")
    (work / "k.cu").write_text(KERNEL)
    subprocess.run([str(toolkit.nvcc), "-cubin", "-arch=sm_80", "k.cu", "-o", "k.cubin"],
                   cwd=work, check=True, capture_output=True)
    subprocess.run([str(toolkit.nvcc), "-fatbin", "-gencode", "arch=compute_80,code=sm_80",
                    "k.cu", "-o", "k.fatbin"], cwd=work, check=True, capture_output=True)
    # PTX for a newer architecture than the device's (8.0): a GPU's driver cannot JIT it.
    subprocess.run([str(toolkit.nvcc), "-fatbin", "-gencode", "arch=compute_90,code=compute_90",
                    "k.cu", "-o", "k90.fatbin"], cwd=work, check=True, capture_output=True)
    (work / "k90.ptx").write_text(toolkit.ptx(KERNEL, arch="compute_90"))
    # An sm_80 cubin with PTX only for compute_90 (what -arch=all builds look like): an 8.0
    # GPU runs the cubin, the emulator the PTX in its place.
    subprocess.run([str(toolkit.nvcc), "-fatbin", "-gencode", "arch=compute_80,code=sm_80",
                    "-gencode", "arch=compute_90,code=compute_90", "k.cu", "-o",
                    "k80c90.fatbin"], cwd=work, check=True, capture_output=True)
    (work / "texture.ptx").write_text(TEXTURE_REFERENCE)
    (work / "k.ptx").write_text(toolkit.ptx(KERNEL))
    return {name: work / name for name in ("k.cubin", "k.fatbin", "k90.fatbin", "k90.ptx",
                                           "k80c90.fatbin", "texture.ptx", "k.ptx")}


@pytest.fixture(scope="module")
def loader(toolkit) -> Path:
    return toolkit.c_program((HERE / "module_refusals.c").read_text())


def _codes(result) -> dict[str, int]:
    return {Path(path).name: int(code)
            for path, code in (line.split() for line in result.stdout.splitlines())}


def test_refusals_say_why_on_stderr(loader, modules):
    result = vgpu_run(loader, *modules.values())
    assert result.returncode == 0, result.stderr
    assert _codes(result) == {"k.cubin": 209, "k.fatbin": 209, "k90.fatbin": 209,
                              "k90.ptx": 218, "k80c90.fatbin": 0, "texture.ptx": 218,
                              "k.ptx": 0}
    lines = result.stderr.splitlines()
    cubin = [line for line in lines if "SASS" in line]
    assert cubin == [f"vgpu: cuModuleLoad: {modules['k.cubin']} (kernel 'k'): this module "
                     "holds only SASS for sm_80; the emu backend runs PTX: load PTX instead "
                     "(nvcc -ptx, or keep PTX in the fatbin with -gencode "
                     "arch=compute_80,code=compute_80) (CUDA_ERROR_NO_BINARY_FOR_GPU)"]
    fatbin = [line for line in lines if "cubin sm_80" in line]
    assert len(fatbin) == 1 and "no PTX" in fatbin[0], result.stderr
    assert f"cuModuleLoad: {modules['k.fatbin']} (kernel 'k'): " in fatbin[0]
    assert "-gencode arch=compute_80,code=compute_80" in fatbin[0]
    texture = [line for line in lines if "references" in line]
    assert len(texture) == 1, result.stderr
    assert texture[0].startswith("vgpu: cuModuleLoad: texture and surface references are not "
                                 "supported by the emu backend")
    assert ".texref legacy" in texture[0] and texture[0].endswith("(CUDA_ERROR_INVALID_PTX)")
    newer = [line for line in lines if "compute_90" in line or "sm_90" in line]
    assert len(newer) == 2, result.stderr
    assert "newer than the device's (compute_80)" in newer[0], result.stderr
    assert newer[0].endswith("(CUDA_ERROR_NO_BINARY_FOR_GPU)")
    assert "the PTX targets sm_90, newer than the device (compute capability 8.0)" in newer[1]
    assert newer[1].endswith("(CUDA_ERROR_INVALID_PTX)")
    assert len(lines) == 5, result.stderr  # nothing for the module that loads


def test_libraries_without_code_the_device_runs_load_and_refuse_their_kernels(
        loader, modules):
    """As CUDA's driver loads libraries (NVIDIA's runtime, loading eagerly, loads every
    image of a program at its first call): one holding only cubins, or only PTX newer than
    the device, loads; its kernel counts, and is refused with CUDA_ERROR_NO_BINARY_FOR_GPU,
    naming it, when asked for (so are its variables). What can never load (a texture
    reference) is still refused at load."""
    names = ["k.cubin", "k.fatbin", "k90.fatbin", "k.ptx", "texture.ptx"]
    result = vgpu_run(loader, "--libraries", *(modules[name] for name in names))
    assert result.returncode == 0, result.stderr
    codes = {Path(path).name: [int(c) for c in rest]
             for path, *rest in (line.split() for line in result.stdout.splitlines())}
    without_code = [0, 1, 209, 209, 209, 0]
    assert codes == {"k.cubin": without_code, "k.fatbin": without_code,
                     "k90.fatbin": without_code, "k.ptx": [0, 1, 0, 0, 500, 0],
                     "texture.ptx": [218, -1, -1, -1, -1, -1]}, result.stdout
    refused = [line for line in result.stderr.splitlines() if "kernel 'k' of " in line]
    assert len(refused) == 6, result.stderr  # cuLibraryGetKernel and cuModuleGetFunction
    assert "'k' of k.cubin cannot run: this module holds only SASS for sm_80" in refused[0]
    assert "'k' of k90.fatbin cannot run" in refused[-1] and "compute_90" in refused[-1]
    assert all(line.endswith("(CUDA_ERROR_NO_BINARY_FOR_GPU)") for line in refused)


def test_images_without_ptx_are_refused_from_memory_too(loader, modules):
    """cuModuleLoadData of a cubin, or of a fatbin of cubins only, from the heap: refused
    with CUDA_ERROR_NO_BINARY_FOR_GPU, the kernels the image holds named (no file is
    behind it); an image with PTX loads."""
    names = ["k.cubin", "k.fatbin", "k.ptx"]
    result = vgpu_run(loader, "--data", *(modules[name] for name in names))
    assert result.returncode == 0, result.stderr
    assert _codes(result) == {"k.cubin": 209, "k.fatbin": 209, "k.ptx": 0}
    refusals = result.stderr.splitlines()
    assert len(refusals) == 2, result.stderr
    assert all(line.startswith("vgpu: cuModuleLoadData: the image (kernel 'k'): ")
               and line.endswith("(CUDA_ERROR_NO_BINARY_FOR_GPU)") for line in refusals), \
        result.stderr
    assert "only SASS for sm_80" in refusals[0] and "no PTX" in refusals[1], result.stderr


@pytest.mark.parametrize(("setting", "mode"), [(None, "LAZY"), ("LAZY", "LAZY"),
                                               ("EAGER", "EAGER")])
def test_loading_mode_follows_cuda_module_loading(loader, setting, mode):
    """CUDA_MODULE_LOADING as CUDA's driver reads it: lazy unless it says EAGER (lazy is
    CUDA's default since 12.2)."""
    modes = {"EAGER": 1, "LAZY": 2}  # CU_MODULE_EAGER_LOADING, CU_MODULE_LAZY_LOADING
    env = {"CUDA_MODULE_LOADING": setting} if setting else {}
    result = vgpu_run(loader, "--loading-mode", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"loading mode {modes[mode]}\n"
