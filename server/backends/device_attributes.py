"""The attribute table of the emulated device: what cuDeviceGetAttribute answers under emu.

Limits are those of an Ampere-class part (compute capability 8.0) because that is what the
emulator enforces: 1024 threads per block, 48 KiB static shared memory per block (opt-in up to
163 KiB), warps of 32. Cooperative launches are supported (the emulator keeps such a grid's
blocks resident together). Managed memory is offered with the contract of devices without
concurrent managed access (CONCURRENT_MANAGED_ACCESS 0: the host touches managed memory only
while the device is idle; see shim/driver/managed.py). Capabilities the emulator lacks are
reported as 0 so applications take their fallback paths; the texture, surface, cubemap,
mipmap and gather limits are within what vgpu's CUDA arrays enforce (shim/driver/arrays.py).
"""

from __future__ import annotations

from ..emu.timers import CLOCK_RATE_KHZ

__all__ = ["emu_attributes", "EMU_LIMITS", "MANAGED_CONTRACT"]

# What every backend reports of managed memory: vgpu's is synchronized at launches and
# synchronizations (shim/driver/managed.py), the contract of a device without concurrent
# managed access, whatever the GPU behind it could do.
MANAGED_CONTRACT = {
    "MANAGED_MEMORY": 1,
    "CONCURRENT_MANAGED_ACCESS": 0,
    "PAGEABLE_MEMORY_ACCESS": 0,
    "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES": 0,
    "DIRECT_MANAGED_MEM_ACCESS_FROM_HOST": 0,
}

