"""IPC of the runtime API: the driver layer's (shim/driver/ipc.py), with the runtime's rule
that opening memory asks for cudaIpcMemLazyEnablePeerAccess."""

from __future__ import annotations

from vgpu.api.cudartdefs import cudaIpcMemLazyEnablePeerAccess

from ..driver import ipc as driver_ipc
from ._state import CudaError, E, api, check_out, ptr, set_pointer

__all__ = ["cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle",
           "cudaIpcGetEventHandle", "cudaIpcOpenEventHandle"]


@api
def cudaIpcGetMemHandle(handle, dev_ptr):
    check_out(handle)
    driver_ipc.cuIpcGetMemHandle.__wrapped__(handle, ptr(dev_ptr))


@api
def cudaIpcOpenMemHandle(dev_ptr, handle, flags):
    check_out(dev_ptr)
    if flags != cudaIpcMemLazyEnablePeerAccess:
        raise CudaError(E.cudaErrorInvalidValue,
                        "flags must be cudaIpcMemLazyEnablePeerAccess")
    address = driver_ipc.open_mem_handle(handle, flags)
    set_pointer(dev_ptr, address)


@api
def cudaIpcCloseMemHandle(dev_ptr):
    driver_ipc.cuIpcCloseMemHandle.__wrapped__(ptr(dev_ptr))


@api
def cudaIpcGetEventHandle(handle, event):
    driver_ipc.cuIpcGetEventHandle.__wrapped__(handle, event)


@api
def cudaIpcOpenEventHandle(event_out, handle):
    set_pointer(event_out, driver_ipc.open_event_handle(handle))
