"""A CUDA call made from C while the caller has a Python exception pending (Cython code
cleaning up after an error, as cuda.core's linker does) works, and leaves the exception as
it was for the caller to raise."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

# Each call runs with a KeyError pending, half of them holding the GIL (a Cython function),
# half with it released (Cython's `with nogil:`); prints "<call> <rc> <still pending>".
PROGRAM = r"""
#include <Python.h>
#include <stdio.h>
#include <cuda.h>

static int release_gil;

#define WITH_PENDING(call) do {                                                     \
        PyGILState_STATE gil_ = PyGILState_Ensure();                                \
        PyThreadState *saved_ = NULL;                                               \
        CUresult rc_;                                                               \
        PyErr_SetString(PyExc_KeyError, "pending from the caller");                 \
        if (release_gil) saved_ = PyEval_SaveThread();                              \
        rc_ = (call);                                                               \
        if (release_gil) PyEval_RestoreThread(saved_);                              \
        printf("%s %d %d\n", #call, (int)rc_, PyErr_ExceptionMatches(PyExc_KeyError)); \
        PyErr_Clear();                                                              \
        PyGILState_Release(gil_);                                                   \
        release_gil = !release_gil;                                                 \
    } while (0)

int main(void)
{
    int version;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    char name[64];

    cuDriverGetVersion(&version); /* starts the shim's Python, which the macro uses */
    WITH_PENDING(cuInit(0));
    WITH_PENDING(cuDeviceGet(&dev, 0));
    WITH_PENDING(cuDeviceGetName(name, sizeof name, dev));
    WITH_PENDING(cuDevicePrimaryCtxRetain(&ctx, dev));
    WITH_PENDING(cuCtxSetCurrent(ctx));
    WITH_PENDING(cuMemAlloc(&d, 1024));
    WITH_PENDING(cuMemsetD8(d, 1, 1024));
    WITH_PENDING(cuCtxSynchronize());
    WITH_PENDING(cuMemFree(d));
    WITH_PENDING(cuCtxSynchronize());
    return 0;
}
"""


# A program that runs Python itself (as a Python application does) makes its first CUDA
# call, which starts the shim's runtime, with an exception pending.
FIRST_CALL = r"""
#include <Python.h>
#include <stdio.h>
#include <cuda.h>

int main(void)
{
    PyThreadState *saved;
    CUdevice dev;
    CUresult rc;

    Py_Initialize();
    PyErr_SetString(PyExc_KeyError, "pending from the caller");
    saved = PyEval_SaveThread();
    rc = cuInit(0);
    PyEval_RestoreThread(saved);
    printf("first %d %d\n", (int)rc, PyErr_ExceptionMatches(PyExc_KeyError));
    PyErr_Clear();
    saved = PyEval_SaveThread();
    rc = cuDeviceGet(&dev, 0);
    PyEval_RestoreThread(saved);
    printf("second %d\n", (int)rc);
    return 0;
}
"""


def _run(toolkit, source: str) -> subprocess.CompletedProcess:
    paths = sysconfig.get_config_vars()
    python = [f"-I{sysconfig.get_paths()['include']}", f"-L{paths['LIBDIR']}",
              f"-lpython{paths['LDVERSION']}", f"-Wl,-rpath,{paths['LIBDIR']}", "-ldl",
              "-pthread"]
    program = toolkit.c_program(source, flags=python)
    env = {k: v for k, v in os.environ.items() if k not in ("VGPU_SERVER", "VGPU_TRACE")}
    return subprocess.run([sys.executable, "-m", "vgpu.cli", "run", "--backend", "emu", "--",
                           str(program)], capture_output=True, text=True, timeout=120, env=env)


def test_the_first_call_starts_the_runtime_with_an_exception_pending(toolkit):
    result = _run(toolkit, FIRST_CALL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["first 0 1", "second 0"], result.stderr


def test_calls_with_a_pending_python_exception_work_and_keep_it(toolkit):
    result = _run(toolkit, PROGRAM)
    assert result.returncode == 0, result.stderr
    answers = [line.rsplit(" ", 2) for line in result.stdout.splitlines()]
    assert len(answers) == 10, result.stdout + result.stderr
    assert [(call, rc, pending) for call, rc, pending in answers if (rc, pending) != ("0", "1")] \
        == [], result.stderr
    assert result.stderr == ""
