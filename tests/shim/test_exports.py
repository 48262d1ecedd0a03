"""The library's outside: exactly cuda.h's functions, the right names, error texts without
Python, and a table that still matches NVIDIA's headers."""

from __future__ import annotations

import subprocess

import pytest

from vgpu.api import cudadefs
from vgpu.api.driver_headers import read_driver_headers
from vgpu.api.generated import driver_table
from vgpu.api.table import driver_functions, driver_proc_address


def exported_symbols(library) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_exports_exactly_the_table(shim_dir):
    expected = {fn.symbol for fn in driver_functions()} | {"PyInit__libcuda"}
    assert exported_symbols(shim_dir / "libcuda.so.1") == expected


def test_library_names(shim_dir):
    dynamic = subprocess.run(["readelf", "-d", str(shim_dir / "libcuda.so.1")],
                             capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dynamic
    assert (shim_dir / "libcuda.so").resolve() == (shim_dir / "libcuda.so.1").resolve()


def test_table_matches_the_toolkit_headers(toolkit):
    """A parity check: regenerating from the toolkit's headers gives the committed table."""
    headers = read_driver_headers(toolkit.include)
    committed = {symbol: (restype, tuple((ctype, name) for ctype, name, _ in params))
                 for symbol, _, restype, params in driver_table.FUNCTIONS}
    regenerated = {proto.name: (proto.restype, tuple((p.ctype, p.name) for p in proto.params))
                   for proto in headers.prototypes.values()}
    assert committed == regenerated
    assert [(e.base, e.version, e.flavour, e.symbol) for e in headers.proc_address] == \
        list(driver_table.PROC_ADDRESS)
    for enum in headers.enums:
        members = getattr(cudadefs, enum.name).__members__  # with aliases (equal values)
        assert {name: member.value for name, member in members.items()} == dict(enum.members)


ERROR_TEXTS = r"""
#include <stdio.h>
#include <cuda.h>

int main(void)
{
    static const int codes[] = {0, 1, 3, 700, 801, 999, 12345};
    for (unsigned i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *name = NULL, *text = NULL;
        int rc_name = cuGetErrorName((CUresult)codes[i], &name);
        int rc_text = cuGetErrorString((CUresult)codes[i], &text);
        printf("%d|%d|%s|%d|%s\n", codes[i], rc_name, name ? name : "NULL", rc_text,
               text ? text : "NULL");
    }
    return 0;
}
"""


@pytest.mark.parametrize("env", [{}, {"PYTHONHOME": "/nonexistent"}], ids=["python", "no-python"])
def test_error_names_and_texts(shim_program, run_program, env):
    result = run_program(shim_program(ERROR_TEXTS), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # answered in C: Python is not even started
    rows = {int(line.split("|")[0]): line.split("|")[1:] for line in result.stdout.splitlines()}
    for code in (0, 1, 3, 700, 801, 999):
        assert rows[code][:3] == ["0", cudadefs.CUresult(code).name, "0"]
    # NVIDIA's own texts, as a GPU's driver prints them
    assert rows[1][3] == "invalid argument"
    assert rows[3][1:] == ["CUDA_ERROR_NOT_INITIALIZED", "0", "initialization error"]
    assert rows[700][3] == "an illegal memory access was encountered"
    assert rows[801][3] == "operation not supported"
    assert rows[12345] == ["1", "NULL", "1", "NULL"]  # CUDA_ERROR_INVALID_VALUE


EXPORT_TABLE = r"""
#include <stdio.h>
#include <cuda.h>

int main(void)
{
    const void *table = (const void *)1;
    CUuuid id = {{0}};
    int first = cuGetExportTable(&table, &id);
    int second = cuGetExportTable(&table, &id);
    printf("%d %d %s\n", first, second, table == NULL ? "NULL" : "set");
    return 0;
}
"""


def test_an_unknown_export_table_is_refused_and_named_once(shim_program, run_program):
    """The tables NVIDIA's runtime uses are tested in test_export_tables.py."""
    program = shim_program(EXPORT_TABLE)
    result = run_program(program)
    assert result.stdout.split() == ["801", "801", "NULL"]
    assert result.stderr.splitlines() == [
        f"vgpu: {program} asked for the driver's private table "
        "{00000000-0000-0000-0000-000000000000}, which vgpu does not provide; the call fails."]


def test_every_symbol_has_one_proc_address_entry():
    assert sorted(e.symbol for e in driver_proc_address()) == \
        sorted(fn.symbol for fn in driver_functions())
