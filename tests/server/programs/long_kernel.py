"""An unmodified cuda-python program whose kernel runs for hours (256 threads counting to two
billion): what a user stops with Ctrl-C. Prints "launched" once the kernel is queued, then
waits for it in cuCtxSynchronize (with --runtime: in the CUDA runtime's
cudaDeviceSynchronize, called through ctypes) and prints what that returned.
With --handler it catches KeyboardInterrupt, prints "interrupted" and exits with status 3;
with --exit-on-sigterm, a SIGTERM handler prints "terminating" and calls sys.exit(4).
Usage: long_kernel.py [--runtime] [--handler] [--exit-on-sigterm]"""

import ctypes
import signal
import sys

from cuda.bindings import driver as cu

PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .entry spin(.param .u32 spin_param_0)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    ld.param.u32 %r1, [spin_param_0];
    mov.u32 %r2, 0;
$L_loop:
    add.s32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra $L_loop;
    ret;
}
"""


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


def main(wait) -> None:
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    module = check(cu.cuModuleLoadData(PTX))
    spin = check(cu.cuModuleGetFunction(module, b"spin"))
    iterations = ctypes.c_uint32(2_000_000_000)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(iterations))
    check(cu.cuLaunchKernel(spin, 1, 1, 1, 256, 1, 1, 0, 0, ctypes.addressof(params), 0))
    print("launched", flush=True)
    wait()


def exit_on_sigterm(signum, frame):
    print("terminating", flush=True)
    sys.exit(4)


if __name__ == "__main__":
    if "--exit-on-sigterm" in sys.argv:
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    wait = wait_in_runtime if "--runtime" in sys.argv else wait_in_driver
    if "--handler" not in sys.argv:
        main(wait)
    else:
        try:
            main(wait)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
