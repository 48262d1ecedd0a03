/* Starting the Python runtime a shim embeds, once per process, and owning its failure.

   A shim library (libcuda.so.1, libcudart.so.13) is loaded into arbitrary processes: C
   programs with no Python at all, and Python programs whose interpreter may not be the one
   the shim was built against. This code decides which case it is in before touching any
   Python API, and turns every way of failing into one line on stderr and an error code,
   never a crash, a hang or a false success. */
#ifndef VGPU_EMBEDDED_PYTHON_H
#define VGPU_EMBEDDED_PYTHON_H

#include <stddef.h>
#include <stdint.h>

/* What a shim gives the starter; the functions come from its cffi module. */
struct vgpu_embedding {
    const char *api;                          /* "CUDA": named in the failure line */
    int (*prepare)(char *why, size_t size);   /* optional first step: 1 on success; on
                                                 failure an empty `why` means reported */
    int (*start_cffi)(void);                  /* cffi_start_python(): 0 on success */
    int (*boot)(char *error, size_t size);    /* the Python boot: 1 on success */
};

/* 1 once the runtime is up and booted, 0 if it cannot start (reported once on stderr).
   Thread-safe; the first caller does the work, the others wait for it. */
int vgpu_embedded_python_ready(const struct vgpu_embedding *embedding);

/* 1 if the runtime was started and Python is still usable (not finalized); starts nothing. */
int vgpu_embedded_python_running(void);

/* 1 if the runtime was started and Python has since gone (finalizing or finalized): the
   program is exiting, and objects it frees then (modules, memory) call CUDA one last time. */
int vgpu_embedded_python_gone(void);

/* A Python exception pending on the calling thread when C code calls a shim (Cython cleaning
   up after an error, as cuda.core's linker does): cffi's callback would see it, fail, and
   clear it, and the caller would then return NULL without an exception. Every stub sets it
   aside before its callback (and the runtime's start) and restores it after. Checking costs
   a thread-local read; only a pending exception takes the GIL. */
struct vgpu_pending_exception {
    void *type, *value, *traceback; /* PyObject *; all NULL when none was pending */
};

struct vgpu_pending_exception vgpu_set_aside_exception(void);
void vgpu_restore_exception(struct vgpu_pending_exception pending);

/* Ctrl-C of a Python program waiting in a CUDA call: Python's SIGINT handler runs between
   two instructions of the call's callback, and the KeyboardInterrupt it raises (or the
   SystemExit of a SIGTERM handler) would end in cffi, which reports it and returns the
   callback's error value: the program would never see it. The callback's error handler
   keeps such an exception and notes it (vgpu_note_interruption, from Python); the stub, once
   the callback has returned, has the program's main thread raise it at its next instruction
   (a pending call), as it would have without vgpu. The call itself returns its error value:
   it did not finish. Checking costs one read of a flag per call. */
extern uintptr_t vgpu_interrupted_thread; /* the thread whose callback was interrupted, or 0 */

void vgpu_note_interruption(void);
void vgpu_interrupt_again(void);

static inline void vgpu_pass_on_interruption(void)
{
    if (__atomic_load_n(&vgpu_interrupted_thread, __ATOMIC_RELAXED))
        vgpu_interrupt_again();
}

/* What every stub does once its callback has returned: puts back the exception it set aside
   and passes on an interruption. Inline: in the common case, two loads and no call. */
static inline void vgpu_end_call(struct vgpu_pending_exception pending)
{
    if (pending.type != NULL)
        vgpu_restore_exception(pending);
    vgpu_pass_on_interruption();
}

#endif
