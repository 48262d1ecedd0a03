"""An unmodified cuda-python program whose kernel runs for hours (256 threads counting to two
billion): what a user stops with Ctrl-C. Prints "launched" once the kernel is queued, then
waits for it in cuCtxSynchronize (with --runtime: in the CUDA runtime's
cudaDeviceSynchronize, called through ctypes) and prints what that returned.
With --handler it catches KeyboardInterrupt, prints "interrupted" and exits with status 3;
with --wait-again too it waits for the kernel again instead, in cuCtxSynchronize, and
exits as that says. With --exit-on-sigterm, a SIGTERM handler prints "terminating" and
calls sys.exit(4). --iterations N: what the kernel's threads count to.
Usage: long_kernel.py [--runtime] [--handler [--wait-again]] [--exit-on-sigterm]
                      [--iterations N]"""

import ctypes
import signal
import sys
from pathlib import Path

from cuda.bindings import driver as cu

# The kernel: each of its threads counts to the number it is given.
PTX = (Path(__file__).parent / "spin.ptx").read_bytes()


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"failed: {err!r}")
    return values[0] if len(values) == 1 else values


def wait_in_driver() -> None:
    (err,) = cu.cuCtxSynchronize()
    print(f"cuCtxSynchronize returned {int(err)} ({err.name})", flush=True)
    sys.exit(0 if err == cu.CUresult.CUDA_SUCCESS else 2)


def wait_in_runtime() -> None:
    err = ctypes.CDLL("libcudart.so.13").cudaDeviceSynchronize()
    print(f"cudaDeviceSynchronize returned {err}", flush=True)
    sys.exit(0 if err == 0 else 2)


def main(wait, iterations: int) -> None:
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    module = check(cu.cuModuleLoadData(PTX))
    spin = check(cu.cuModuleGetFunction(module, b"spin"))
    count = ctypes.c_uint32(iterations)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(count))
    check(cu.cuLaunchKernel(spin, 1, 1, 1, 256, 1, 1, 0, 0, ctypes.addressof(params), 0))
    print("launched", flush=True)
    wait()


def exit_on_sigterm(signum, frame):
    print("terminating", flush=True)
    sys.exit(4)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--exit-on-sigterm" in args:
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    wait = wait_in_runtime if "--runtime" in args else wait_in_driver
    iterations = int(args[args.index("--iterations") + 1]) if "--iterations" in args \
        else 2_000_000_000
    if "--handler" not in args:
        main(wait, iterations)
    else:
        try:
            main(wait, iterations)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            if "--wait-again" in args:
                wait_in_driver()
            sys.exit(3)
