/* vgpu._zmq_wire: the round trip's receives and sends in C, on the sockets pyzmq made.
 *
 * A synchronizing call's round trip is a few small messages, and pyzmq's Python layer
 * around each receive and send (frame objects, its `send` wrapper, option lookups) cost
 * more than libzmq itself: a Python echo server spent about 24 us of CPU per round trip,
 * most of it there. These functions take a pyzmq socket's libzmq handle
 * (`Socket.underlying`) and call libzmq directly, without the GIL while they wait. They
 * use the very libzmq that pyzmq loaded (found by vgpu/wire.py, symbols looked up here
 * with RTLD_NOLOAD), so they share its sockets; a message's later parts may still be read
 * through pyzmq (zero-copy payloads), since libzmq keeps no per-caller state.
 *
 * libzmq's API is declared here (zmq.h's stable ABI: a message is 64 opaque bytes) so that
 * building needs no header from pyzmq.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

typedef struct { _Alignas(8) unsigned char bytes[64]; } zmq_msg_t;

enum { ZMQ_DONTWAIT = 1, ZMQ_SNDMORE = 2, ZMQ_EVENTS = 15, ZMQ_POLLIN = 1, ZMQ_SRCFD = 2 };

static int (*msg_init)(zmq_msg_t *);
static int (*msg_recv)(zmq_msg_t *, void *, int);
static int (*msg_close)(zmq_msg_t *);
static void *(*msg_data)(zmq_msg_t *);
static size_t (*msg_size)(const zmq_msg_t *);
static int (*msg_more)(const zmq_msg_t *);
static int (*msg_get)(const zmq_msg_t *, int);
static const char *(*msg_gets)(const zmq_msg_t *, const char *);
static int (*zsend)(void *, const void *, size_t, int);
static int (*getsockopt_)(void *, int, void *, size_t *);

static PyObject *zmq_error;  /* zmq.ZMQError: what pyzmq raises, so callers catch one kind */

