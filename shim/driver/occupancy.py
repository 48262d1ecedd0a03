"""Occupancy: how many blocks of a kernel fit on one multiprocessor.

Computed as CUDA's occupancy calculator does, from the device description (threads, blocks,
registers and shared memory per multiprocessor) and the kernel's attributes (registers per
thread, static shared memory, its thread limit). vgpu's runtime answers its occupancy calls
from here too (shim/runtime/occupancy.py); NVIDIA's runtime calls the driver's.
"""

from __future__ import annotations

from vgpu.api.cudadefs import CUdevice_attribute

from ._state import CudaError, E, api, check_out, ffi, state
from .launch import _function_arg

CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE = 0x1

A = CUdevice_attribute
REGISTER_ALLOCATION_UNIT = 256  # registers are given to warps in units of 256
SHARED_ALLOCATION_UNIT = 128  # shared memory is given to blocks in units of 128 bytes
SUB_PARTITIONS = 4  # a multiprocessor's register file is split four ways (Volta on)


def _device(attribute: CUdevice_attribute) -> int:
    return state.device["attributes"][int(attribute)]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _block_shared(layout, dynamic_shared: int) -> int:
    """Shared memory one block occupies: its own plus what the system reserves per block."""
    static = layout.attributes.get("shared_size_bytes", 0)
    reserved = _device(A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)
    return _round_up(static + dynamic_shared + reserved, SHARED_ALLOCATION_UNIT)


def max_active_blocks(layout, block_size: int, dynamic_shared: int) -> int:
    """Resident blocks per multiprocessor for `block_size` threads and `dynamic_shared`
    bytes of dynamic shared memory per block (0 when such a block cannot run at all)."""
    if block_size <= 0:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, "block size must be positive")
    warp = _device(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE)
    warps = -(-block_size // warp)
    static_shared = layout.attributes.get("shared_size_bytes", 0)
    # The device's block size limit, not the kernel's: CUDA's calculator does not consult
    # __launch_bounds__ here (on an H200, 256 threads of a kernel bounded to 128 get the
    # blocks its warps and registers allow, though such a launch would be refused).
    if block_size > _device(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) or \
            dynamic_shared > layout.max_dynamic_shared or \
            static_shared + dynamic_shared > \
            _device(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN):
        return 0
    limits = [
        _device(A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
        _device(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) // warp // warps,
        _device(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
        // _block_shared(layout, dynamic_shared),
    ]
    registers = layout.attributes.get("num_regs", 0)
    if registers:
        per_warp = _round_up(registers * warp, REGISTER_ALLOCATION_UNIT)
        # The hardware checks a block's registers as if its warps were spread over every
        # sub-partition, and each sub-partition holds the warps its quarter of the file fits.
        if per_warp * _round_up(warps, SUB_PARTITIONS) > \
                _device(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK):
            return 0
        per_partition = _device(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR) \
            // SUB_PARTITIONS // per_warp
        limits.append(per_partition * SUB_PARTITIONS // warps)
    return max(min(limits), 0)


@api
def cuOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, func, block_size, dynamic_shared):
    check_out(num_blocks)
    num_blocks[0] = max_active_blocks(_function_arg(func)[0], block_size, dynamic_shared)


@api
def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size,
                                                         dynamic_shared, flags):
    check_out(num_blocks)
    if flags & ~CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown occupancy flags 0x{flags:x}")
    num_blocks[0] = max_active_blocks(_function_arg(func)[0], block_size, dynamic_shared)


def available_dynamic_shared(layout, num_blocks: int, block_size: int) -> int:
    """The most dynamic shared memory a block can use with `num_blocks` blocks resident."""
    if num_blocks <= 0 or max_active_blocks(layout, block_size, 0) < num_blocks:
        return 0
    per_block = _device(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) \
        // num_blocks // SHARED_ALLOCATION_UNIT * SHARED_ALLOCATION_UNIT
    available = per_block - _block_shared(layout, 0)
    return max(0, min(available, layout.max_dynamic_shared))


@api
def cuOccupancyAvailableDynamicSMemPerBlock(dynamic_shared, func, num_blocks, block_size):
    check_out(dynamic_shared)
    dynamic_shared[0] = available_dynamic_shared(_function_arg(func)[0], num_blocks, block_size)


def max_potential_block_size(layout, dynamic_shared, block_size_limit: int) -> tuple[int, int]:
    """(grid size that fills the device, block size of the highest occupancy), as CUDA's
    calculator answers: block sizes are tried from the largest allowed down, a warp at a
    time, the largest of the best kept. `dynamic_shared(block_size)` gives the dynamic shared
    memory of a block of that size."""
    warp = _device(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE)
    largest = min(layout.attributes.get("max_threads_per_block", 1024),
                  _device(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK))
    if block_size_limit > 0:
        largest = min(largest, block_size_limit)
    best_blocks, best_size, best_threads = 0, 0, 0
    size = -(-largest // warp) * warp
    while size > 0:
        candidate = min(size, largest)
        blocks = max_active_blocks(layout, candidate, dynamic_shared(candidate))
        if blocks * candidate > best_threads:
            best_blocks, best_size, best_threads = blocks, candidate, blocks * candidate
        size -= warp
    return best_blocks * _device(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), best_size


def _potential(min_grid_size, block_size, func, to_dynamic_shared, dynamic_shared: int,
               limit: int) -> None:
    check_out(min_grid_size)
    check_out(block_size)
    layout = _function_arg(func)[0]
    if to_dynamic_shared != ffi.NULL:
        grid, size = max_potential_block_size(layout, lambda n: int(to_dynamic_shared(n)),
                                              limit)
    else:
        grid, size = max_potential_block_size(layout, lambda n: dynamic_shared, limit)
    min_grid_size[0], block_size[0] = grid, size


@api
def cuOccupancyMaxPotentialBlockSize(min_grid_size, block_size, func, to_dynamic_shared,
                                     dynamic_shared, block_size_limit):
    _potential(min_grid_size, block_size, func, to_dynamic_shared, dynamic_shared,
               block_size_limit)


@api
def cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid_size, block_size, func,
                                              to_dynamic_shared, dynamic_shared,
                                              block_size_limit, flags):
    if flags & ~CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE:
        raise CudaError(E.CUDA_ERROR_INVALID_VALUE, f"unknown occupancy flags 0x{flags:x}")
    _potential(min_grid_size, block_size, func, to_dynamic_shared, dynamic_shared,
               block_size_limit)
