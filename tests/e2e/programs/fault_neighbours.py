"""Two roles for the tests of sessions side by side when one of them faults, as a
cuda-python program (cuda.bindings.driver) whose kernels are hand-written PTX:

  python fault_neighbours.py neighbour   adds 1 to 256 words, says "ready", waits for a line
                                         on stdin, adds 1 again and checks every word is 2
  python fault_neighbours.py faulter     stores to an address nothing maps, says the error
                                         its synchronization got, waits for a line, then
                                         resets the device and adds 1 to 256 words as the
                                         neighbour does

Each prints "pid PID" first, its results as lines, and stops at the first unexpected
CUDA error with that error's name.
"""

import os
import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda_results import check, error_name

PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry bump(.param .u64 words)
{
    .reg .u32 %r<3>;
    .reg .u64 %rd<4>;
    ld.param.u64 %rd1, [words];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    ld.global.u32 %r2, [%rd3];
    add.u32 %r2, %r2, 1;
    st.global.u32 [%rd3], %r2;
    ret;
}

.visible .entry wild()
{
    .reg .u64 %rd<2>;
    mov.u64 %rd1, 64;
    st.global.u32 [%rd1], 7;
    ret;
}
"""
WORDS = 256


def start():
    """A context on device 0 and the module loaded: (context, module)."""
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    return device, check(cu.cuModuleLoadData(PTX))


def bump(module, words) -> None:
    function = check(cu.cuModuleGetFunction(module, b"bump"))
    address = np.array([int(words)], dtype=np.uint64)
    params = np.array([address.ctypes.data], dtype=np.uint64)
    check(cu.cuLaunchKernel(function, 1, 1, 1, WORDS, 1, 1, 0, 0, params.ctypes.data, 0))
    check(cu.cuCtxSynchronize())


def read(words) -> np.ndarray:
    out = np.zeros(WORDS, dtype=np.uint32)
    check(cu.cuMemcpyDtoH(out.ctypes.data, words, out.nbytes))
    return out


def fresh_words():
    words = check(cu.cuMemAlloc(WORDS * 4))
    check(cu.cuMemsetD32(words, 0, WORDS))
    return words


def neighbour() -> None:
    _, module = start()
    words = fresh_words()
    bump(module, words)
    print("ready", flush=True)
    sys.stdin.readline()
    bump(module, words)
    values = read(words)
    print("words all 2" if (values == 2).all() else f"words wrong: {values[:8]}", flush=True)


def faulter() -> None:
    device, module = start()
    function = check(cu.cuModuleGetFunction(module, b"wild"))
    check(cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0))
    (err,) = cu.cuCtxSynchronize()
    print(f"fault {error_name(err)}", flush=True)
    sys.stdin.readline()
    check(cu.cuDevicePrimaryCtxReset(device))
    _, module = start()
    words = fresh_words()
    bump(module, words)
    values = read(words)
    print("after reset words all 1" if (values == 1).all() else f"words wrong: {values[:8]}",
          flush=True)


if __name__ == "__main__":
    print(f"pid {os.getpid()}", flush=True)
    {"neighbour": neighbour, "faulter": faulter}[sys.argv[1]]()
