"""An unmodified cuda-python program that compiles with NVRTC for the device's own sm_XY and
loads the cubin it hands back (as CuPy and most JIT users do). Prints what it checked."""

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

SOURCE = b"""
template <typename T>
__global__ void scale(T *x, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}
"""


def ok(result):
    err, *rest = result
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


ok(cu.cuInit(0))
device = ok(cu.cuDeviceGet(0))
attribute = cu.CUdevice_attribute
major = ok(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
minor = ok(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))

program = ok(nvrtc.nvrtcCreateProgram(SOURCE, b"scale.cu", 0, [], []))
ok(nvrtc.nvrtcAddNameExpression(program, b"scale<double>"))
ok(nvrtc.nvrtcCompileProgram(program, 1, [f"-arch=sm_{major}{minor}".encode()]))
size = ok(nvrtc.nvrtcGetCUBINSize(program))
image = b"\0" * size
ok(nvrtc.nvrtcGetCUBIN(program, image))
name = ok(nvrtc.nvrtcGetLoweredName(program, b"scale<double>"))
ok(nvrtc.nvrtcDestroyProgram(program))

module = ok(cu.cuModuleLoadData(image))
function = ok(cu.cuModuleGetFunction(module, name))
x = np.linspace(-1.0, 2.0, 300)
address = ok(cu.cuMemAlloc(x.nbytes))
ok(cu.cuMemcpyHtoD(address, x, x.nbytes))
arguments = (np.array([int(address)], np.uint64), np.array([-2.5]), np.array([x.size], np.int32))
pointers = np.array([a.ctypes.data for a in arguments], np.uint64)
ok(cu.cuLaunchKernel(function, 3, 1, 1, 128, 1, 1, 0, 0, pointers.ctypes.data, 0))
y = np.empty_like(x)
ok(cu.cuMemcpyDtoH(y, address, y.nbytes))
assert np.array_equal(y, x * -2.5)
print(f"sm_{major}{minor} cubin of {size} bytes ran: results correct")
