"""Where an application finds our CUDA libraries: a directory to put first on LD_LIBRARY_PATH.

The shims are built as Python extensions (`vgpu/shim/_libcuda.cpython-*.so`, `_libcudart`,
`_libnvrtc`); the dynamic loader looks for `libcuda.so.1` (applications, cudart), `libcuda.so`
(numba-cuda tries it first), `libcudart.so.13` (programs built with `nvcc -cudart shared`),
`libcudart.so` and `libnvrtc.so.13` (vgpu's NVRTC over NVIDIA's, which it finds by the path
`nvidia_nvrtc()` returns). This module makes a directory with those names as symlinks to the
extensions, one directory per build (keyed by the extension's path, size and mtime), so a
rebuild never leaves a stale link behind and concurrent `vgpu run`s share one directory.
Finding the extension does not load it: the CLI process stays free of the shim.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["shim_library_dir", "nvidia_nvrtc", "SHIM_LIBRARY_NAMES", "NVRTC"]

# Library file name -> the extension module that provides it.
SHIM_LIBRARY_NAMES = {
    "libcuda.so.1": "vgpu.shim._libcuda",
    "libcuda.so": "vgpu.shim._libcuda",
    "libcudart.so.13": "vgpu.shim._libcudart",
    "libcudart.so": "vgpu.shim._libcudart",
    "libnvrtc.so.13": "vgpu.shim._libnvrtc",
}
NVRTC = "libnvrtc.so.13"


def _extension_path(module: str) -> Path:
    """The built extension's file, found beside this module without importing it (an
    imported shim may be a cffi-embedded module object with neither __spec__ nor __file__)."""
    package_dir = Path(__file__).resolve().parent
    name = module.rsplit(".", 1)[1]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = package_dir / f"{name}{suffix}"
        if candidate.exists():
            return candidate
    raise RuntimeError(f"the shim extension {module} is not built: reinstall vgpu "
                       "(pip install -e . or pip install .)")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "vgpu" / "shim"


def _build_key(targets: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for name, path in sorted(targets.items()):
        stat = path.stat()
        digest.update(f"{name}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _is_complete(directory: Path, targets: dict[str, Path]) -> bool:
    return all((directory / name).is_symlink() and (directory / name).resolve() == target
               for name, target in targets.items())


def _make(root: Path, targets: dict[str, Path]) -> Path:
    directory = root / _build_key(targets)
    if _is_complete(directory, targets):
        return directory
    root.mkdir(parents=True, exist_ok=True)
    # Built aside and renamed into place, so a concurrent reader never sees half a directory.
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for name, target in targets.items():
            (staging / name).symlink_to(target)
        try:
            staging.rename(directory)
        except OSError:  # another process made it first, or a stale one is in the way
            if not _is_complete(directory, targets):
                shutil.rmtree(directory, ignore_errors=True)
                staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def shim_library_dir() -> Path:
    """A directory holding libcuda.so.1, libcuda.so, libcudart.so.13 and libcudart.so for
    this build of the shims."""
    targets = {name: _extension_path(module) for name, module in SHIM_LIBRARY_NAMES.items()}
    try:
        return _make(_cache_root(), targets)
    except OSError:  # no writable home: fall back to a per-user temporary directory
        return _make(Path(tempfile.gettempdir()) / f"vgpu-shim-{os.getuid()}", targets)


def nvidia_nvrtc(library_path: str = "") -> Path | None:
    """NVIDIA's libnvrtc.so.13, which vgpu's forwards to, or None: first in the folders of
    `library_path` (an LD_LIBRARY_PATH), then in the nvidia-cuda-nvrtc wheel of this Python's
    site-packages, then in the toolkit named by CUDA_HOME or CUDA_PATH and /usr/local/cuda.
    Never vgpu's own: the folder of this build's shims is skipped."""
    own = _extension_path(SHIM_LIBRARY_NAMES[NVRTC]).resolve()
    folders = [Path(p) for p in library_path.split(os.pathsep) if p]
    folders += [Path(p) / "nvidia" / "cu13" / "lib" for p in sys.path if p]
    folders += [Path(root) / sub for root in (os.environ.get("CUDA_HOME"),
                                              os.environ.get("CUDA_PATH"), "/usr/local/cuda")
                if root for sub in ("lib64", "targets/x86_64-linux/lib")]
    for folder in folders:
        candidate = folder / NVRTC
        if candidate.is_file() and candidate.resolve() != own:
            return candidate
    return None
