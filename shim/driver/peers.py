"""Several devices of one server as peers: peer access between contexts and peer copies.

A session's devices share one address space (its arena, see server/session.py), so a peer
copy is a device-to-device copy, and a kernel reaches a peer's memory where the server says
the devices are peers (on emu always; on a GPU where its driver says, whose backend grants
each allocation to the devices that can reach it), whether or not access was enabled. What
CUDA checks about enabling and disabling access is checked here.
"""

from __future__ import annotations

from . import managed
from ._state import CudaError, E, Kind, api, check_out, handle_of, state
from .device import can_access_peer
from .memory import _check_stream, _dtod

P2P_PERFORMANCE_RANK, P2P_ACCESS_SUPPORTED, P2P_NATIVE_ATOMIC_SUPPORTED = 1, 2, 3
P2P_CUDA_ARRAY_ACCESS_SUPPORTED, P2P_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED = 4, 5


def _context(ctx) -> int:
    return handle_of(ctx, Kind.CONTEXT, state.contexts, E.CUDA_ERROR_INVALID_CONTEXT)


def _peer_pair(peer_context) -> tuple[int, int]:
    current = state.current_context()
    peer = _context(peer_context)
    device, peer_device = state.contexts[current]["device"], state.contexts[peer]["device"]
    if device == peer_device:
        raise CudaError(E.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                        "a context's device is not a peer of itself")
    if not can_access_peer(device, peer_device):
        raise CudaError(E.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                        f"device {device} cannot access device {peer_device}'s memory")
    return current, peer


def enable(current: int, peer: int) -> None:
    if (current, peer) in state.peer_access:
        raise CudaError(E.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                        "peer access is already enabled")
    state.peer_access.add((current, peer))


def disable(current: int, peer: int) -> None:
    if (current, peer) not in state.peer_access:
        raise CudaError(E.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access is not enabled")
    state.peer_access.discard((current, peer))


@api
def cuCtxEnablePeerAccess(peer_context, flags):
    if flags != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "peer access flags must be 0")
    enable(*_peer_pair(peer_context))


@api
def cuCtxDisablePeerAccess(peer_context):
    disable(*_peer_pair(peer_context))


@api
def cuDeviceGetP2PAttribute(value, attrib, src_device, dst_device):
    check_out(value)
    state.device_description(src_device)
    state.device_description(dst_device)
    if src_device == dst_device:
        raise CudaError(E.CUDA_ERROR_INVALID_DEVICE, "a device is not a peer of itself")
    can = int(can_access_peer(src_device, dst_device))
    answers = {P2P_PERFORMANCE_RANK: 0, P2P_ACCESS_SUPPORTED: can,
               P2P_NATIVE_ATOMIC_SUPPORTED: can, P2P_CUDA_ARRAY_ACCESS_SUPPORTED: can,
               P2P_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: 0}
    if attrib not in answers:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown peer attribute {attrib}")
    value[0] = answers[attrib]


def copy(dst: int, dst_context, src: int, src_context, size: int, stream, queued: bool) -> None:
    _context(dst_context)
    _context(src_context)
    _check_stream(stream)
    _dtod(dst, src, size)
    if not queued:
        managed.settle()


@api
def cuMemcpyPeer(dst, dst_context, src, src_context, size):
    copy(dst, dst_context, src, src_context, size, None, queued=False)


@api
def cuMemcpyPeerAsync(dst, dst_context, src, src_context, size, stream):
    copy(dst, dst_context, src, src_context, size, stream, queued=True)
