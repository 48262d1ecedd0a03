"""CuPy's own tests, for the CuPy installed: its wheels carry none, so they come from the
source distribution of the same version on PyPI, fetched once into a cache folder, checked
against the sha256 PyPI's index gives for it, and unpacked there (its `tests/` folder and the
`pyproject.toml` holding CuPy's pytest settings). Nothing of CuPy is kept in this repository.

The cache is $VGPU_TEST_CACHE, else $XDG_CACHE_HOME/vgpu-tests (~/.cache/vgpu-tests): a CI
job keeps it between runs to fetch nothing; once unpacked, no network is needed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

__all__ = ["installed_cupy_version", "cupy_test_sources"]

INDEX = "https://pypi.org/simple/cupy/"
# PyPI's JSON form of the simple index (PEP 691): each file with its url and sha256.
ACCEPT = "application/vnd.pypi.simple.v1+json"
_DONE = ".unpacked"  # written last: a folder without it is an interrupted unpacking


def installed_cupy_version() -> str:
    """The version of the distribution that provides `cupy` (cupy-cuda13x, say)."""
    return importlib.metadata.version(importlib.metadata.packages_distributions()["cupy"][0])


def _cache_dir() -> Path:
    if os.environ.get("VGPU_TEST_CACHE"):
        return Path(os.environ["VGPU_TEST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vgpu-tests"


def _sdist_on_pypi(filename: str) -> tuple[str, str]:
    """(url, sha256) of `filename` in PyPI's index of CuPy's files."""
    request = urllib.request.Request(INDEX, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except OSError as exc:
        raise RuntimeError(f"CuPy's tests come from its sdist on PyPI, and {INDEX} cannot be "
                           f"read ({exc}); or put them, unpacked, in {_cache_dir()}") from exc
    for entry in files:
        if entry["filename"] == filename:
            return entry["url"], entry["hashes"]["sha256"]
    raise LookupError(f"{INDEX} lists no {filename}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetched(filename: str, cache: Path) -> Path:
    """The sdist in the cache, downloaded unless a copy of the right sha256 is there."""
    url, sha256 = _sdist_on_pypi(filename)
    tarball = cache / filename
    if tarball.exists() and _sha256(tarball) == sha256:
        return tarball
    with tempfile.NamedTemporaryFile(dir=cache, delete=False) as part:
        with urllib.request.urlopen(url, timeout=300) as response:
            shutil.copyfileobj(response, part)
    got = _sha256(Path(part.name))
    if got != sha256:
        os.unlink(part.name)
        raise ValueError(f"{url}: sha256 {got}, where PyPI's index says {sha256}")
    os.replace(part.name, tarball)
    return tarball


def cupy_test_sources(version: str) -> Path:
    """A folder holding CuPy `version`'s `tests/` and `pyproject.toml`, as its sdist has
    them (run pytest there, with that pyproject.toml as its configuration)."""
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"cupy-{version}"
    if (root / _DONE).exists():
        return root
    tarball = _fetched(f"cupy-{version}.tar.gz", cache)
    top = f"cupy-{version}/"
    with tempfile.TemporaryDirectory(dir=cache) as work, tarfile.open(tarball) as archive:
        wanted = [m for m in archive.getmembers()
                  if m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml"]
        archive.extractall(work, members=wanted, filter="data")
        Path(work, top, _DONE).write_text(_sha256(tarball) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        try:
            os.replace(Path(work, top), root)
        except OSError:  # another run unpacked it meanwhile
            if not (root / _DONE).exists():
                raise
    return root
