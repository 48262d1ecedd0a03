"""Two host threads copy from the device at once, each on a stream of its own, as
cuda-python's programs do: thread A's copy must wait for the kernel before it on its stream
A, whatever thread B issues meanwhile on stream B.

The server runs each stream beside the others, and a copy waits for the work of the stream
it was issued on. The threads' calls share one connection, so thread B is let in at the worst
moment: once thread A is inside its copy on stream A, B's copy on stream B starts, and A's
copy goes on only then (B's waits until A's is done). Prints the value A's copy read: the
kernel's, 42, unless the copy read the memory before the kernel wrote it.

Usage: python copies_from_threads.py SPIN (the kernel's loop count: long enough that a copy
that does not wait for it comes first)
"""

import ctypes
import sys
import threading

from cuda.bindings import driver as cu

PTX = b"""
.version 9.0
.target sm_75
.address_size 64
.visible .entry late_store(.param .u32 count, .param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u32 %r1, [count];
    ld.param.u64 %rd1, [out];
    mov.u32 %r2, 0;
$L_loop:
    add.s32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra $L_loop;
    mov.u32 %r3, 42;
    st.global.u32 [%rd1], %r3;
    ret;
}
\0"""
WAIT_S = 60


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"CUDA error {err}")
    return values[0] if len(values) == 1 else values


def main() -> None:
    spin = int(sys.argv[1])
    check(cu.cuInit(0))
    context = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))
    check(cu.cuCtxSetCurrent(context))
    kernel = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(PTX)), b"late_store"))
    out, other = check(cu.cuMemAlloc(4)), check(cu.cuMemAlloc(4))
    check(cu.cuMemsetD32(out, 0, 1))
    check(cu.cuMemsetD32(other, 7, 1))
    streams = {name: check(cu.cuStreamCreate(0)) for name in "AB"}
    read = {name: ctypes.c_uint32(0) for name in "AB"}

    # Where the copies wait: the client's read of device memory into pageable memory.
    from vgpu.client import Connection
    read_device = Connection.read_device
    a_copying, b_copying, a_copied = (threading.Event() for _ in range(3))

    def paced_read_device(self, *args):
        if threading.current_thread().name == "A":
            a_copying.set()
            b_copying.wait(WAIT_S)
            try:
                return read_device(self, *args)
            finally:
                a_copied.set()
        b_copying.set()
        a_copied.wait(WAIT_S)
        return read_device(self, *args)

    Connection.read_device = paced_read_device

    def copy(name: str, source) -> None:
        check(cu.cuCtxSetCurrent(context))
        if name == "A":
            params = (ctypes.c_uint32(spin), ctypes.c_uint64(int(out)))
            pointers = (ctypes.c_void_p * 2)(*(ctypes.addressof(p) for p in params))
            check(cu.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, streams[name],
                                    ctypes.addressof(pointers), 0))
        check(cu.cuMemcpyDtoHAsync(ctypes.addressof(read[name]), source, 4, streams[name]))
        check(cu.cuStreamSynchronize(streams[name]))

    a = threading.Thread(target=copy, args=("A", out), name="A")
    b = threading.Thread(target=copy, args=("B", other), name="B")
    a.start()
    a_copying.wait(WAIT_S)
    b.start()
    a.join()
    b.join()
    print(f"A read {read['A'].value}, B read {read['B'].value}")


main()
