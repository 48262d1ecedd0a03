"""state_loop.c as a cuda-python program (cuda.bindings.driver), for the tests that move its
session: the same kernels, arguments and output.

Usage: python state_loop.py KERNELS.ptx COUNT TOTAL_KIB ITERATIONS STRIDE [--only J]
                           [--pause-file PATH]
"""

import argparse
import os
import time

import numpy as np
from cuda.bindings import driver as cu
from cuda_results import check

THREADS = 256


def print_state(module, pointers):
    bases = [int(check(cu.cuMemGetAddressRange(p))[0]) for p in pointers]
    print("pointers", " ".join(hex(b) for b in bases))
    counter, _ = check(cu.cuModuleGetGlobal(module, b"iterations_done"))
    value = np.zeros(1, dtype=np.uint32)
    check(cu.cuMemcpyDtoH(value.ctypes.data, counter, 4))
    print(f"counter {hex(int(counter))} {int(value[0])}", flush=True)


def pause_requested(pause_file, k):
    """Whether the pause file asks for a pause before iteration k (state_loop.c says how)."""
    if pause_file is None:
        return False
    try:
        with open(pause_file) as f:
            text = f.read().split()
    except FileNotFoundError:
        return False
    return (int(text[0]) if text else 0) <= k


def wait_while_paused(pause_file, k):
    if not pause_requested(pause_file, k):
        return
    check(cu.cuCtxSynchronize())
    print(f"paused {k}", flush=True)
    while pause_requested(pause_file, k):
        time.sleep(0.005)


def launch(function, blocks, args):
    """cuLaunchKernel with each argument's bytes in its own numpy array."""
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    check(cu.cuLaunchKernel(function, blocks, 1, 1, THREADS, 1, 1, 0, 0, params.ctypes.data, 0))


def main():
    parser = argparse.ArgumentParser()
    for name in ("ptx", "count", "total_kib", "iterations", "stride"):
        parser.add_argument(name)
    parser.add_argument("--only", type=int, default=None)
    parser.add_argument("--pause-file", default=None)
    args = parser.parse_args()
    ptx_path, pause_file, only = args.ptx, args.pause_file, args.only
    count, total_kib = int(args.count), int(args.total_kib)
    iterations, stride = int(args.iterations), int(args.stride)
    words = total_kib * 1024 // count // 4
    print(f"pid {os.getpid()}", flush=True)

    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    with open(ptx_path, "rb") as f:
        module = check(cu.cuModuleLoadData(f.read() + b"\0"))
    step = check(cu.cuModuleGetFunction(module, b"step"))
    count_iteration = check(cu.cuModuleGetFunction(module, b"count_iteration"))

    pointers = []
    i = np.arange(words, dtype=np.uint64)
    for j in range(count):
        pointers.append(check(cu.cuMemAlloc(words * 4)))
        host = ((i * 2654435761 + j * 97) & 0xFFFFFFFF).astype(np.uint32)
        check(cu.cuMemcpyHtoD(pointers[-1], host.ctypes.data, host.nbytes))
    table_host = np.array([int(p) for p in pointers], dtype=np.uint64)
    table = check(cu.cuMemAlloc(table_host.nbytes))
    check(cu.cuMemcpyHtoD(table, table_host.ctypes.data, table_host.nbytes))
    print_state(module, pointers)

    blocks = ((words + stride - 1) // stride + THREADS - 1) // THREADS
    for k in range(iterations):
        wait_while_paused(pause_file, k)
        for j in range(count) if only is None else [only]:
            launch(step, blocks, [np.array([int(table)], dtype=np.uint64),
                                  np.array([j], dtype=np.uint32),
                                  np.array([words], dtype=np.uint64),
                                  np.array([stride], dtype=np.uint32),
                                  np.array([k], dtype=np.uint32)])
        check(cu.cuLaunchKernel(count_iteration, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0))
        check(cu.cuCtxSynchronize())
        print(f"iteration {k}", flush=True)
    wait_while_paused(pause_file, iterations)

    checksum = 0
    weights = i * 2 + 1
    for j, pointer in enumerate(pointers):
        host = np.zeros(words, dtype=np.uint32)
        check(cu.cuMemcpyDtoH(host.ctypes.data, pointer, host.nbytes))
        checksum += int(np.sum(host.astype(np.uint64) * weights, dtype=np.uint64)) * (j + 1)
    print_state(module, pointers)
    print(f"checksum {checksum % 2**64:016x}", flush=True)
    for pointer in [*pointers, table]:
        check(cu.cuMemFree(pointer))
    check(cu.cuDevicePrimaryCtxRelease(device))


if __name__ == "__main__":
    main()
