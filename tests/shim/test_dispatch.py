"""What a C program sees from the shim's Python dispatch: unimplemented calls, tracing."""

from __future__ import annotations

CALLS_UNIMPLEMENTED_TWICE = r"""
#include <stdio.h>
#include <cudaGL.h>

int main(void)
{
    int first = cuGraphicsGLRegisterBuffer(NULL, 1, 0);
    int second = cuGraphicsGLRegisterBuffer(NULL, 1, 0);
    printf("%d %d\n", first, second);
    return 0;
}
"""

TRACED = r"""
#include <stdio.h>
#include <cudaGL.h>

int main(void)
{
    int version = 0;
    unsigned int count = 0;
    CUdevice devices[1];
    int rc = cuDriverGetVersion(&version);
    printf("%d %d %p\n", rc, version, (void *)&version);
    rc = cuGLGetDevices(&count, devices, 1, CU_GL_DEVICE_LIST_ALL);
    printf("%d\n", rc);
    return 0;
}
"""


def test_unimplemented_function_fails_and_is_named_once(shim_program, run_program):
    result = run_program(shim_program(CALLS_UNIMPLEMENTED_TWICE))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["801", "801"]  # CUDA_ERROR_NOT_SUPPORTED
    line = "vgpu: cuGraphicsGLRegisterBuffer is not implemented (CUDA_ERROR_NOT_SUPPORTED)"
    assert result.stderr.splitlines().count(line) == 1, result.stderr


def test_trace_shows_decoded_calls(shim_program, run_program):
    result = run_program(shim_program(TRACED), env={"VGPU_TRACE": "1"})
    assert result.returncode == 0, result.stderr
    rc, version, address = result.stdout.split()[:3]
    assert (rc, version) == ("0", "13000")
    trace = [line for line in result.stderr.splitlines() if line.startswith("vgpu trace: ")]
    assert trace[0] == (f"vgpu trace: cuDriverGetVersion(driverVersion={int(address, 16):#x})"
                        " -> CUDA_SUCCESS")
    assert trace[1].startswith("vgpu trace: cuGLGetDevices_v2(pCudaDeviceCount=0x")
    assert trace[1].endswith(", cudaDeviceCount=1, deviceList=CU_GL_DEVICE_LIST_ALL)"
                             " -> CUDA_ERROR_NOT_SUPPORTED")


def test_no_trace_unless_asked(shim_program, run_program):
    result = run_program(shim_program(TRACED))
    assert result.returncode == 0, result.stderr
    assert "vgpu trace:" not in result.stderr
