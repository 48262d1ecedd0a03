"""Shared fixtures: the CUDA toolkit (compiled programs are cached for the whole run)."""

from __future__ import annotations

import pytest
from toolkit import Toolkit, find_toolkit


@pytest.fixture(scope="session")
def toolkit(tmp_path_factory: pytest.TempPathFactory) -> Toolkit:
    return find_toolkit(tmp_path_factory.mktemp("cuda-build"))
