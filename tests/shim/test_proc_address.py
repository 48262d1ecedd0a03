"""cuGetProcAddress answers like the real driver, for what cuda-python really asks."""

from __future__ import annotations

from pathlib import Path

import pytest

import vgpu.shim.driver as driver
from vgpu.api.cudadefs import CUDA_VERSION, CUdriverProcAddressQueryResult, CUresult
from vgpu.api.render_c import DRIVER_SHIM
from vgpu.api.table import driver_proc_address

DATA = Path(__file__).resolve().parents[1] / "data"
PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

# Reads "name version flags" lines; for each prints the result, the query status, the name of
# the symbol the pointer is (dladdr), and whether it is dlsym's pointer for that name.
PROBE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <cuda.h>

int main(void)
{
    char name[256];
    int version;
    unsigned long long flags;

    while (scanf("%255s %d %llu", name, &version, &flags) == 3) {
        void *pfn = (void *)1;
        CUdriverProcAddressQueryResult status = -1;
        CUresult rc = cuGetProcAddress_v2(name, &pfn, version, flags, &status);
        Dl_info info;
        const char *symbol = "-";
        int same = 0;
        if (pfn != NULL && dladdr(pfn, &info) && info.dli_sname != NULL) {
            symbol = info.dli_sname;
            same = dlsym(RTLD_DEFAULT, symbol) == pfn;
        }
        printf("%s %d %llu %d %d %s %s\n", name, version, flags, rc, (int)status,
               pfn == NULL ? "NULL" : symbol, same ? "dlsym-same" : "dlsym-differs");
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def ask(shim_program):
    program = shim_program(PROBE)

    def ask(run_program, queries: list[tuple[str, int, int]]) -> dict[tuple, tuple]:
        stdin = "".join(f"{name} {version} {flags}\n" for name, version, flags in queries)
        result = run_program(program, stdin=stdin)
        assert result.returncode == 0, result.stderr
        answers = {}
        for line in result.stdout.splitlines():
            name, version, flags, rc, status, symbol, same = line.split()
            answers[(name, int(version), int(flags))] = (int(rc), int(status), symbol, same)
        assert len(answers) == len(set(queries))
        return answers

    return ask


def expected_symbol(base: str, version: int, per_thread: bool) -> str | None:
    """The rule: newest entry not newer than `version`; per-thread variants when asked."""
    entries = [e for e in driver_proc_address() if e.base == base and e.version <= version
               and (per_thread or not e.flavour)]
    if not entries:
        return None
    return max(entries, key=lambda e: (e.version, bool(e.flavour))).symbol


def _cuda_python_requests() -> list[tuple[str, int]]:
    """(name, version) of every cuGetProcAddress request cuda-bindings 13.5 makes."""
    lines = (DATA / "cuda-bindings-13.5-procaddress.txt").read_text().splitlines()
    return [(name, int(version)) for name, version in
            (line.split() for line in lines if not line.startswith("#"))]


def test_every_request_of_cuda_python_is_answered(ask, run_program):
    queries = [(name, version, 0) for name, version in _cuda_python_requests()]
    answers = ask(run_program, queries)
    known = {e.base for e in driver_proc_address()}
    found = 0
    for name, version, flags in queries:
        rc, status, symbol, same = answers[(name, version, flags)]
        if name in known:
            assert (rc, status) == (0, 0), name
            assert symbol == expected_symbol(name, version, False), name
            assert same == "dlsym-same", name
            found += 1
        else:
            # cuda-bindings 13.5 also asks for functions newer than our CUDA 13.0 headers; the
            # 13.0 driver answers "not found", and cuda-bindings then reports them missing.
            assert version > CUDA_VERSION, f"{name}@{version} is in CUDA {CUDA_VERSION}"
            assert (rc, status) == (CUresult.CUDA_ERROR_NOT_FOUND,
                                    CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
            assert symbol == "NULL"
    assert found >= 480


@pytest.mark.parametrize(("name", "version", "flags", "symbol"), [
    ("cuMemAlloc", 2000, 0, "cuMemAlloc"),          # the CUDA 2.0 ABI: unsigned int sizes
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 99999, 0, "cuMemAlloc_v2"),      # newer than us: our newest
    ("cuMemAlloc", 12000, PER_THREAD, "cuMemAlloc_v2"),  # no stream: no per-thread variant
    ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
    ("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoD", 12000, PER_THREAD, "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoD", 3020, PER_THREAD, "cuMemcpyHtoD_v2"),  # before per-thread streams existed
    ("cuMemcpyHtoDAsync", 12000, PER_THREAD, "cuMemcpyHtoDAsync_v2_ptsz"),
    ("cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"),
    ("cuStreamGetCaptureInfo", 11030, 0, "cuStreamGetCaptureInfo_v2"),
    ("cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3"),
    ("cuStreamGetCaptureInfo", 12030, PER_THREAD, "cuStreamGetCaptureInfo_v3_ptsz"),
    ("cuLaunchKernel", 12000, PER_THREAD, "cuLaunchKernel_ptsz"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
])
def test_known_answers(ask, run_program, name, version, flags, symbol):
    rc, status, found, same = ask(run_program, [(name, version, flags)])[(name, version, flags)]
    assert (rc, status, found, same) == (0, 0, symbol, "dlsym-same")


def test_not_found(ask, run_program):
    answers = ask(run_program, [("cuMemAllocAsync", 11000, 0), ("cuNoSuchFunction", 12000, 0),
                                ("cuMemAlloc_v2", 12000, 0)])
    not_found = CUresult.CUDA_ERROR_NOT_FOUND
    status = CUdriverProcAddressQueryResult
    # cuMemAllocAsync appeared in CUDA 11.2: too new for a program built against 11.0.
    assert answers[("cuMemAllocAsync", 11000, 0)] == (
        not_found, status.CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "NULL", "dlsym-differs")
    # Unknown names, and versioned symbol names (the API takes base names), are not found.
    for name in ("cuNoSuchFunction", "cuMemAlloc_v2"):
        assert answers[(name, 12000, 0)] == (
            not_found, status.CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "NULL", "dlsym-differs")


def _implemented(symbol: str) -> bool:
    """In Python (shim/driver/, per-thread variants through their base), or in shim/c/."""
    return callable(getattr(driver, symbol, None)) or symbol in DRIVER_SHIM.hand_written


def test_every_answer_for_an_implemented_function_is_an_implementation(ask, run_program):
    """A program asking for the version it was built for must never get a stub that answers
    "not supported" for a function vgpu implements in another version."""
    queries = [(name, version, flags) for name, version in _cuda_python_requests()
               for flags in (0, PER_THREAD)]
    answers = ask(run_program, queries)
    variants: dict[str, list[str]] = {}
    for entry in driver_proc_address():
        variants.setdefault(entry.base, []).append(entry.symbol)
    missing = set()
    for name, version, flags in queries:
        symbol = answers[(name, version, flags)][2]
        if symbol != "NULL" and any(map(_implemented, variants[name])) \
                and not _implemented(symbol):
            missing.add(f"{name}@{version} -> {symbol}")
    assert sorted(missing) == []
