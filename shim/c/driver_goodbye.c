/* A C program's goodbye to the server. A Python program's connection closes when the
   interpreter tears its modules down (vgpu/client.py); a C program never tears the embedded
   Python down, so the driver shim closes it from a library destructor. The C library runs
   those after every exit hook the program registered, so CUDA works until the process ends.
   After a Python program's finalization Python is gone and there is nothing left to do. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "embedded_python.h"

__attribute__((destructor)) static void say_goodbye(void)
{
    PyGILState_STATE gil;
    PyObject *state, *result;

    if (!vgpu_embedded_python_running())
        return;
    gil = PyGILState_Ensure();
    state = PyImport_ImportModule("vgpu.shim.driver._state");
    result = state != NULL ? PyObject_CallMethod(state, "close_connection", NULL) : NULL;
    Py_XDECREF(result);
    Py_XDECREF(state);
    PyErr_Clear(); /* exiting: a failed goodbye is the server's to notice (the pid is gone) */
    PyGILState_Release(gil);
}
