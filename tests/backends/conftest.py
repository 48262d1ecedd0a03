"""The backend contract suite's devices: one backend with an arena, per backend kind.

Every test of the suite takes `device` (or `make_device` for several backends) and runs once
per backend: `emu` in this process, and `cuda`, which needs a CUDA driver. Where this machine
has none (no GPU), the `cuda` tests run nested, as the `cuda`-backend server does in the other
tests: the suite runs once more, in a subprocess under `vgpu run --server INNER` (INNER an emu
server offering two devices), so that cuda-python's driver calls go to vgpu's driver; each
`cuda` test here then reports the result of its twin there. `VGPU_CONTRACT_CUDA=direct`
runs the `cuda` tests in this process instead: on a machine with a GPU, and inside the
nested run.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import pytest
from contract_device import KINDS, Device
from vgpu_processes import emu_server, run_under_vgpu

HERE = Path(__file__).resolve().parent
DIRECT = os.environ.get("VGPU_CONTRACT_CUDA") == "direct"
# Where the nested run finds the kernels the outer run built (it has no time to build them).
BUILD = os.environ.get("VGPU_CONTRACT_BUILD")
NESTED_TIMEOUT_S = 600


# ----------------------------------------------------------------- kernels

@dataclass(frozen=True)
class Kernels:
    ptx: bytes
    fatbin: bytes


@pytest.fixture(scope="session")
def contract_build(tmp_path_factory) -> Path:
    """A folder with the suite's kernels as PTX and as a fatbin (PTX and an sm_80 cubin)."""
    if BUILD:
        return Path(BUILD)
    from toolkit import find_toolkit

    folder = tmp_path_factory.mktemp("contract-build")
    toolkit = find_toolkit(folder / "cache")
    source = (HERE / "contract_kernels.cu").read_text()
    (folder / "kernels.ptx").write_text(toolkit.ptx(source))
    (folder / "kernels.fatbin").write_bytes(toolkit.fatbin(
        source, ["-gencode", "arch=compute_75,code=compute_75",
                 "-gencode", "arch=compute_80,code=sm_80"]))
    return folder


@pytest.fixture(scope="session")
def kernels(contract_build) -> Kernels:
    return Kernels((contract_build / "kernels.ptx").read_bytes(),
                   (contract_build / "kernels.fatbin").read_bytes())


# ----------------------------------------------------------------- backends, direct or nested

class NestedResult:
    """Stands for a `cuda` test that ran nested: its twin's result decides."""

    def __init__(self, outcome: tuple[str, str] | None, name: str, log: str):
        self.outcome, self.name, self.log = outcome, name, log

    def check(self) -> None:
        if self.outcome is None:
            pytest.fail(f"the nested run has no result for {self.name}\n{self.log}",
                        pytrace=False)
        verdict, text = self.outcome
        if verdict != "passed":
            pytest.fail(f"{self.name} {verdict} nested under vgpu run:\n{text}", pytrace=False)


@pytest.fixture(scope="session")
def nested_results(contract_build, tmp_path_factory) -> tuple[dict[str, tuple[str, str]], str]:
    """Runs the suite's `cuda` tests once, under `vgpu run` on an emu server: each test's
    (verdict, text) by its name, and the run's output."""
    folder = tmp_path_factory.mktemp("nested-contract")
    report = folder / "report.xml"
    with emu_server(folder, "--devices", "2") as address:
        result = run_under_vgpu(
            address, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-k", "cuda", f"--junitxml={report}", str(HERE / "test_backend_contract.py"),
            timeout=NESTED_TIMEOUT_S, merged=True, VGPU_CONTRACT_CUDA="direct",
            VGPU_CONTRACT_BUILD=str(contract_build))
    if not report.exists():
        return {}, result.stdout
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        verdict, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                verdict = {"failure": "failed", "error": "errored"}.get(child.tag, child.tag)
                text = f"{child.get('message', '')}\n{child.text or ''}"
        outcomes[case.get("name")] = (verdict, text)
    return outcomes, result.stdout


def nested(request) -> bool:
    """Whether this test uses the cuda backend and reports a nested run's result."""
    callspec = getattr(request.node, "callspec", None)
    return not DIRECT and callspec is not None and "cuda" in callspec.id.split("-")


@pytest.fixture(autouse=True)
def nested_twin(request) -> NestedResult | None:
    """For a `cuda` test on a machine without a driver: its twin's result in the nested run."""
    if not nested(request):
        return None
    outcomes, log = request.getfixturevalue("nested_results")
    return NestedResult(outcomes.get(request.node.name), request.node.name, log)


@pytest.fixture
def make_device(request):
    """make_device(kind, devices=1): a Device (with `devices` regions), closed at the test's
    end."""
    made: list[Device] = []

    def make(kind: str, devices: int = 1) -> Device:
        made.append(Device(kind, devices))
        return made[-1]

    yield make
    for device in reversed(made):
        device.close()


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def device(request, kind, make_device) -> Device | None:
    """A Device of each kind (None for a test that ran nested, whose body does not run)."""
    return None if nested(request) else make_device(kind)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test that ran nested is its twin's result, not a second run here."""
    for value in pyfuncitem.funcargs.values():
        if isinstance(value, NestedResult):
            value.check()
            return True
    return None
