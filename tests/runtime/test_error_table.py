"""The runtime's error table matches the toolkit's headers (it is generated from them)."""

from __future__ import annotations

from vgpu.shim.runtime import error_table, gen_error_table


def test_committed_table_matches_the_headers(toolkit):
    generated = gen_error_table.render(toolkit.include)
    committed = gen_error_table.OUTPUT.read_text()
    assert generated == committed, \
        "shim/runtime/error_table.py is stale: run python -m vgpu.shim.runtime.gen_error_table"


def test_codes_the_acceptance_relies_on():
    names = {value: name for value, (name, _) in error_table.RUNTIME_ERRORS.items()}
    assert names[1] == "cudaErrorInvalidValue"
    assert names[2] == "cudaErrorMemoryAllocation"
    assert names[9] == "cudaErrorInvalidConfiguration"
    assert names[98] == "cudaErrorInvalidDeviceFunction"
    assert names[209] == "cudaErrorNoKernelImageForDevice"
    assert names[400] == "cudaErrorInvalidResourceHandle"
    assert names[700] == "cudaErrorIllegalAddress"
    assert names[710] == "cudaErrorAssert"
    assert names[801] == "cudaErrorNotSupported"


def test_every_driver_error_maps_to_a_runtime_error():
    for driver, runtime in error_table.DRIVER_TO_RUNTIME.items():
        assert runtime in error_table.RUNTIME_ERRORS
        assert runtime == driver or runtime == 999  # same number, or cudaErrorUnknown
