"""cuda-python's driver bindings over the virtual memory API: one allocation mapped at two
reserved addresses, written through one and read through the other."""

import numpy as np
from cuda.bindings import driver as cu
from cuda_results import check

check(cu.cuInit(0))
device = check(cu.cuDeviceGet(0))
context = check(cu.cuDevicePrimaryCtxRetain(device))
check(cu.cuCtxSetCurrent(context))
prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
granularity = check(cu.cuMemGetAllocationGranularity(
    prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
handle = check(cu.cuMemCreate(granularity, prop, 0))
places = [check(cu.cuMemAddressReserve(granularity, 0, 0, 0)) for _ in range(2)]
access = cu.CUmemAccessDesc()
access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
access.location.id = 0
access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
for place in places:
    check(cu.cuMemMap(place, granularity, 0, handle, 0))
    check(cu.cuMemSetAccess(place, granularity, [access], 1))
data = np.arange(granularity // 4, dtype=np.float32)  # all of it: a large copy
check(cu.cuMemcpyHtoD(places[0], data.ctypes.data, data.nbytes))
back = np.zeros_like(data)
check(cu.cuMemcpyDtoH(back.ctypes.data, places[1], back.nbytes))
assert (back == data).all()
got = check(cu.cuMemGetAllocationPropertiesFromHandle(handle))
assert got.location.id == 0 and got.type == prop.type
for place in places:
    check(cu.cuMemUnmap(place, granularity))
    check(cu.cuMemAddressFree(place, granularity))
check(cu.cuMemRelease(handle))
print(f"granularity {granularity}; one allocation at two addresses: same bytes")
