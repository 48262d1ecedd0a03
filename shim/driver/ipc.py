"""IPC between processes of one server: device memory one process exports with
cuIpcGetMemHandle and another maps with cuIpcOpenMemHandle, and events one records and
another waits for (cuIpcGetEventHandle, cuIpcOpenEventHandle); server/ipc.py says how.

An opened handle is device memory of this process too (copies and kernels use its address),
but freed only by cuIpcCloseMemHandle, as on CUDA.
"""

from __future__ import annotations

from vgpu.protocol import IPC_HANDLE_BYTES as HANDLE_BYTES
from vgpu.protocol import IPC_MARKERS

from ._state import CudaError, E, Kind, api, check_out, ffi, handle_of, state

MEM_MARKER = IPC_MARKERS["memory"]
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
# CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS: what an event must be to be exported.
INTERPROCESS_EVENT = 0x2 | 0x4


@api
def cuIpcGetMemHandle(p_handle, dptr):
    check_out(p_handle)
    state.current_context()
    handle, _ = state.conn().call("cuIpcGetMemHandle", int(dptr))
    ffi.memmove(p_handle.reserved, handle, HANDLE_BYTES)


@api
def cuIpcOpenMemHandle_v2(pdptr, handle, flags):
    check_out(pdptr)
    pdptr[0] = open_mem_handle(handle, flags)


def open_mem_handle(handle, flags: int) -> int:
    """The address another process's exported memory got here (`handle`: the struct)."""
    context = state.current_context()
    if flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown IPC flags 0x{flags:x}")
    (address, size), _ = state.conn().call("cuIpcOpenMemHandle", context,
                                           ffi.unpack(handle.reserved, HANDLE_BYTES))
    opened = state.ipc_opened.get(address, 0)
    if not opened:
        state.add_allocation(address, size, context)
    state.ipc_opened[address] = opened + 1
    return address


cuIpcOpenMemHandle = cuIpcOpenMemHandle_v2


@api
def cuIpcCloseMemHandle(dptr):
    close_mem_handle(int(dptr))


def close_mem_handle(dptr: int) -> None:
    """One opening of `dptr` less; the last unmaps it."""
    state.current_context()
    opened = state.ipc_opened.get(int(dptr))
    if opened is None:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                        f"0x{int(dptr):x} is not memory opened with cuIpcOpenMemHandle")
    if opened == 1:
        del state.ipc_opened[int(dptr)]
        state.remove_allocation(int(dptr))
    else:
        state.ipc_opened[int(dptr)] = opened - 1
    state.conn().post("cuIpcCloseMemHandle", int(dptr))


@api
def cuIpcGetEventHandle(p_handle, event):
    check_out(p_handle)
    handle = handle_of(event, Kind.EVENT, state.events)
    if state.events[handle]["flags"] & INTERPROCESS_EVENT != INTERPROCESS_EVENT:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the event was not created with "
                        "CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING")
    data, _ = state.conn().call("cuIpcGetEventHandle", handle)
    ffi.memmove(p_handle.reserved, data, HANDLE_BYTES)


@api
def cuIpcOpenEventHandle(ph_event, handle):
    check_out(ph_event)
    ph_event[0] = ffi.cast("CUevent", open_event_handle(handle))


def open_event_handle(handle) -> int:
    """An event of this process that is another's exported event (`handle`: the struct)."""
    context = state.current_context()
    event = state.new_handle(Kind.EVENT)
    flags, _ = state.conn().call("cuIpcOpenEventHandle", event, context,
                                 ffi.unpack(handle.reserved, HANDLE_BYTES))
    state.events[event] = {"context": context, "flags": flags, "imported": True}
    return event
