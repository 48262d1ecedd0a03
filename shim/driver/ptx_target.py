"""PTX a program hands to cuModuleLoad* is compiled for the device, as a GPU's JIT compiler
does it: PTX written for a newer architecture than the device's (`.target sm_90` on a
compute capability 8.0 device) is refused with CUDA_ERROR_INVALID_PTX, whichever backend
runs it. (Fatbins are not checked here: the backend picks their PTX for the device.)"""

from __future__ import annotations

import re

from ._state import CudaError, E

__all__ = ["check_ptx_target"]

_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d+)", re.MULTILINE)


def check_ptx_target(image: bytes, compute_capability) -> None:
    """Raise if `image` is PTX text for an architecture newer than `compute_capability`."""
    if image.lstrip()[:1] not in (b".", b"/"):   # PTX text starts with directives or comments
        return
    match = _TARGET.search(image)
    if match is None:
        return
    major, minor = compute_capability
    device = major * 10 + minor
    target = int(match.group(1))
    if target > device:
        raise CudaError(E.CUDA_ERROR_INVALID_PTX,
                        f"the PTX targets sm_{target}, newer than the device (compute "
                        f"capability {major}.{minor}): compile for compute_{device} or older")
