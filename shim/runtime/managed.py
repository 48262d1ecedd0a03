"""Managed memory through the runtime API: cudaMallocManaged and the calls about it, on the
driver layer's managed memory (shim/driver/managed.py says how one pointer serves the host
and the device). __managed__ variables are registered in registration.py."""

from __future__ import annotations

from ..driver import managed as driver_managed
from ._state import api, check_out, ptr, set_pointer

__all__ = ["cudaMallocManaged", "cudaMemPrefetchAsync", "cudaMemAdvise",
           "cudaMemRangeGetAttribute", "cudaStreamAttachMemAsync"]


@api
def cudaMallocManaged(dev_ptr, size, flags):
    """0 bytes are NULL, as NVIDIA's runtime answers them (the driver refuses them)."""
    check_out(dev_ptr)
    set_pointer(dev_ptr, driver_managed.allocate(size, flags) if size else 0)


@api
def cudaMemPrefetchAsync(dev_ptr, count, location, flags, stream):
    driver_managed.cuMemPrefetchAsync_v2.__wrapped__(ptr(dev_ptr), count, location, flags,
                                                     stream)


@api
def cudaMemAdvise(dev_ptr, count, advice, location):
    driver_managed.cuMemAdvise_v2.__wrapped__(ptr(dev_ptr), count, advice, location)


@api
def cudaMemRangeGetAttribute(data, data_size, attribute, dev_ptr, count):
    driver_managed.cuMemRangeGetAttribute.__wrapped__(data, data_size, attribute, ptr(dev_ptr),
                                                      count)


@api
def cudaStreamAttachMemAsync(stream, dev_ptr, length, flags):
    driver_managed.attach(stream, ptr(dev_ptr), length, flags)
