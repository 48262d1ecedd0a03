"""Peer access and peer copies between the devices of a server (shim/driver/peers.py says
what they are there)."""

from __future__ import annotations

from ..driver import peers as driver_peers
from ..driver.device import can_access_peer
from ..driver.memory import _check_stream
from ._state import CudaError, E, api, check_out, driver_state, primary_context, ptr
from .device import current_device

__all__ = ["cudaDeviceEnablePeerAccess", "cudaDeviceDisablePeerAccess", "cudaMemcpyPeer",
           "cudaMemcpyPeerAsync", "cudaDeviceGetP2PAttribute"]


def _pair(peer_device: int) -> tuple[int, int]:
    """(the current context, the peer device's primary context)."""
    driver_state.device_description(peer_device)
    device = current_device()
    if peer_device == device:  # cudaDeviceCanAccessPeer says 0: unsupported, as CUDA says
        raise CudaError(E.cudaErrorPeerAccessUnsupported, "a device is not a peer of itself")
    if not can_access_peer(device, peer_device):
        raise CudaError(E.cudaErrorPeerAccessUnsupported,
                        f"device {device} cannot access device {peer_device}'s memory")
    return primary_context(device), primary_context(peer_device)


@api
def cudaDeviceEnablePeerAccess(peer_device, flags):
    if flags != 0:
        raise CudaError(E.cudaErrorInvalidValue, "peer access flags must be 0")
    driver_peers.enable(*_pair(peer_device))


@api
def cudaDeviceDisablePeerAccess(peer_device):
    driver_peers.disable(*_pair(peer_device))


def _copy(dst, dst_device: int, src, src_device: int, count: int, stream,
          queued: bool) -> None:
    driver_state.device_description(dst_device)
    driver_state.device_description(src_device)
    _check_stream(stream)
    driver_peers.copy(ptr(dst), primary_context(dst_device), ptr(src),
                      primary_context(src_device), count, stream, queued)


@api
def cudaMemcpyPeer(dst, dst_device, src, src_device, count):
    _copy(dst, dst_device, src, src_device, count, None, queued=False)


@api
def cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream):
    _copy(dst, dst_device, src, src_device, count, stream, queued=True)


@api
def cudaDeviceGetP2PAttribute(value, attr, src_device, dst_device):
    check_out(value)
    driver_peers.cuDeviceGetP2PAttribute.__wrapped__(value, attr, src_device, dst_device)
