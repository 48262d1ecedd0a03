"""Initialization, versions and device queries. The device is described by the server."""

from __future__ import annotations

from vgpu.client import Connection

from ._state import CudaError, E, api, check_out, close_at_teardown, ffi, state

PCI_BUS_ID = 33  # CU_DEVICE_ATTRIBUTE_PCI_BUS_ID

DRIVER_VERSION = 13000


@api
def cuInit(flags):
    if flags != 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "cuInit flags must be 0")
    if state.initialized:
        return
    state.initialized = True
    try:
        state.connection = Connection()
    except CudaError:
        state.initialized = False
        raise
    close_at_teardown(state.connection)
    # A server older than several devices describes only one.
    state.devices = state.connection.info.get("devices") or [state.connection.info["device"]]
    for info in state.devices:
        info["attributes"] = {int(k): v for k, v in info["attributes"].items()}
    state.device = state.devices[0]


@api
def cuDriverGetVersion(driver_version):
    check_out(driver_version)
    driver_version[0] = DRIVER_VERSION


def _device(ordinal: int) -> dict:
    return state.device_description(ordinal)


def device_count() -> int:
    state.require_init()
    return len(state.devices)


@api
def cuDeviceGet(device, ordinal):
    check_out(device)
    _device(ordinal)
    device[0] = ordinal


@api
def cuDeviceGetCount(count):
    check_out(count)
    count[0] = device_count()


@api
def cuDeviceGetName(name, length, dev):
    check_out(name)
    if length <= 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "name buffer length must be positive")
    raw = _device(dev)["name"].encode()[: length - 1]
    ffi.memmove(name, raw + b"\0", len(raw) + 1)


@api
def cuDeviceGetUuid(uuid, dev):
    check_out(uuid)
    ffi.memmove(uuid, _device(dev)["uuid"], 16)


cuDeviceGetUuid_v2 = cuDeviceGetUuid


@api
def cuDeviceTotalMem_v2(nbytes, dev):
    check_out(nbytes)
    nbytes[0] = _device(dev)["total_memory"]


@api
def cuDeviceGetAttribute(value, attrib, dev):
    check_out(value)
    attributes = _device(dev)["attributes"]
    if attrib not in attributes:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown device attribute {attrib}")
    value[0] = attributes[attrib]


def can_access_peer(dev: int, peer_dev: int) -> bool:
    """Whether kernels on `dev` can reach `peer_dev`'s memory, as the server says (`peers`
    of its description: on emu every other device, on a GPU those the driver says); a device
    is never its own peer."""
    peers = _device(dev).get("peers")
    _device(peer_dev)
    if peers is None:  # a server older than peers in descriptions: views of one device
        return dev != peer_dev
    return dev != peer_dev and peer_dev in peers


@api
def cuDeviceCanAccessPeer(can_access, dev, peer_dev):
    check_out(can_access)
    can_access[0] = int(can_access_peer(dev, peer_dev))


@api
def cuDeviceComputeCapability(major, minor, dev):
    check_out(major)
    check_out(minor)
    major[0], minor[0] = _device(dev)["compute_capability"]


@api
def cuDeviceGetPCIBusId(pci_bus_id, length, dev):
    check_out(pci_bus_id)
    bus = _device(dev)["attributes"][PCI_BUS_ID]
    raw = f"0000:{bus:02x}:00.0".encode()[: max(length - 1, 0)]
    ffi.memmove(pci_bus_id, raw + b"\0", len(raw) + 1)


@api
def cuProfilerStart():
    state.require_init()  # no profiler to start: collection is a no-op on vgpu


@api
def cuProfilerStop():
    state.require_init()
