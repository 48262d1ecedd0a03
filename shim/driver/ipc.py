"""IPC between processes of one server: device memory one process exports with
cuIpcGetMemHandle and another maps with cuIpcOpenMemHandle (server/ipc.py says how).

An opened handle is device memory of this process too (copies and kernels use its address),
but freed only by cuIpcCloseMemHandle, as on CUDA.
"""

from __future__ import annotations

from ._state import CudaError, E, api, check_out, ffi, state

HANDLE_BYTES = 64
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1


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
