"""Shared fixtures: the CUDA toolkit (compiled programs are cached for the whole run), and a
runtime folder of the tests' own."""

from __future__ import annotations

import pytest
from toolkit import Toolkit, find_toolkit


@pytest.fixture(scope="session")
def toolkit(tmp_path_factory: pytest.TempPathFactory) -> Toolkit:
    return find_toolkit(tmp_path_factory.mktemp("cuda-build"))


@pytest.fixture(scope="session", autouse=True)
def runtime_folder(tmp_path_factory: pytest.TempPathFactory):
    """Servers the tests start announce themselves and keep their sockets here, not in the
    user's runtime folder: a plain `vgpu run` in a test never reaches a default server the
    user has running, and `vgpu ps` sees the tests' servers only."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
    yield
    patch.undo()
