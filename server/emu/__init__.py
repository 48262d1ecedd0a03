"""PTX emulator: the `emu` backend's CPU execution of CUDA kernels.

    module = PtxModule.parse(ptx_text)      # or link([ptx1, ptx2]) for separate compilation
    result = launch(module, "kernel", grid=(gx, gy, gz), block=(bx, by, bz),
                    shared_bytes=0, params=b"...", memory=DeviceMemory(), symbols={...})
    result.printf                           # device printf output, deterministic order

    prepared = prepare(module, "kernel", grid, block, shared_bytes, symbols)  # checked once
    prepared.run(params, memory)            # as launch(), for each parameter buffer
    with quiet_floating_point():            # many launches: what run() enters each time,
        prepared.execute(params, memory)    # entered once

See README.md for what is supported and how it works.
"""

from .errors import IllegalAddress, LaunchError, PtxError
from .executor import (
    LaunchCancelled,
    LaunchResult,
    PreparedLaunch,
    launch,
    prepare,
    quiet_floating_point,
)
from .linker import link
from .memcheck import MemoryChecker
from .memory import DeviceMemory
from .module import KernelInfo, ModuleVariable, ParamInfo, PtxModule

__all__ = [
    "DeviceMemory",
    "IllegalAddress",
    "KernelInfo",
    "LaunchCancelled",
    "LaunchError",
    "LaunchResult",
    "MemoryChecker",
    "ModuleVariable",
    "ParamInfo",
    "PtxError",
    "PreparedLaunch",
    "PtxModule",
    "launch",
    "link",
    "prepare",
    "quiet_floating_point",
]
