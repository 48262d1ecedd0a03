"""An unmodified cuda-python program that copies through pinned host memory: it fills a
device allocation from cuMemAllocHost memory, prints "ready", waits for a line on stdin, then
reads the allocation back into the pinned buffer and prints "same" or "differs"."""

import ctypes
import os
import sys

from cuda.bindings import driver as cu

SIZE = 1 << 20


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"failed: {err!r}")
    return values[0] if len(values) == 1 else None


check(cu.cuInit(0))
context = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))
check(cu.cuCtxSetCurrent(context))
host = check(cu.cuMemAllocHost(SIZE))
device = check(cu.cuMemAlloc(SIZE))
data = os.urandom(SIZE)
ctypes.memmove(host, data, SIZE)
check(cu.cuMemcpyHtoDAsync(device, host, SIZE, 0))
check(cu.cuCtxSynchronize())
print("ready", flush=True)
sys.stdin.readline()
ctypes.memset(host, 0, SIZE)
check(cu.cuMemcpyDtoH(host, device, SIZE))
print("same" if ctypes.string_at(host, SIZE) == data else "differs", flush=True)
