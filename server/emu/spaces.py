"""Per-lane memory access in every state space, with the checks a memory checker makes.

`locate` turns per-lane addresses in a space into (byte buffer, byte offsets, lane
positions) segments after checking alignment (CUDA_ERROR_MISALIGNED_ADDRESS) and bounds
(CUDA_ERROR_ILLEGAL_ADDRESS): global and const accesses must fall inside one live device
allocation (or, unless the launch checks strictly, inside its mapped granule: such a stray
access raises `StrayAccess` once, for the executor to report, and then goes through; see
memcheck.py), shared accesses inside the block's static + dynamic shared memory, local
accesses inside the thread's local memory, kernel parameter reads inside the parameter
buffer. Generic addresses are split by window (see `address_space.py`).
"""

from __future__ import annotations

import numpy as np

from .address_space import GENERIC_LOCAL_BASE, GENERIC_PARAM_BASE, GENERIC_SHARED_BASE
from .errors import CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_MISALIGNED_ADDRESS, IllegalAddress
from .memory import READ, READ_WRITE, load_elements, store_elements
from .state import Fault, State, lane_count

__all__ = ["STRAYS_ALLOWED", "STRAYS_FAULT", "STRAYS_REPORTED", "StrayAccess", "load",
           "locate", "out_of_bounds", "store"]

# What a launch does with stray global accesses (LaunchContext.strays).
STRAYS_FAULT, STRAYS_REPORTED, STRAYS_ALLOWED = "fault", "report", "allow"

_LABEL = {"global": "__global__", "const": "__global__", "shared": "__shared__",
          "local": "__local__", "fparam": "__local__", "kparam": "__param__",
          "generic": "__global__"}
_WINDOWS = ((GENERIC_SHARED_BASE >> 56, GENERIC_SHARED_BASE, "shared"),
            (GENERIC_LOCAL_BASE >> 56, GENERIC_LOCAL_BASE, "local"),
            (GENERIC_PARAM_BASE >> 56, GENERIC_PARAM_BASE, "kparam"))

Segment = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class StrayAccess(Fault):
    """A global access past its allocation's end but inside its mapped granule, to be
    reported; the access has not been made yet."""


class _Stray(Exception):
    """DeviceMemory found a stray lane (at `position`); `locate` says who and where."""

    def __init__(self, position: int):
        self.position = position


def _allow(position: int) -> None:
    """Stray accesses of a launch whose kernel was reported already go through quietly."""


def _catch(position: int) -> None:
    raise _Stray(position)


_STRAY_HANDLERS = {STRAYS_FAULT: None, STRAYS_ALLOWED: _allow, STRAYS_REPORTED: _catch}


def _lane(state: State, lanes, position: int) -> int:
    return position if lanes is None else int(lanes[position])


def _fault(state, lanes, position, space, access, size, address, reason, code):
    head = f"Invalid {_LABEL[space]} {access} of size {size} at 0x{int(address):x}"
    return Fault(code, head, reason, _lane(state, lanes, position))


def locate(state: State, space: str, addrs, size: int, lanes, access: str,
           check_align: bool = True) -> list[Segment]:
    """Check per-lane accesses of `size` bytes and find the bytes they touch."""
    count = lane_count(state, lanes)
    if not isinstance(addrs, np.ndarray) or addrs.ndim == 0:
        addrs = np.full(count, int(addrs) & 0xFFFF_FFFF_FFFF_FFFF, np.uint64)
    elif addrs.dtype != np.uint64:
        addrs = addrs.astype(np.uint64)
    if count == 0:
        return []
    if check_align and size > 1:
        misaligned = (addrs & np.uint64(size - 1)) != 0
        if misaligned.any():
            k = int(np.flatnonzero(misaligned)[0])
            raise _fault(state, lanes, k, space, access, size, addrs[k],
                         "address is misaligned", CUDA_ERROR_MISALIGNED_ADDRESS)
    if space in ("global", "const"):
        memory = state.ctx.memory
        try:
            return list(memory.segments(addrs, size, _STRAY_HANDLERS[state.ctx.strays],
                                        READ if access == "read" else READ_WRITE))
        except _Stray as stray:
            k = stray.position
            raise _stray(state, lanes, k, space, access, size, int(addrs[k]), memory) from None
        except IllegalAddress as exc:
            k = exc.index or 0
            raise _fault(state, lanes, k, space, access, size, addrs[k],
                         exc.denied or out_of_bounds(memory, int(addrs[k])),
                         CUDA_ERROR_ILLEGAL_ADDRESS) from None
    if space == "shared":
        _check_limit(state, lanes, addrs, size, state.ctx.launch.shared_size, space, access)
        base = state.layout.slot if lanes is None else state.layout.slot[lanes]
        offsets = base.astype(np.uint64) * np.uint64(state.shared_stride) + addrs
        return [(state.shared, offsets, None)]
    if space in ("local", "fparam"):
        _check_limit(state, lanes, addrs, size, state.ctx.launch.local_size, space, access)
        ids = state.lane_ids(lanes).astype(np.uint64)
        return [(state.local, ids * np.uint64(state.local_stride) + addrs, None)]
    if space == "kparam":
        if access != "read":
            raise _fault(state, lanes, 0, space, access, size, addrs[0],
                         "kernel parameters are read-only", CUDA_ERROR_ILLEGAL_ADDRESS)
        _check_limit(state, lanes, addrs, size, state.ctx.params.size, space, access)
        return [(state.ctx.params, addrs, None)]
    if space == "generic":
        return _locate_generic(state, addrs, size, lanes, access)
    raise ValueError(f"unknown space {space}")


