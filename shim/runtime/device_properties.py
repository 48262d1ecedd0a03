"""`struct cudaDeviceProp` (CUDA 13 layout) filled from the server's device description.

Each field reports one or more CUdevice_attribute values (the `CU_DEVICE_ATTRIBUTE_` prefix
is left out below), so the struct can never disagree with `cudaDeviceGetAttribute`. The few
fields with no attribute come from the description itself (name, UUID, total memory) or are
zero (the Windows-only LUID, the reserved words).
"""

from __future__ import annotations

from functools import cache

from vgpu.api.cudadefs import CUdevice_attribute

from ._state import ffi

__all__ = ["FIELDS", "fill_device_properties"]

FIELDS: dict[str, str | tuple[str, ...]] = {
    "sharedMemPerBlock": "MAX_SHARED_MEMORY_PER_BLOCK",
    "regsPerBlock": "MAX_REGISTERS_PER_BLOCK",
    "warpSize": "WARP_SIZE",
    "memPitch": "MAX_PITCH",
    "maxThreadsPerBlock": "MAX_THREADS_PER_BLOCK",
    "maxThreadsDim": ("MAX_BLOCK_DIM_X", "MAX_BLOCK_DIM_Y", "MAX_BLOCK_DIM_Z"),
    "maxGridSize": ("MAX_GRID_DIM_X", "MAX_GRID_DIM_Y", "MAX_GRID_DIM_Z"),
    "totalConstMem": "TOTAL_CONSTANT_MEMORY",
    "major": "COMPUTE_CAPABILITY_MAJOR",
    "minor": "COMPUTE_CAPABILITY_MINOR",
    "textureAlignment": "TEXTURE_ALIGNMENT",
    "texturePitchAlignment": "TEXTURE_PITCH_ALIGNMENT",
    "multiProcessorCount": "MULTIPROCESSOR_COUNT",
    "integrated": "INTEGRATED",
    "canMapHostMemory": "CAN_MAP_HOST_MEMORY",
    "maxTexture1D": "MAXIMUM_TEXTURE1D_WIDTH",
    "maxTexture1DMipmap": "MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH",
    "maxTexture2D": ("MAXIMUM_TEXTURE2D_WIDTH", "MAXIMUM_TEXTURE2D_HEIGHT"),
    "maxTexture2DMipmap": ("MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH",
                           "MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT"),
    "maxTexture2DLinear": ("MAXIMUM_TEXTURE2D_LINEAR_WIDTH", "MAXIMUM_TEXTURE2D_LINEAR_HEIGHT",
                           "MAXIMUM_TEXTURE2D_LINEAR_PITCH"),
    "maxTexture2DGather": ("MAXIMUM_TEXTURE2D_GATHER_WIDTH", "MAXIMUM_TEXTURE2D_GATHER_HEIGHT"),
    "maxTexture3D": ("MAXIMUM_TEXTURE3D_WIDTH", "MAXIMUM_TEXTURE3D_HEIGHT",
                     "MAXIMUM_TEXTURE3D_DEPTH"),
    "maxTexture3DAlt": ("MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE", "MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE",
                        "MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE"),
    "maxTextureCubemap": "MAXIMUM_TEXTURECUBEMAP_WIDTH",
    "maxTexture1DLayered": ("MAXIMUM_TEXTURE1D_LAYERED_WIDTH",
                            "MAXIMUM_TEXTURE1D_LAYERED_LAYERS"),
    "maxTexture2DLayered": ("MAXIMUM_TEXTURE2D_LAYERED_WIDTH", "MAXIMUM_TEXTURE2D_LAYERED_HEIGHT",
                            "MAXIMUM_TEXTURE2D_LAYERED_LAYERS"),
    "maxTextureCubemapLayered": ("MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH",
                                 "MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS"),
    "maxSurface1D": "MAXIMUM_SURFACE1D_WIDTH",
    "maxSurface2D": ("MAXIMUM_SURFACE2D_WIDTH", "MAXIMUM_SURFACE2D_HEIGHT"),
    "maxSurface3D": ("MAXIMUM_SURFACE3D_WIDTH", "MAXIMUM_SURFACE3D_HEIGHT",
                     "MAXIMUM_SURFACE3D_DEPTH"),
    "maxSurface1DLayered": ("MAXIMUM_SURFACE1D_LAYERED_WIDTH",
                            "MAXIMUM_SURFACE1D_LAYERED_LAYERS"),
    "maxSurface2DLayered": ("MAXIMUM_SURFACE2D_LAYERED_WIDTH", "MAXIMUM_SURFACE2D_LAYERED_HEIGHT",
                            "MAXIMUM_SURFACE2D_LAYERED_LAYERS"),
    "maxSurfaceCubemap": "MAXIMUM_SURFACECUBEMAP_WIDTH",
    "maxSurfaceCubemapLayered": ("MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH",
                                 "MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS"),
    "surfaceAlignment": "SURFACE_ALIGNMENT",
    "concurrentKernels": "CONCURRENT_KERNELS",
    "ECCEnabled": "ECC_ENABLED",
    "pciBusID": "PCI_BUS_ID",
    "pciDeviceID": "PCI_DEVICE_ID",
    "pciDomainID": "PCI_DOMAIN_ID",
    "tccDriver": "TCC_DRIVER",
    "asyncEngineCount": "ASYNC_ENGINE_COUNT",
    "unifiedAddressing": "UNIFIED_ADDRESSING",
    "memoryBusWidth": "GLOBAL_MEMORY_BUS_WIDTH",
    "l2CacheSize": "L2_CACHE_SIZE",
    "persistingL2CacheMaxSize": "MAX_PERSISTING_L2_CACHE_SIZE",
    "maxThreadsPerMultiProcessor": "MAX_THREADS_PER_MULTIPROCESSOR",
    "streamPrioritiesSupported": "STREAM_PRIORITIES_SUPPORTED",
    "globalL1CacheSupported": "GLOBAL_L1_CACHE_SUPPORTED",
    "localL1CacheSupported": "LOCAL_L1_CACHE_SUPPORTED",
    "sharedMemPerMultiprocessor": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "regsPerMultiprocessor": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "managedMemory": "MANAGED_MEMORY",
    "isMultiGpuBoard": "MULTI_GPU_BOARD",
    "multiGpuBoardGroupID": "MULTI_GPU_BOARD_GROUP_ID",
    "hostNativeAtomicSupported": "HOST_NATIVE_ATOMIC_SUPPORTED",
    "pageableMemoryAccess": "PAGEABLE_MEMORY_ACCESS",
    "concurrentManagedAccess": "CONCURRENT_MANAGED_ACCESS",
    "computePreemptionSupported": "COMPUTE_PREEMPTION_SUPPORTED",
    "canUseHostPointerForRegisteredMem": "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
    "cooperativeLaunch": "COOPERATIVE_LAUNCH",
    "sharedMemPerBlockOptin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "pageableMemoryAccessUsesHostPageTables": "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
    "directManagedMemAccessFromHost": "DIRECT_MANAGED_MEM_ACCESS_FROM_HOST",
    "maxBlocksPerMultiProcessor": "MAX_BLOCKS_PER_MULTIPROCESSOR",
    "accessPolicyMaxWindowSize": "MAX_ACCESS_POLICY_WINDOW_SIZE",
    "reservedSharedMemPerBlock": "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "hostRegisterSupported": "HOST_REGISTER_SUPPORTED",
    "sparseCudaArraySupported": "SPARSE_CUDA_ARRAY_SUPPORTED",
    "hostRegisterReadOnlySupported": "READ_ONLY_HOST_REGISTER_SUPPORTED",
    "timelineSemaphoreInteropSupported": "TIMELINE_SEMAPHORE_INTEROP_SUPPORTED",
    "memoryPoolsSupported": "MEMORY_POOLS_SUPPORTED",
    "gpuDirectRDMASupported": "GPU_DIRECT_RDMA_SUPPORTED",
    "gpuDirectRDMAFlushWritesOptions": "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
    "gpuDirectRDMAWritesOrdering": "GPU_DIRECT_RDMA_WRITES_ORDERING",
    "memoryPoolSupportedHandleTypes": "MEMPOOL_SUPPORTED_HANDLE_TYPES",
    "deferredMappingCudaArraySupported": "DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED",
    "ipcEventSupported": "IPC_EVENT_SUPPORTED",
    "clusterLaunch": "CLUSTER_LAUNCH",
    "unifiedFunctionPointers": "UNIFIED_FUNCTION_POINTERS",
    "deviceNumaConfig": "NUMA_CONFIG",
    "deviceNumaId": "NUMA_ID",
    "mpsEnabled": "MPS_ENABLED",
    "hostNumaId": "HOST_NUMA_ID",
    "gpuPciDeviceID": "GPU_PCI_DEVICE_ID",
    "gpuPciSubsystemID": "GPU_PCI_SUBSYSTEM_ID",
    "hostNumaMultinodeIpcSupported": "HOST_NUMA_MULTINODE_IPC_SUPPORTED",
}


@cache
def _attribute_numbers() -> dict[str, int | tuple[int, ...]]:
    def number(name: str) -> int:
        return int(CUdevice_attribute["CU_DEVICE_ATTRIBUTE_" + name])

    return {field: tuple(map(number, names)) if isinstance(names, tuple) else number(names)
            for field, names in FIELDS.items()}


def fill_device_properties(prop, device: dict) -> None:
    """Write the description `device` (name, uuid, total_memory, attributes) into `prop`."""
    size = ffi.sizeof(prop[0])
    ffi.memmove(prop, bytes(size), size)
    name = device["name"].encode()[:255]
    ffi.memmove(prop.name, name, len(name))
    ffi.memmove(prop.uuid.bytes, bytes(device["uuid"])[:16], 16)
    prop.totalGlobalMem = device["total_memory"]
    attributes = device["attributes"]
    for field, numbers in _attribute_numbers().items():
        if isinstance(numbers, tuple):
            setattr(prop, field, [attributes.get(n, 0) for n in numbers])
        else:
            setattr(prop, field, attributes.get(numbers, 0))