static PyObject *raise_errno(int err) {
    PyObject *exc = PyObject_CallFunction(zmq_error, "i", err);
    if (exc != NULL) {
        PyErr_SetObject(zmq_error, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* init(path): look libzmq's functions up in the already loaded library at `path`. */
static PyObject *wire_init(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        return PyErr_Format(PyExc_ImportError, "libzmq at %s is not loaded: %s", path,
                            dlerror());
#define FIND(var, name)                                                                   \
    if ((*(void **)&var = dlsym(lib, name)) == NULL)                                      \
        return PyErr_Format(PyExc_ImportError, "%s has no %s", path, name);
    FIND(msg_init, "zmq_msg_init");
    FIND(msg_recv, "zmq_msg_recv");
    FIND(msg_close, "zmq_msg_close");
    FIND(msg_data, "zmq_msg_data");
    FIND(msg_size, "zmq_msg_size");
    FIND(msg_more, "zmq_msg_more");
    FIND(msg_get, "zmq_msg_get");
    FIND(msg_gets, "zmq_msg_gets");
    FIND(zsend, "zmq_send");
    FIND(getsockopt_, "zmq_getsockopt");
#undef FIND
    Py_RETURN_NONE;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Whether a message waits on `sock` (asked without the GIL). */
static int readable(void *sock) {
    int events = 0;
    size_t size = sizeof events;
    return getsockopt_(sock, ZMQ_EVENTS, &events, &size) == 0 && (events & ZMQ_POLLIN);
}

/* The origin of a message part: (its ZAP User-Id or None, the descriptor it came through). */
static PyObject *origin_of(zmq_msg_t *msg) {
    const char *user_id = msg_gets(msg, "User-Id");
    int fd = msg_get(msg, ZMQ_SRCFD);
    if (user_id == NULL)
        return Py_BuildValue("(Oi)", Py_None, fd);
    return Py_BuildValue("(si)", user_id, fd);
}

static void release_all(PyObject **objects, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(objects[i]);
}

/* recv(sock, parts, spin_s, plain_prefix) -> None | (part, ..., more, origin)
 *
 * One message's first `parts` parts (fewer if it has fewer) as bytes, whether more parts
 * follow (read them with pyzmq), and the origin of its last part read (see origin_of),
 * asked only when that part does not start with `plain_prefix` (None: never asked). It
 * first spins up to `spin_s` seconds asking whether a message is there, then blocks as the
 * socket's RCVTIMEO says. None: nothing came in that time, or a signal interrupted the wait
 * (its Python handler has run).
 */
static PyObject *wire_recv(PyObject *self, PyObject *args) {
    unsigned long long handle;
    Py_ssize_t parts;
    double spin_s;
    PyObject *prefix_obj;
    if (!PyArg_ParseTuple(args, "KndO", &handle, &parts, &spin_s, &prefix_obj))
        return NULL;
    if (parts < 1 || parts > 8)
        return PyErr_Format(PyExc_ValueError, "parts must be 1 to 8, not %zd", parts);
    void *sock = (void *)(uintptr_t)handle;
    zmq_msg_t msg;
    msg_init(&msg);
    int rc, err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (spin_s > 0) {  /* (see vgpu.client's DEFAULT_SPIN_S for why spin) */
        /* Yielding between looks, as CUDA's CU_CTX_SCHED_YIELD does: where the cores are
         * busy, the threads that carry the reply (zmq's, the server's) run first; on an
         * idle machine it returns at once. */
        double until = now_s() + spin_s;
        while (!readable(sock) && now_s() < until)
            sched_yield();
    }
    rc = msg_recv(&msg, sock, 0);
    if (rc < 0)
        err = errno;
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        msg_close(&msg);
        if (err == EAGAIN)
            Py_RETURN_NONE;
        if (err == EINTR) {
            if (PyErr_CheckSignals() < 0)
                return NULL;
            Py_RETURN_NONE;
        }
        return raise_errno(err);
    }
    PyObject *got[8];
    Py_ssize_t count = 0;
    int more;
    for (;;) {
        got[count] = PyBytes_FromStringAndSize(msg_data(&msg), msg_size(&msg));
        if (got[count] == NULL)
            goto fail;
        count++;
        more = msg_more(&msg);
        if (!more || count == parts)
            break;
        /* The rest of a message is there once its first part is: no wait, no GIL dance. */
        if (msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            raise_errno(errno);
            goto fail;
        }
    }
    PyObject *origin = Py_None;
    Py_INCREF(origin);
    if (prefix_obj != Py_None) {
        Py_buffer prefix;
        if (PyObject_GetBuffer(prefix_obj, &prefix, PyBUF_SIMPLE) < 0) {
            Py_DECREF(origin);
            goto fail;
        }
        size_t size = msg_size(&msg);
        if (size < (size_t)prefix.len || memcmp(msg_data(&msg), prefix.buf, prefix.len)) {
            Py_DECREF(origin);
            origin = origin_of(&msg);
        }
        PyBuffer_Release(&prefix);
        if (origin == NULL)
            goto fail;
    }
    msg_close(&msg);
    PyObject *result = PyTuple_New(count + 2);
    if (result == NULL) {
        Py_DECREF(origin);
        release_all(got, count);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        PyTuple_SET_ITEM(result, i, got[i]);
    PyTuple_SET_ITEM(result, count, PyBool_FromLong(more));
    PyTuple_SET_ITEM(result, count + 1, origin);
    return result;
fail:
    msg_close(&msg);
    release_all(got, count);
    return NULL;
}

/* send(sock, part, ...) -> bool: the parts as one message, each copied (small parts: a copy
 * costs less than handing libzmq a buffer to free later), if the socket takes it now.
 *
 * Never waits: False when the socket would block, and then nothing of the message goes
 * out. A socket that would block may never take anything again (libzmq gives a connection
 * whose handshake failed as a protocol error up for good, with the socket's only pipe), so
 * the caller waits, if at all, with a bound and an eye on the connection (vgpu.transport's
 * send_within). A later part is refused only when the pipe went away under the message,
 * which libzmq then drops whole: the rest of it is handed over for libzmq to drop too, so
 * that no part of it begins the next message.
 */
static PyObject *wire_send(PyObject *self, PyObject *args) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n < 2)
        return PyErr_Format(PyExc_TypeError, "send(sock, part, ...) takes a part at least");
    unsigned long long handle = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args, 0));
    if (handle == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    void *sock = (void *)(uintptr_t)handle;
    int taken = 1;
    for (Py_ssize_t i = 1; i < n; i++) {
        Py_buffer part;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, i), &part, PyBUF_SIMPLE) < 0)
            return NULL;
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        int rc, err = 0;
        while ((rc = zsend(sock, part.buf, part.len, flags)) < 0 && (err = errno) == EINTR) {
            if (PyErr_CheckSignals() < 0) {
                PyBuffer_Release(&part);
                return NULL;
            }
        }
        PyBuffer_Release(&part);
        if (rc >= 0)
            continue;
        if (err != EAGAIN)
            return raise_errno(err);
        if (i == 1)
            Py_RETURN_FALSE;  /* nothing went out */
        taken = 0;
    }
    return PyBool_FromLong(taken);
}

static PyMethodDef methods[] = {
    {"init", wire_init, METH_VARARGS, "Find libzmq's functions in the library at a path."},
    {"recv", wire_recv, METH_VARARGS, "A message's first parts (see zmq_wire.c)."},
    {"send", wire_send, METH_VARARGS, "Send parts as one message if taken now (see zmq_wire.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_zmq_wire", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__zmq_wire(void) {
    PyObject *zmq = PyImport_ImportModule("zmq");
    if (zmq == NULL)
        return NULL;
    zmq_error = PyObject_GetAttrString(zmq, "ZMQError");
    Py_DECREF(zmq);
    if (zmq_error == NULL)
        return NULL;
    return PyModule_Create(&module);
}