def out_of_bounds(memory, address: int) -> str:
    """Why a global access is out of bounds, naming the allocation below it as a memory
    checker does."""
    nearest = memory.nearest(address)
    if nearest is None:
        return "address is out of bounds"
    base, length = nearest
    past = address - (base + length)
    where = f"is {past} bytes after" if past >= 0 else "runs past the end of"
    return (f"address is out of bounds and {where} the nearest allocation at 0x{base:x} "
            f"of size {length} bytes")


def _stray(state, lanes, position, space, access, size, address, memory) -> StrayAccess:
    head = f"Invalid {_LABEL[space]} {access} of size {size} at 0x{address:x}"
    return StrayAccess(0, head, out_of_bounds(memory, address), _lane(state, lanes, position))


def _check_limit(state, lanes, addrs, size, limit, space, access) -> None:
    bad = addrs > np.uint64(max(limit - size, 0)) if limit >= size else np.ones(len(addrs), bool)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise _fault(state, lanes, k, space, access, size, addrs[k],
                     "address is out of bounds", CUDA_ERROR_ILLEGAL_ADDRESS)


def _locate_generic(state, addrs, size, lanes, access) -> list[Segment]:
    tags = addrs >> np.uint64(56)
    if int(tags.max()) < 0xF0:
        return locate(state, "global", addrs, size, lanes, access, check_align=False)
    segments: list[Segment] = []
    handled = np.zeros(len(addrs), bool)
    for tag, base, space in _WINDOWS:
        select = tags == tag
        if not select.any():
            continue
        handled |= select
        positions = np.flatnonzero(select)
        sub_lanes = positions if lanes is None else lanes[positions]
        for buf, offs, pos in locate(state, space, addrs[positions] - np.uint64(base), size,
                                     sub_lanes, access, check_align=False):
            segments.append((buf, offs, positions if pos is None else positions[pos]))
    rest = ~handled
    if rest.any():
        positions = np.flatnonzero(rest)
        sub_lanes = positions if lanes is None else lanes[positions]
        for buf, offs, pos in locate(state, "global", addrs[positions], size, sub_lanes,
                                     access, check_align=False):
            segments.append((buf, offs, positions if pos is None else positions[pos]))
    return segments


def load(state: State, space: str, addrs, dtype: np.dtype, count: int, lanes) -> np.ndarray:
    """Per-lane loads of `count` consecutive elements: shape (k,) or (k, count)."""
    segments = locate(state, space, addrs, dtype.itemsize * count, lanes, "read")
    if len(segments) == 1 and segments[0][2] is None:
        buf, offsets, _ = segments[0]
        return load_elements(buf, offsets, dtype, count)
    k = lane_count(state, lanes)
    out = np.zeros((k,) if count == 1 else (k, count), dtype)
    for buf, offsets, positions in segments:
        out[positions] = load_elements(buf, offsets, dtype, count)
    return out


def store(state: State, space: str, addrs, values: np.ndarray, lanes) -> None:
    """Per-lane stores of `values` (shape (k,) or (k, count))."""
    count = 1 if values.ndim == 1 else values.shape[1]
    segments = locate(state, space, addrs, values.dtype.itemsize * count, lanes, "write")
    for buf, offsets, positions in segments:
        store_elements(buf, offsets, values if positions is None else values[positions])
