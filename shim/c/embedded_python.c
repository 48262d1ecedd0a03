/* See embedded_python.h. Each shim compiles its own copy (its own once-flag and state).
   Build-time facts arrive as macros from the cffi builder:
   VGPU_PYTHON_EXECUTABLE, the interpreter vgpu was installed with (its environment holds
   the `vgpu` package and its dependencies). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "embedded_python.h"

#ifndef VGPU_PYTHON_EXECUTABLE
#error "VGPU_PYTHON_EXECUTABLE must name the interpreter recorded at build time"
#endif

static const struct vgpu_embedding *embedding;
static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static int ready;

static void report_failure(const char *why)
{
    fprintf(stderr, "vgpu: cannot start the shim's Python runtime (%s): every %s call will fail\n",
            why, embedding->api);
    fflush(stderr);
}

/* The interpreter this process already runs, or the one we linked, must be the
   major.minor we were compiled for: a 3.11 shim calling into a 3.12 runtime through
   the 3.11 ABI hangs or crashes. dlsym(RTLD_DEFAULT) finds the same Py_GetVersion that
   our own calls would bind to, so it is asked before any other Python API is used. */
static int python_version_matches(char *why, size_t size)
{
    const char *(*get_version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
    char expected[16];
    size_t length;
    const char *found;

    if (get_version == NULL)
        get_version = Py_GetVersion;
    found = get_version();
    length = (size_t)snprintf(expected, sizeof expected, "%d.%d", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    if (strncmp(found, expected, length) == 0 && (found[length] == '.' || found[length] == ' '
                                                  || found[length] == '\0'))
        return 1;
    snprintf(why, size, "the shim was built for Python %s but this process runs Python %.*s; "
             "rebuild vgpu with this Python", expected, (int)strcspn(found, " "), found);
    return 0;
}

/* While Python initializes, it may print a multi-line path dump before failing; stderr is
   captured into a temporary file so that on failure only our one line is shown, and on
   success whatever was written (by Python or another thread) is passed on unchanged. */
struct captured_stderr {
    int saved_fd;
    FILE *file;
};

static struct captured_stderr capture_stderr(void)
{
    struct captured_stderr capture = {-1, tmpfile()};
    fflush(stderr);
    if (capture.file != NULL) {
        capture.saved_fd = dup(STDERR_FILENO);
        if (capture.saved_fd < 0 || dup2(fileno(capture.file), STDERR_FILENO) < 0) {
            if (capture.saved_fd >= 0)
                close(capture.saved_fd);
            fclose(capture.file);
            capture.file = NULL;
            capture.saved_fd = -1;
        }
    }
    return capture;
}

static void release_stderr(struct captured_stderr capture, int pass_on)
{
    char buffer[4096];
    size_t count;

    if (capture.file == NULL)
        return;
    fflush(stderr);
    dup2(capture.saved_fd, STDERR_FILENO);
    close(capture.saved_fd);
    if (pass_on) {
        rewind(capture.file);
        while ((count = fread(buffer, 1, sizeof buffer, capture.file)) > 0)
            if (write(STDERR_FILENO, buffer, count) < 0)
                break;
    }
    fclose(capture.file);
}

/* A program that dlopen()s us without RTLD_GLOBAL (the default) loads libpython, our
   dependency, as a local library: the extension modules Python loads next (cffi's backend
   first) could not resolve its symbols. Reopened by its own path with RTLD_GLOBAL, it is
   visible to them, as in a python executable. */
static void make_libpython_global(void)
{
    Dl_info info;

    if (dladdr((void *)Py_InitializeFromConfig, &info) != 0 && info.dli_fname != NULL)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
}

/* A C program: start the interpreter ourselves, pinned to the recorded executable so that
   its prefix (and the environment's site-packages) are found whatever PATH says. Python's
   own environment variables (PYTHONHOME, PYTHONPATH) are honoured, as for any Python. */
static int initialize_interpreter(char *why, size_t size)
{
    PyConfig config;
    PyStatus status;
    struct captured_stderr capture;

    make_libpython_global();
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the application owns SIGINT and friends */
    config.parse_argv = 0;
    status = PyConfig_SetBytesString(&config, &config.program_name, VGPU_PYTHON_EXECUTABLE);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesString(&config, &config.executable, VGPU_PYTHON_EXECUTABLE);
    if (!PyStatus_Exception(status)) {
        capture = capture_stderr();
        status = Py_InitializeFromConfig(&config);
        release_stderr(capture, !PyStatus_Exception(status));
    }
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        if (PyStatus_IsExit(status))
            snprintf(why, size, "Python exited with status %d while starting", status.exitcode);
        else
            snprintf(why, size, "%s%s%s; interpreter %s%s%s", status.func ? status.func : "",
                     status.func ? ": " : "", status.err_msg ? status.err_msg : "unknown error",
                     VGPU_PYTHON_EXECUTABLE, getenv("PYTHONHOME") ? ", PYTHONHOME=" : "",
                     getenv("PYTHONHOME") ? getenv("PYTHONHOME") : "");
        return 0;
    }
    PyEval_SaveThread(); /* release the GIL: cffi takes it per call, from any thread */
    return 1;
}

static void start(void)
{
    char why[1024] = "";

    if (embedding->prepare != NULL && !embedding->prepare(why, sizeof why)) {
        if (why[0] == '\0')
            return; /* already reported */
        goto failed;
    }
    if (!python_version_matches(why, sizeof why))
        goto failed;
    if (!Py_IsInitialized() && !initialize_interpreter(why, sizeof why))
        goto failed;
    if (embedding->start_cffi() != 0) {
        snprintf(why, sizeof why, "the shim's cffi module failed to initialize; see above");
        goto failed;
    }
    if (embedding->boot(why, sizeof why) != 1) {
        if (why[0] == '\0')
            snprintf(why, sizeof why, "the boot function failed; see above");
        goto failed;
    }
    ready = 1;
    return;
failed:
    report_failure(why);
}

/* Python is going away: C++ thread-local destructors and atexit handlers of libraries
   (cuda.core releasing its contexts, say) may still call CUDA after Py_Finalize, when
   calling into Python would crash. */
static int python_is_gone(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsInitialized() || Py_IsFinalizing();
#else
    return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

int vgpu_embedded_python_running(void)
{
    return ready && !python_is_gone();
}

int vgpu_embedded_python_gone(void)
{
    return ready && python_is_gone();
}

int vgpu_embedded_python_ready(const struct vgpu_embedding *shim_embedding)
{
    embedding = shim_embedding;
    pthread_once(&start_once, start);
    return ready && !python_is_gone();
}

/* Read without the GIL: a thread state's pending exception is only set by its own thread. */
static int exception_pending(PyThreadState *thread)
{
#if PY_VERSION_HEX >= 0x030C0000
    return thread->current_exception != NULL;
#else
    return thread->curexc_type != NULL;
#endif
}

struct vgpu_pending_exception vgpu_set_aside_exception(void)
{
    struct vgpu_pending_exception pending = {NULL, NULL, NULL};
    PyThreadState *thread;
    PyGILState_STATE gil;

    if (python_is_gone()) /* not started yet, or finalized: no thread state to read */
        return pending;
    thread = PyGILState_GetThisThreadState();
    if (thread == NULL || !exception_pending(thread))
        return pending;
    gil = PyGILState_Ensure();
    PyErr_Fetch((PyObject **)&pending.type, (PyObject **)&pending.value,
                (PyObject **)&pending.traceback);
    PyGILState_Release(gil);
    return pending;
}

void vgpu_restore_exception(struct vgpu_pending_exception pending)
{
    PyGILState_STATE gil;

    if (pending.type == NULL)
        return;
    gil = PyGILState_Ensure();
    PyErr_Restore((PyObject *)pending.type, (PyObject *)pending.value,
                  (PyObject *)pending.traceback);
    PyGILState_Release(gil);
}

uintptr_t vgpu_interrupted_thread;

void vgpu_note_interruption(void)
{
    __atomic_store_n(&vgpu_interrupted_thread, (uintptr_t)pthread_self(), __ATOMIC_RELEASE);
}

/* A pending call: the main thread runs it between two of its instructions, holding the GIL.
   Raises there the exception that interrupted a callback (vgpu.shim.dispatch kept it). */
static int raise_interruption(void *unused)
{
    PyObject *dispatch, *exception;

    (void)unused;
    dispatch = PyImport_ImportModule("vgpu.shim.dispatch");
    exception = dispatch != NULL ? PyObject_CallMethod(dispatch, "take_interruption", NULL)
                                 : NULL;
    Py_XDECREF(dispatch);
    if (exception == NULL)
        return -1;
    if (exception == Py_None) { /* the pending call of an earlier interruption raised it */
        Py_DECREF(exception);
        return 0;
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exception), exception);
    Py_DECREF(exception);
    return -1;
}

/* By the stub of the interrupted callback itself, once it has returned: a pending call added
   earlier (by another thread's stub) could run in the main thread while it is still in the
   callback, and be lost there. The main thread is the one interrupted, since only it runs
   Python's signal handlers. */
void vgpu_interrupt_again(void)
{
    uintptr_t self = (uintptr_t)pthread_self();

    if (__atomic_compare_exchange_n(&vgpu_interrupted_thread, &self, 0, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)
        && Py_AddPendingCall(raise_interruption, NULL) != 0)
        vgpu_note_interruption(); /* Python's queue of pending calls is full: the next call
                                     tries again */
}
