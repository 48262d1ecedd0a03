"""Occupancy of the runtime API, computed by the driver layer's calculator
(shim/driver/occupancy.py). `cudaOccupancyMaxPotentialBlockSize` is a template in
cuda_runtime.h built on these calls, so programs get it from here too.
"""

from __future__ import annotations

from ..driver import occupancy as driver_occupancy
from ..driver.occupancy import available_dynamic_shared
from ._state import api, check_out
from .launch import function_layout

__all__ = [
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cudaOccupancyAvailableDynamicSMemPerBlock",
]


@api
def cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, func, block_size,
                                                  dynamic_shared):
    driver_occupancy.cuOccupancyMaxActiveBlocksPerMultiprocessor.__wrapped__(
        num_blocks, function_layout(func)[0], block_size, dynamic_shared)


@api
def cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size,
                                                           dynamic_shared, flags):
    driver_occupancy.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags.__wrapped__(
        num_blocks, function_layout(func)[0], block_size, dynamic_shared, flags)


@api
def cudaOccupancyAvailableDynamicSMemPerBlock(dynamic_shared, func, num_blocks, block_size):
    """The most dynamic shared memory a block can use with `num_blocks` blocks resident."""
    check_out(dynamic_shared)
    dynamic_shared[0] = available_dynamic_shared(function_layout(func)[1], num_blocks,
                                                 block_size)
