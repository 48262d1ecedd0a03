"""What each kind of graph node does, from its parameters: the steps of a kernel, memcpy,
memset, host, event or memory node, built by the driver layer's own launch, copy and memset
code under a Recorder (graph_recording.py), so they are checked as those calls are.

Both APIs build nodes here; the runtime only translates its parameter structs.
"""

from __future__ import annotations

from . import launch, memory
from ._state import CudaError, E, Kind, ffi, handle_of, state
from .graph_recording import recording

NODE = "a graph node"


def kernel_steps(function: int, layout, grid, block, shared_bytes: int, kernel_params,
                 extra) -> tuple[list, dict]:
    """A kernel node's steps and parameters (checked as cuLaunchKernel checks them)."""
    launch._check_config(layout, grid, block, shared_bytes)
    with recording(NODE) as recorder:
        launch._submit(function, layout, grid, block, shared_bytes, 0, kernel_params, extra)
    args = recorder.steps[0][2][-1]
    return recorder.steps, {"function": function, "layout": layout, "grid": tuple(grid),
                            "block": tuple(block), "shared": shared_bytes, "args": bytes(args)}


def kernel_param_pointers(params: dict):
    """void *[] pointing at copies of each argument (what Get*Params hands back; the node
    keeps them alive)."""
    layout, args = params["layout"], params["args"]
    copies = [ffi.new("char[]", args[o:o + n] or b"\0")
              for o, n in zip(layout.offsets, layout.sizes, strict=True)]
    array = ffi.new("void *[]", [ffi.cast("void *", c) for c in copies] or 1)
    params["kept"] = (copies, array)
    return array


def function_of(func) -> tuple[int, object]:
    """(function handle, layout) of a CUfunction a kernel node names."""
    layout, handle = launch._launched_function(func)
    return handle, layout


def memcpy_steps(dst: tuple, src: tuple, width: int, height: int, depth: int) -> list:
    """A 3D copy between two sides, each (on the device?, address of byte (x, y, z=0),
    pitch, bytes between slices)."""
    if not width or not height or not depth:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a memcpy node copies nothing")
    with recording(NODE) as recorder:
        for z in range(depth):
            memory.copy_rows(dst[0], dst[1] + z * dst[3], dst[2], src[0], src[1] + z * src[3],
                             src[2], width, height, True)
    return recorder.steps


def memcpy3d_side(p, side: str) -> tuple:
    """One side of a CUDA_MEMCPY3D, as memcpy_steps wants it."""
    get = lambda name: getattr(p, side + name)  # noqa: E731 - a field of this side
    width, height = p.WidthInBytes, p.Height
    pitch = get("Pitch") or width
    rows = get("Height") or height
    device, address, pitch = memory.copy_side(
        get("MemoryType"), get("Host"), get("Device"), get("Array"), get("XInBytes"),
        get("Y"), pitch, width, height)
    slice_bytes = pitch * rows
    if get("MemoryType") == memory.CU_MEMORYTYPE_ARRAY:
        found = state.arrays[int(ffi.cast("uintptr_t", get("Array")))]
        slice_bytes = found.slice_pitch
    return device, address + get("Z") * slice_bytes, pitch, slice_bytes


def memcpy_1d_steps(dst: int, src: int, size: int) -> list:
    """A linear copy between two pointers (unified addressing says where they live)."""
    if size == 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a memcpy node copies nothing")
    with recording(NODE) as recorder:
        memory._copy_unified(dst, src, size, queued=True)
    return recorder.steps


def memset_steps(dst: int, pitch: int, value: int, element_size: int, width: int,
                 height: int) -> tuple[list, dict]:
    if element_size not in (1, 2, 4):
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "elementSize must be 1, 2 or 4")
    if not width or not height:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a memset node sets nothing")
    if height > 1 and pitch < width * element_size:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "pitch smaller than the row")
    element = (value & ((1 << 8 * element_size) - 1)).to_bytes(element_size, "little")
    with recording(NODE) as recorder:
        for row in range(height):
            memory._memset(dst + row * pitch, element, width)
    return recorder.steps, {"dst": dst, "pitch": pitch, "value": value,
                            "element_size": element_size, "width": width, "height": height}


def host_steps(fn, user_data) -> tuple[list, dict]:
    if fn == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "a host node needs a function")
    return [("host", fn, user_data)], {"fn": fn, "data": user_data}


def event_steps(event, op: str) -> tuple[list, dict]:
    """An event record node (cuEventRecord) or event wait node (cuStreamWaitEvent)."""
    handle = handle_of(event, Kind.EVENT, state.events)
    args = [handle, 0] if op == "cuEventRecord" else [0, handle]
    return [("wire", op, args)], {"event": handle}
