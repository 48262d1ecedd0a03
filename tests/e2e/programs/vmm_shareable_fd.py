"""cuda-python's driver bindings sharing virtual memory through file descriptors, for a test
to pass a descriptor between processes that no socket joins (through /proc).

Usage:
  vmm_shareable_fd.py export HOLD   an exportable allocation holding BYTES, exported; prints
                                    "pid N fd M" and keeps it until the file HOLD is gone
  vmm_shareable_fd.py import PID FD imports descriptor FD of process PID; prints the result
                                    ("import CUDA_...") and, imported, whether it holds BYTES
  vmm_shareable_fd.py forge         imports a memory file of its own that looks like vgpu's
                                    (its marker, made-up bytes); prints the result
"""

import os
import secrets
import sys
import time

import numpy as np
from cuda.bindings import driver as cu
from cuda_results import check

BYTES = np.arange(256, dtype=np.uint8)
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
VGPU_MARKER = b"vgpu-ipc-vmm\0\0\0\0"  # how vgpu's exported memory files start


def start():
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(device))))
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = POSIX_FD
    return prop, check(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))


def mapped(handle, size):
    place = check(cu.cuMemAddressReserve(size, 0, 0, 0))
    check(cu.cuMemMap(place, size, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cu.cuMemSetAccess(place, size, [access], 1))
    return place


def export(hold):
    prop, size = start()
    handle = check(cu.cuMemCreate(size, prop, 0))
    check(cu.cuMemcpyHtoD(mapped(handle, size), BYTES.ctypes.data, BYTES.nbytes))
    fd = check(cu.cuMemExportToShareableHandle(handle, POSIX_FD, 0))
    print(f"pid {os.getpid()} fd {fd}", flush=True)
    while os.path.exists(hold):
        time.sleep(0.05)


def import_from(fd):
    _, size = start()
    err, handle = cu.cuMemImportFromShareableHandle(fd, POSIX_FD)
    print("import", err.name)
    if err == cu.CUresult.CUDA_SUCCESS:
        seen = np.zeros_like(BYTES)
        check(cu.cuMemcpyDtoH(seen.ctypes.data, mapped(handle, size), seen.nbytes))
        print("holds the exporter's bytes", (seen == BYTES).all())


if sys.argv[1] == "export":
    export(sys.argv[2])
elif sys.argv[1] == "import":
    import_from(os.open(f"/proc/{sys.argv[2]}/fd/{sys.argv[3]}", os.O_RDONLY))
else:
    forged = os.memfd_create("forged")
    os.write(forged, VGPU_MARKER + secrets.token_bytes(48))
    import_from(forged)
