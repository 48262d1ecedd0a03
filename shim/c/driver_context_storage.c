/* Context-local storage, as NVIDIA's runtime keeps its per-context state in the driver
   (export table c693336e-...): a value per (context, key), and a destructor the driver runs
   when the context goes. vgpu's contexts live in Python (shim/driver/context.py), which calls
   vgpu_context_storage_release() as it destroys or resets one: the runtime then forgets what
   it loaded there, and a reset primary context (which keeps its handle) starts afresh for it
   too. Entries are few (one per runtime per context): a list searched in order. */
#include <pthread.h>
#include <stdlib.h>

#include "driver_export_tables.h"

struct entry {
    CUcontext ctx;
    void *key;
    void *value;
    vgpu_storage_destructor destructor;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *entries;
static size_t count, capacity;

/* NULL names the calling thread's current context. */
static CUresult resolve(CUcontext *ctx)
{
    CUresult rc;

    if (*ctx != NULL)
        return CUDA_SUCCESS;
    if ((rc = cuCtxGetCurrent(ctx)) != CUDA_SUCCESS)
        return rc;
    return *ctx != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static struct entry *find(CUcontext ctx, void *key)
{
    size_t i;

    for (i = 0; i < count; i++)
        if (entries[i].ctx == ctx && entries[i].key == key)
            return &entries[i];
    return NULL;
}

/* The entry for (ctx, key) or NULL, with the lock taken, once ctx is resolved; on an error the
   lock is not taken. */
static CUresult lock_entry(CUcontext *ctx, void *key, struct entry **e)
{
    CUresult rc = resolve(ctx);

    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&lock);
    *e = find(*ctx, key);
    return CUDA_SUCCESS;
}

CUresult vgpu_context_storage_put(CUcontext ctx, void *key, void *value,
                                  vgpu_storage_destructor destructor)
{
    struct entry *e;
    CUresult rc = lock_entry(&ctx, key, &e);

    if (rc != CUDA_SUCCESS)
        return rc;
    if (e == NULL && count == capacity) {
        size_t grown = capacity ? 2 * capacity : 8;
        struct entry *bigger = realloc(entries, grown * sizeof *entries);
        if (bigger == NULL) {
            pthread_mutex_unlock(&lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        entries = bigger;
        capacity = grown;
    }
    if (e == NULL)
        e = &entries[count++];
    *e = (struct entry){ctx, key, value, destructor};
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult vgpu_context_storage_delete(CUcontext ctx, void *key)
{
    struct entry *e;
    CUresult rc = lock_entry(&ctx, key, &e);

    if (rc != CUDA_SUCCESS)
        return rc;
    if (e != NULL)
        *e = entries[--count];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult vgpu_context_storage_get(void **value, CUcontext ctx, void *key)
{
    struct entry *e;
    CUresult rc;

    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = lock_entry(&ctx, key, &e)) != CUDA_SUCCESS)
        return rc;
    if (e != NULL)
        *value = e->value;
    pthread_mutex_unlock(&lock);
    return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* For Python (declared in the driver's cffi cdef): `ctx` is going; each of its entries is
   removed, then its destructor runs, outside the lock (it may call the driver again). */
void vgpu_context_storage_release(void *ctx)
{
    struct entry gone;

    for (;;) {
        size_t i;
        int found = 0;

        pthread_mutex_lock(&lock);
        for (i = 0; i < count && !found; i++)
            if (entries[i].ctx == (CUcontext)ctx) {
                gone = entries[i];
                entries[i] = entries[--count];
                found = 1;
            }
        pthread_mutex_unlock(&lock);
        if (!found)
            return;
        if (gone.destructor != NULL)
            gone.destructor(gone.ctx, gone.key, gone.value);
    }
}
