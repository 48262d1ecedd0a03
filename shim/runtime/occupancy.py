"""Occupancy of the runtime API, computed by the driver layer's calculator
(shim/driver/occupancy.py). `cudaOccupancyMaxPotentialBlockSize` is a template in
cuda_runtime.h built on these calls, so programs get it from here too.
"""

from __future__ import annotations

from vgpu.api.cudartdefs import cudaOccupancyDisableCachingOverride

from ..driver.occupancy import available_dynamic_shared, max_active_blocks
from ._state import CudaError, E, api, check_out
from .launch import function_layout

__all__ = [
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cudaOccupancyAvailableDynamicSMemPerBlock",
]


@api
def cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, func, block_size,
                                                  dynamic_shared):
    check_out(num_blocks)
    num_blocks[0] = max_active_blocks(function_layout(func)[1], block_size, dynamic_shared)


@api
def cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size,
                                                           dynamic_shared, flags):
    check_out(num_blocks)
    if flags & ~cudaOccupancyDisableCachingOverride:
        raise CudaError(E.cudaErrorInvalidValue, f"unknown occupancy flags 0x{flags:x}")
    num_blocks[0] = max_active_blocks(function_layout(func)[1], block_size, dynamic_shared)


@api
def cudaOccupancyAvailableDynamicSMemPerBlock(dynamic_shared, func, num_blocks, block_size):
    """The most dynamic shared memory a block can use with `num_blocks` blocks resident."""
    check_out(dynamic_shared)
    dynamic_shared[0] = available_dynamic_shared(function_layout(func)[1], num_blocks,
                                                 block_size)