EMU_LIMITS = {
    "MAX_THREADS_PER_BLOCK": 1024,
    "MAX_BLOCK_DIM_X": 1024,
    "MAX_BLOCK_DIM_Y": 1024,
    "MAX_BLOCK_DIM_Z": 64,
    "MAX_GRID_DIM_X": 2**31 - 1,
    "MAX_GRID_DIM_Y": 65535,
    "MAX_GRID_DIM_Z": 65535,
    "MAX_SHARED_MEMORY_PER_BLOCK": 48 * 1024,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 163 * 1024,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 164 * 1024,
    "TOTAL_CONSTANT_MEMORY": 64 * 1024,
    "WARP_SIZE": 32,
    "MAX_PITCH": 2**31 - 1,
    "MAX_REGISTERS_PER_BLOCK": 65536,
    "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "CLOCK_RATE": CLOCK_RATE_KHZ,  # what %clock and %clock64 count at
    "MEMORY_CLOCK_RATE": 1215000,
    "GLOBAL_MEMORY_BUS_WIDTH": 5120,
    "L2_CACHE_SIZE": 40 * 1024 * 1024,
    # Access-policy windows and a persisting set-aside are accepted as hints (what an A100
    # allows), though the emulator keeps no cache (shim/driver/hints.py).
    "MAX_PERSISTING_L2_CACHE_SIZE": 30 * 1024 * 1024,
    "MAX_ACCESS_POLICY_WINDOW_SIZE": 128 * 1024 * 1024 - 4096,
    "TEXTURE_ALIGNMENT": 512,
    "TEXTURE_PITCH_ALIGNMENT": 32,
    "SURFACE_ALIGNMENT": 512,
    "GPU_OVERLAP": 1,
    "MULTIPROCESSOR_COUNT": 4,
    "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "ASYNC_ENGINE_COUNT": 1,
    "CONCURRENT_KERNELS": 1,
    "COOPERATIVE_LAUNCH": 1,
    "CAN_MAP_HOST_MEMORY": 1,
    "UNIFIED_ADDRESSING": 1,
    "STREAM_PRIORITIES_SUPPORTED": 1,
    "GLOBAL_L1_CACHE_SUPPORTED": 1,
    "LOCAL_L1_CACHE_SUPPORTED": 1,
    "HOST_REGISTER_SUPPORTED": 1,
    # cuMemHostGetDevicePointer of registered memory is its host address (unified
    # addressing; kernels reach it there), as a program that checks this expects.
    "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM": 1,
    **MANAGED_CONTRACT,
    "MEMORY_POOLS_SUPPORTED": 1,
    # Pools export to a file descriptor (shim/driver/memory.py: export_pool), so programs
    # that check for it before sharing a pool between processes do not waive themselves.
    "MEMPOOL_SUPPORTED_HANDLE_TYPES": 1,  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    # cuMemCreate's memory exports to one too (shim/driver/vmm.py).
    "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": 1,
    "IPC_EVENT_SUPPORTED": 1,  # between processes of one server (server/ipc.py)
    "COMPUTE_PREEMPTION_SUPPORTED": 1,
    "SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO": 2,
    "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024,
    "PCI_BUS_ID": 0,
    "PCI_DEVICE_ID": 0,
    "PCI_DOMAIN_ID": 0,
    "COMPUTE_MODE": 0,  # CU_COMPUTEMODE_DEFAULT
    "NUMA_ID": -1,
    "HOST_NUMA_ID": -1,
    "MEM_SYNC_DOMAIN_COUNT": 1,
    **{f"MAXIMUM_{kind}{extent}": 65536 for kind in ("TEXTURE", "SURFACE")
       for extent in ("1D_WIDTH", "2D_WIDTH", "2D_HEIGHT")},
    **{f"MAXIMUM_{kind}3D_{extent}": 16384
       for kind in ("TEXTURE", "SURFACE") for extent in ("WIDTH", "HEIGHT", "DEPTH")},
    **{f"MAXIMUM_{kind}{geometry}_LAYERED_{extent}": 2048 if extent == "LAYERS" else 32768
       for kind in ("TEXTURE", "SURFACE")
       for geometry, extents in (("1D", ("WIDTH", "LAYERS")),
                                 ("2D", ("WIDTH", "HEIGHT", "LAYERS")))
       for extent in extents},
    **{f"MAXIMUM_{kind}CUBEMAP_{extent}": 2048 if extent == "LAYERED_LAYERS" else 32768
       for kind in ("TEXTURE", "SURFACE")
       for extent in ("WIDTH", "LAYERED_WIDTH", "LAYERED_LAYERS")},
    **{f"MAXIMUM_TEXTURE{extent}": 32768
       for extent in ("1D_MIPMAPPED_WIDTH", "2D_MIPMAPPED_WIDTH", "2D_MIPMAPPED_HEIGHT",
                      "2D_GATHER_WIDTH", "2D_GATHER_HEIGHT")},
    "MAXIMUM_TEXTURE1D_LINEAR_WIDTH": 1 << 28,
    "MAXIMUM_TEXTURE2D_LINEAR_WIDTH": 65536,
    "MAXIMUM_TEXTURE2D_LINEAR_HEIGHT": 65536,
    "MAXIMUM_TEXTURE2D_LINEAR_PITCH": 1 << 21,
}


def emu_attributes(compute_capability: tuple[int, int]) -> dict[int, int]:
    """Every CUdevice_attribute of cuda.h -> value (0 for what the emulator does not offer)."""
    from vgpu.api.cudadefs import CUdevice_attribute

    values = dict.fromkeys((int(a) for a in CUdevice_attribute), 0)
    prefix = "CU_DEVICE_ATTRIBUTE_"
    for attr in CUdevice_attribute:
        key = attr.name.removeprefix(prefix)
        if key in EMU_LIMITS:
            values[int(attr)] = EMU_LIMITS[key]
    major, minor = compute_capability
    values[int(CUdevice_attribute[prefix + "COMPUTE_CAPABILITY_MAJOR"])] = major
    values[int(CUdevice_attribute[prefix + "COMPUTE_CAPABILITY_MINOR"])] = minor
    values[int(CUdevice_attribute[prefix + "SHARED_MEMORY_PER_BLOCK"])] = 48 * 1024
    values[int(CUdevice_attribute[prefix + "REGISTERS_PER_BLOCK"])] = 65536
    # Named here: cuda.h's first name for this number is a deprecated alias.
    values[int(CUdevice_attribute[prefix + "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"])] = 1
    return values
