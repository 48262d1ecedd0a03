"""A cuda-python program on two devices, for the tests that move its session: a buffer on
each device, each iteration scaling both (x = 3x - 1, each by a kernel of its own device's
module and context, the second on a stream) and copying the first half of device 0's buffer
into device 1's (cuMemcpyPeer). At the end both buffers are checked against the same loop
computed here on the host.

Usage: python two_device_loop.py MANAGED_KERNELS.ptx WORDS ITERATIONS [--pause-file PATH]
(pauses as state_loop.c does: before iteration k while the file holds a number <= k)
"""

import argparse
import os
import time

import numpy as np
from cuda.bindings import driver as cu
from state_loop import check, pause_requested

THREADS = 128


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ptx")
    parser.add_argument("words", type=int)
    parser.add_argument("iterations", type=int)
    parser.add_argument("--pause-file", default=None)
    args = parser.parse_args()
    n, half = args.words, args.words // 2
    print(f"pid {os.getpid()}", flush=True)

    check(cu.cuInit(0))
    assert check(cu.cuDeviceGetCount()) == 2
    devices = [check(cu.cuDeviceGet(d)) for d in range(2)]
    contexts = [check(cu.cuDevicePrimaryCtxRetain(d)) for d in devices]
    with open(args.ptx, "rb") as f:
        ptx = f.read() + b"\0"
    scales, buffers, streams = [], [], []
    expected = [np.arange(n, dtype=np.int32) * (7 * d + 1) for d in range(2)]
    for d in range(2):
        check(cu.cuCtxSetCurrent(contexts[d]))
        module = check(cu.cuModuleLoadData(ptx))
        scales.append(check(cu.cuModuleGetFunction(module, b"scale")))
        buffers.append(check(cu.cuMemAlloc(n * 4)))
        check(cu.cuMemcpyHtoD(buffers[d], expected[d].ctypes.data, n * 4))
        streams.append(check(cu.cuStreamCreate(0)) if d else 0)
    ordinals = [check(cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b)) for b in buffers]
    print("pointers", *(hex(int(b)) for b in buffers), "on devices", *ordinals, flush=True)

    blocks = (n + THREADS - 1) // THREADS
    count = np.array([n], dtype=np.int32)
    for k in range(args.iterations):
        if pause_requested(args.pause_file, k):
            for context in contexts:
                check(cu.cuCtxSetCurrent(context))
                check(cu.cuCtxSynchronize())
            print(f"paused {k}", flush=True)
            while pause_requested(args.pause_file, k):
                time.sleep(0.005)
        for d in range(2):
            check(cu.cuCtxSetCurrent(contexts[d]))
            pointer = np.array([int(buffers[d])], dtype=np.uint64)
            params = np.array([pointer.ctypes.data, count.ctypes.data], dtype=np.uint64)
            check(cu.cuLaunchKernel(scales[d], blocks, 1, 1, THREADS, 1, 1, 0, streams[d],
                                    params.ctypes.data, 0))
        check(cu.cuStreamSynchronize(streams[1]))
        check(cu.cuCtxSetCurrent(contexts[0]))
        check(cu.cuCtxSynchronize())
        check(cu.cuMemcpyPeer(buffers[1], contexts[1], buffers[0], contexts[0], half * 4))
        for d in range(2):
            expected[d] = expected[d] * 3 - 1
        expected[1][:half] = expected[0][:half]
        print(f"iteration {k}", flush=True)

    for d in range(2):
        check(cu.cuCtxSetCurrent(contexts[d]))
        host = np.zeros(n, dtype=np.int32)
        check(cu.cuMemcpyDtoH(host.ctypes.data, buffers[d], n * 4))
        print(f"device {d} matches the host: {bool((host == expected[d]).all())}", flush=True)
    ordinals = [check(cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b)) for b in buffers]
    print("pointers", *(hex(int(b)) for b in buffers), "on devices", *ordinals, flush=True)
    for d in range(2):
        check(cu.cuCtxSetCurrent(contexts[d]))
        check(cu.cuMemFree(buffers[d]))
        check(cu.cuDevicePrimaryCtxRelease(devices[d]))


if __name__ == "__main__":
    main()
