"""Where each PTX state space lives in the 64-bit generic address space.

Device allocations (global and const memory) use ordinary addresses below
`DEVICE_ADDRESS_LIMIT`; `DeviceMemory.map` refuses anything at or above it. The windows for
the spaces that are private to a block or a thread sit above that limit, so a generic address
can never be both a device address and a shared/local/param one:

    0xF000_0000_0000_0000 + offset   shared memory of the executing block (`cvta.shared`)
    0xF100_0000_0000_0000 + offset   local memory of the executing thread (`cvta.local`)
    0xF200_0000_0000_0000 + offset   the kernel's parameter buffer (`cvta.param`)
    0xF300_0000_0000_0000 + 16 * k   the k-th function of the module (function pointers)

An address inside a window means the same offset for every thread (each thread sees its own
block's shared memory and its own local memory), as on the GPU. The space-specific addresses
that `mov r, sharedvar` or `mov r, localvar` produce are the bare offsets (what `cvta.to.*`
gives back), so they fit in 32-bit registers as nvcc expects.
"""

from __future__ import annotations

__all__ = [
    "DEVICE_ADDRESS_LIMIT",
    "FUNCTION_ADDRESS_BASE",
    "GENERIC_LOCAL_BASE",
    "GENERIC_PARAM_BASE",
    "GENERIC_SHARED_BASE",
    "WINDOW_TAG_SHIFT",
    "function_addresses",
    "window_tag",
]

DEVICE_ADDRESS_LIMIT = 0xF000_0000_0000_0000
GENERIC_SHARED_BASE = 0xF000_0000_0000_0000
GENERIC_LOCAL_BASE = 0xF100_0000_0000_0000
GENERIC_PARAM_BASE = 0xF200_0000_0000_0000
# Functions have addresses (`mov r, func`, function pointer tables, virtual function tables)
# that no load or store reaches: indirect calls and device-side launches map them back.
FUNCTION_ADDRESS_BASE = 0xF300_0000_0000_0000

# The top byte of a generic address names its window (0xF0, 0xF1, 0xF2; anything else is
# global memory).
WINDOW_TAG_SHIFT = 56


def window_tag(base: int) -> int:
    return base >> WINDOW_TAG_SHIFT


def function_addresses(names) -> dict[str, int]:
    """The address of each function of a module, given its functions' names in order."""
    return {name: FUNCTION_ADDRESS_BASE + 16 * k for k, name in enumerate(names)}
