"""Finds the CUDA compilers the tests build their programs with, and compiles each program once.

nvcc comes from the `nvidia-cuda-nvcc` wheel that the project's `test` extra installs (it
lands in site-packages as `nvidia/cu13/bin/nvcc`), or else from PATH. A missing
compiler is an error, never a skip: the test extra is what provides it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

__all__ = ["Toolkit", "find_toolkit", "cuda12_runtime"]

# What the tests' C programs share (test_files.h): on every C program's include path.
C_INCLUDE = Path(__file__).resolve().parent / "c_include"


class Toolkit:
    """A located CUDA toolkit: compiles CUDA C to PTX, to executables, or C against cuda.h."""

    def __init__(self, nvcc: Path, cache_dir: Path):
        self.nvcc = nvcc
        self.root = _toolkit_root(nvcc)
        self.include = self.root / "include"
        if not (self.include / "cuda.h").exists():  # system toolkit layout
            self.include = self.root / "targets" / "x86_64-linux" / "include"
        self.cache_dir = cache_dir
        cache_dir.mkdir(parents=True, exist_ok=True)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.nvcc.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _cached(self, kind: str, source: str, flags: list[str], suffix: str) -> tuple[Path, bool]:
        key = hashlib.sha256(f"{kind}\0{source}\0{flags}".encode()).hexdigest()[:16]
        path = self.cache_dir / f"{kind}-{key}{suffix}"
        return path, path.exists()

    def _run(self, cmd: list[str], cwd: Path) -> None:
        proc = subprocess.run(cmd, cwd=cwd, env=self._env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compile failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")

    def ptx(self, source: str, arch: str = "compute_75", flags: list[str] | None = None) -> str:
        """CUDA C++ source -> PTX text (cached by source and flags)."""
        flags = list(flags or [])
        out, hit = self._cached("ptx", source, [arch, *flags], ".ptx")
        if not hit:
            src = out.with_suffix(".cu")
            src.write_text(source)
            self._run([str(self.nvcc), "-ptx", f"-arch={arch}", *flags, str(src), "-o", str(out)],
                      self.cache_dir)
        return out.read_text()

    def fatbin(self, source: str, flags: list[str]) -> bytes:
        """CUDA C++ source -> a fatbin (what `flags`' -gencode options put in it), cached."""
        out, hit = self._cached("fatbin", source, flags, ".fatbin")
        if not hit:
            src = out.with_suffix(".cu")
            src.write_text(source)
            self._run([str(self.nvcc), "-fatbin", *flags, str(src), "-o", str(out)],
                      self.cache_dir)
        return out.read_bytes()

    def executable(self, source: str, flags: list[str] | None = None,
                   extra_sources: dict[str, str] | None = None) -> Path:
        """CUDA C++ source (plus named extra files) -> executable built with nvcc."""
        flags = list(flags or [])
        extra_sources = extra_sources or {}
        out, hit = self._cached("exe", source + repr(sorted(extra_sources.items())), flags, "")
        if not hit:
            work = out.with_name(out.name + ".d")
            work.mkdir(exist_ok=True)
            (work / "main.cu").write_text(source)
            files = ["main.cu"]
            for name, text in extra_sources.items():
                (work / name).write_text(text)
                files.append(name)
            self._run([str(self.nvcc), *flags, *self._libdirs(), *files, "-o", str(out)], work)
        return out

    def linked_executable(self, units: dict[str, tuple[str, list[str]]],
                          flags: list[str]) -> Path:
        """Named CUDA C++ files, each compiled on its own with its flags (`nvcc -c`: one
        built cubin-only, say), linked into an executable with `flags`."""
        out, hit = self._cached("linked", repr(sorted(units.items())), flags, "")
        if not hit:
            work = out.with_name(out.name + ".d")
            work.mkdir(exist_ok=True)
            objects = []
            for name, (source, unit_flags) in units.items():
                (work / name).write_text(source)
                objects.append(f"{name}.o")
                self._run([str(self.nvcc), "-c", *flags, *unit_flags, name, "-o", objects[-1]],
                          work)
            self._run([str(self.nvcc), *flags, *self._libdirs(), *objects, "-o", str(out)],
                      work)
        return out

    def c_program(self, source: str, flags: list[str] | None = None) -> Path:
        """C source using cuda.h -> executable that needs libcuda.so.1, as any driver-API
        program does. It is linked against vgpu's libcuda (this machine has no other); the
        result records only the NEEDED name, so at run time whichever libcuda.so.1 the loader
        finds first is used."""
        from vgpu.shim.loader import shim_library_dir

        flags = list(flags or [])
        out, hit = self._cached("c", source, flags, "")
        if not hit:
            src = out.with_suffix(".c")
            src.write_text(source)
            self._run(["gcc", "-O1", "-o", str(out), str(src), f"-I{self.include}",
                       f"-I{C_INCLUDE}", *flags,
                       f"-L{shim_library_dir()}", "-lcuda"], self.cache_dir)
        return out

    @property
    def cudart_library(self) -> Path:
        """NVIDIA's libcudart.so.13 (from the toolkit, or the nvidia-cuda-runtime wheel)."""
        for cand in (self.root / "lib" / "libcudart.so.13",
                     self.root / "targets" / "x86_64-linux" / "lib" / "libcudart.so.13"):
            if cand.exists():
                return cand
        raise RuntimeError(f"no libcudart.so.13 under {self.root}: install the test extra")

    def _libdirs(self) -> list[str]:
        """Library dirs for `-cudart shared` (the wheel has libcudart.so.13, no libcudart.so)."""
        lib_dir = self.cache_dir / "cudart-link"
        lib_dir.mkdir(exist_ok=True)
        link = lib_dir / "libcudart.so"
        if not link.exists():
            link.symlink_to(self.cudart_library)
        # nvcc links libcudadevrt/libcudart_static from targets/<arch>/lib, which the wheels'
        # layout (nvidia/cu13/lib) lacks: name the directory the libraries are really in.
        return [f"-L{lib_dir}", f"-L{self.cudart_library.parent}"]


def _toolkit_root(nvcc: Path) -> Path:
    """The toolkit's top directory, as nvcc itself reports it (nvcc may be a wrapper script)."""
    proc = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-E", os.devnull],
                          capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return Path(line.split("=", 1)[1].strip()).resolve()
    return nvcc.resolve().parent.parent


def cuda12_runtime(name: str) -> Path:
    """A library of NVIDIA's CUDA 12 runtime (libcudart.so.12, libcudart_static.a), from the
    `nvidia-cuda-runtime-cu12` wheel of the test extra."""
    path = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cuda_runtime" / "lib" / name
    if not path.exists():
        raise RuntimeError(f"no {path}: install the test extra (nvidia-cuda-runtime-cu12)")
    return path


def _wheel_nvcc() -> Path | None:
    purelib = Path(sysconfig.get_paths()["purelib"])
    cand = purelib / "nvidia" / "cu13" / "bin" / "nvcc"
    return cand if cand.exists() else None


def find_toolkit(cache_dir: Path) -> Toolkit:
    # The test extra's pinned compilers first: then every machine, CI included, builds the
    # test programs with the same toolkit, whatever else PATH holds.
    nvcc = _wheel_nvcc()
    if nvcc is None and shutil.which("nvcc"):
        nvcc = Path(shutil.which("nvcc"))
    if nvcc is None:
        raise RuntimeError(
            "nvcc not found on PATH nor in site-packages/nvidia/cu13/bin: "
            "install the test extra (pip install -e '.[test]')")
    return Toolkit(nvcc, cache_dir)
