"""Performance hints, accepted as the hints they are: access-policy windows and the other
stream attributes, the persisting-L2 set-aside (cuCtxSetLimit) and resetting persisting
lines. On a GPU they change what its L2 cache keeps, never what a program computes; the
emulator has no cache, so they are checked as CUDA checks them and kept for the program to
read back.
"""

from __future__ import annotations

from vgpu.api.cudadefs import (
    CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW,
    CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_STREAM_ATTRIBUTE_PRIORITY,
    CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY,
    CUdevice_attribute,
)

from ._state import CudaError, E, api, ffi, state
from .memory import _check_stream
from .stream import GREATEST_PRIORITY, LEAST_PRIORITY, _stream_info

ACCESS_PROPERTIES = (0, 1, 2)  # CU_ACCESS_PROPERTY_NORMAL, _STREAMING, _PERSISTING
SYNC_POLICIES = (1, 2, 3, 4)  # CU_SYNC_POLICY_AUTO ... _BLOCKING_SYNC
MEM_SYNC_DOMAINS = (0, 1)  # CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT, _REMOTE
STREAM_ATTRIBUTES = frozenset({
    CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY,
    CU_STREAM_ATTRIBUTE_PRIORITY, CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN})
VALUE_TYPE = "CUstreamAttrValue *"
# The attributes of the streams every context has (NULL, legacy, per-thread), which have no
# entry in state.streams.
_builtin: dict[int, dict[int, bytes]] = {}


def _attributes(stream) -> dict[int, bytes]:
    handle = _check_stream(stream)
    if handle in (0, 1, 2):
        return _builtin.setdefault(handle, {})
    return state.streams[handle].setdefault("attributes", {})


def _check(attr: int, value) -> None:
    """CUDA's checks of a stream attribute's value."""
    if attr == CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        window = value.accessPolicyWindow
        largest = state.device["attributes"][
            int(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)]
        if window.num_bytes > largest or not 0.0 <= window.hitRatio <= 1.0 or \
                window.hitProp not in ACCESS_PROPERTIES or \
                window.missProp not in ACCESS_PROPERTIES:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"an access-policy window of {window.num_bytes} bytes (at most "
                            f"{largest}), hit ratio {window.hitRatio} (0 to 1), properties "
                            f"{window.hitProp}/{window.missProp}")
    elif attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY:
        if value.syncPolicy not in SYNC_POLICIES:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"unknown synchronization policy {value.syncPolicy}")
    elif attr == CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN:
        if value.memSyncDomain not in MEM_SYNC_DOMAINS:
            raise CudaError(E.CUDA_ERROR_INVALID_VALUE,
                            f"unknown memory synchronization domain {value.memSyncDomain}")
    elif attr not in STREAM_ATTRIBUTES:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{attr} is not a stream attribute")


@api
def cuStreamSetAttribute(stream, attr, value):
    if value == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the attribute's value is NULL")
    value = ffi.cast(VALUE_TYPE, value)
    _check(attr, value)
    attributes = _attributes(stream)
    if attr == CU_STREAM_ATTRIBUTE_PRIORITY:  # what cuStreamGetPriority answers too
        _stream_info(stream)["priority"] = min(max(value.priority, GREATEST_PRIORITY),
                                               LEAST_PRIORITY)
        return
    attributes[attr] = bytes(ffi.buffer(value))


@api
def cuStreamGetAttribute(stream, attr, value_out):
    if value_out == ffi.NULL:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the attribute's value is NULL")
    if attr not in STREAM_ATTRIBUTES:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"{attr} is not a stream attribute")
    value_out = ffi.cast(VALUE_TYPE, value_out)
    kept = _attributes(stream).get(attr)
    ffi.memmove(value_out, kept or bytes(ffi.sizeof(value_out[0])), ffi.sizeof(value_out[0]))
    if attr == CU_STREAM_ATTRIBUTE_PRIORITY:
        value_out.priority = _stream_info(stream)["priority"]
    elif attr == CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY and kept is None:
        value_out.syncPolicy = SYNC_POLICIES[0]


@api
def cuStreamCopyAttributes(dst, src):
    _attributes(dst).update(_attributes(src))


@api
def cuCtxResetPersistingL2Cache():
    state.current_context()  # nothing persists in a cache the emulator does not have
