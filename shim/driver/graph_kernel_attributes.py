"""Launch attributes of kernel nodes (cuGraphKernelNodeSetAttribute and its runtime twin).

A kernel node keeps each attribute set on it (its 64-byte CUlaunchAttributeValue) across
new parameters, and copies of the graph keep them. What they change here: a cooperative
node launches cooperatively (checked against the occupancy calculator as
cuLaunchCooperativeKernel is). Access-policy windows, priorities, synchronization and
memory-sync-domain policies, cluster scheduling preferences and the shared-memory carveout
are hints, accepted and handed back as CUDA's are; clusters of more than one block and
device-updatable nodes vgpu does not have (CUDA_ERROR_NOT_SUPPORTED).
"""

from __future__ import annotations

from . import launch
from ._state import CudaError, E, api, check_out, ffi
from .graph_model import KERNEL, Node, graphs

VALUE_BYTES = 64  # sizeof(CUlaunchAttributeValue)
COOPERATIVE, CLUSTER_DIMENSION, DEVICE_UPDATABLE = 2, 4, 13
# The launch attributes a kernel node takes (the programmatic ones are edges' in a graph).
NODE_ATTRIBUTES = {1, 2, 3, 4, 5, 8, 9, 10, 11, 13, 14, 16}


def _of_kind(value, kind: int) -> Node:
    node = graphs.node(value)
    if node.kind != kind:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "the node is not a kernel node")
    return node


def _value(value) -> bytes:
    return ffi.buffer(ffi.cast("char *", value), VALUE_BYTES)[:]


def _check(attr: int, value) -> None:
    if attr not in NODE_ATTRIBUTES:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"launch attribute {attr} is not one of "
                                                    f"a kernel node")
    typed = ffi.cast("CUlaunchAttributeValue *", value)
    if attr == CLUSTER_DIMENSION:
        dims = typed.clusterDim
        if dims.x * dims.y * dims.z > 1:
            raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED, "thread block clusters are not "
                                                        "supported")
    if attr == DEVICE_UPDATABLE and typed.deviceUpdatableKernelNode.deviceUpdatable:
        raise CudaError(E.CUDA_ERROR_NOT_SUPPORTED,
                        "vgpu's kernels do not update graph nodes from the device")


def apply(steps: list, params: dict) -> list:
    """A kernel node's steps as its attributes make them (cooperative or not)."""
    value = params.get("attributes", {}).get(COOPERATIVE)
    cooperative = bool(value) and int.from_bytes(value[:4], "little", signed=True) != 0
    if cooperative:
        launch.check_cooperative(params["layout"], params["grid"], params["block"],
                                 params["shared"])
    op = "cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel"
    return [("wire", op, list(step[2])) for step in steps]


def keep(old: dict, make):
    """make() of a kernel node's new parameters that keeps the attributes set on it."""
    def remade():
        steps, params = make()
        if "attributes" in old:
            params["attributes"] = old["attributes"]
            steps = apply(steps, params)
        return steps, params
    return remade


def set_attribute(node, attr: int, value) -> None:
    check_out(value)
    target = _of_kind(node, KERNEL)
    _check(attr, value)
    params = dict(target.params)
    # A new dict: copies of the graph share the old one, and keep what they had.
    params["attributes"] = {**params.get("attributes", {}), attr: _value(value)}
    target.steps, target.params = apply(target.steps, params), params


def get_attribute(node, attr: int, value_out) -> None:
    check_out(value_out)
    target = _of_kind(node, KERNEL)
    if attr not in NODE_ATTRIBUTES:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"launch attribute {attr} is not one of "
                                                    f"a kernel node")
    value = target.params.get("attributes", {}).get(attr, bytes(VALUE_BYTES))
    ffi.memmove(ffi.cast("char *", value_out), value, VALUE_BYTES)


def copy_attributes(dst, src) -> None:
    source, target = _of_kind(src, KERNEL), _of_kind(dst, KERNEL)
    params = dict(target.params)
    params["attributes"] = dict(source.params.get("attributes", {}))
    target.steps, target.params = apply(target.steps, params), params


@api
def cuGraphKernelNodeSetAttribute(node, attr, value):
    set_attribute(node, attr, value)


@api
def cuGraphKernelNodeGetAttribute(node, attr, value_out):
    get_attribute(node, attr, value_out)


@api
def cuGraphKernelNodeCopyAttributes(dst, src):
    copy_attributes(dst, src)
