"""The shim's embedded Python runtime: a clean failure when it cannot start, and no
dependence on which python is on PATH."""

from __future__ import annotations

import os
import subprocess
import sys

CALLS = r"""
#include <stdio.h>
#include <cudaGL.h>

int main(void)
{
    int version = -1, rc;
    const char *name = NULL;
    printf("%d\n", cuGraphicsGLRegisterBuffer(NULL, 1, 0));
    rc = cuDriverGetVersion(&version);
    printf("%d %d\n", rc, version);
    cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name);  /* works without Python */
    printf("%s\n", name);
    return 0;
}
"""

FAILURE_LINE = "vgpu: cannot start the shim's Python runtime ("
FAILURE_END = "): every CUDA call will fail"


def assert_clean_failure(result: subprocess.CompletedProcess, cause: str) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3", "-1", "CUDA_ERROR_NOT_INITIALIZED"]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # one line, not Python's path dump or a traceback
    assert lines[0].startswith(FAILURE_LINE) and lines[0].endswith(FAILURE_END), lines[0]
    assert cause in lines[0]


def test_python_that_cannot_start(shim_program, run_program):
    result = run_program(shim_program(CALLS), env={"PYTHONHOME": "/nonexistent"})
    assert_clean_failure(result, "PYTHONHOME=/nonexistent")


def test_vgpu_that_cannot_be_imported(shim_program, run_program, tmp_path):
    broken = tmp_path / "vgpu"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('this vgpu is broken on purpose')\n")
    result = run_program(shim_program(CALLS), env={"PYTHONPATH": str(tmp_path)})
    assert_clean_failure(result, "ImportError: this vgpu is broken on purpose")


def test_starts_whatever_python_is_on_path(shim_program, run_program):
    # Only system directories on PATH: the embedded runtime must still be the environment
    # vgpu was installed in, not whatever `python3` PATH would give.
    result = run_program(shim_program(CALLS), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["801", "0", "13000"], result.stderr


FOREIGN_PYTHON_HOST = r"""
#include <dlfcn.h>
#include <stdio.h>

/* This program stands for an application that embeds a Python of another minor version:
   it exports that interpreter's Py_GetVersion, as a python3.X executable does. */
const char *Py_GetVersion(void) { return "3.99.0 (an application's own Python)"; }
int Py_IsInitialized(void) { return 1; }

int main(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    int (*cu_init)(unsigned) = cuda ? (int (*)(unsigned))dlsym(cuda, "cuInit") : NULL;
    int (*cu_version)(int *) = cuda ? (int (*)(int *))dlsym(cuda, "cuDriverGetVersion") : NULL;
    int version = -1;
    if (!cu_init || !cu_version) { printf("%s\n", dlerror()); return 1; }
    int first = cu_init(0);
    printf("%d %d\n", first, cu_version(&version));
    return 0;
}
"""


def test_process_running_another_python_gets_a_clear_error(toolkit, run_program):
    """A process whose Python is not the shim's gets error 3 and one line, never a hang:
    loading a 3.11-built shim into Python 3.12 hung before this check existed."""
    host = toolkit.c_program(FOREIGN_PYTHON_HOST, flags=["-rdynamic", "-ldl"])
    result = run_program(host)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3"]
    line, = result.stderr.splitlines()
    assert line.startswith(FAILURE_LINE) and line.endswith(FAILURE_END)
    built = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"the shim was built for Python {built} but this process runs Python 3.99" in line


def test_cuda_python_application(shim_dir):
    """cuda-python in this interpreter: it resolves every function through cuGetProcAddress,
    and the shim's runtime starts inside the application's own Python."""
    script = ("from cuda.bindings import driver\n"
              "err, version = driver.cuDriverGetVersion()\n"
              "print(int(err), version, int(driver.cuGraphicsUnregisterResource(0)[0]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VGPU_"))}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env={**env, "LD_LIBRARY_PATH": str(shim_dir)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "13000", "801"]
    assert ("vgpu: cuGraphicsUnregisterResource is not implemented "
            "(CUDA_ERROR_NOT_SUPPORTED)") in result.stderr


THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <cuda.h>

static void *first_call(void *result)
{
    int version = 0;
    *(int *)result = cuDriverGetVersion(&version) == CUDA_SUCCESS && version == 13000;
    return NULL;
}

int main(void)
{
    pthread_t threads[8];
    int ok[8], all = 1;
    for (int i = 0; i < 8; i++)
        pthread_create(&threads[i], NULL, first_call, &ok[i]);
    for (int i = 0; i < 8; i++) {
        pthread_join(threads[i], NULL);
        all &= ok[i];
    }
    printf("%d\n", all);
    return 0;
}
"""


def test_first_calls_from_many_threads_at_once(shim_program, run_program):
    result = run_program(shim_program(THREADS))  # the runtime starts once, nobody waits forever
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1"]


DLOPENED = r"""
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW);  /* local, as most loaders do */
    int (*get_version)(int *) = (int (*)(int *))dlsym(libcuda, "cuDriverGetVersion");
    int version = 0;
    int rc = get_version(&version);
    printf("%d %d\n", rc, version);
    return 0;
}
"""


def test_program_that_dlopens_the_driver(toolkit, run_program):
    # libpython arrives as a local dependency of ours; Python's extension modules need it
    # global. (--as-needed: the program must not also be linked to libcuda.)
    result = run_program(toolkit.c_program(DLOPENED, flags=["-ldl", "-Wl,--as-needed"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "13000"], result.stderr
