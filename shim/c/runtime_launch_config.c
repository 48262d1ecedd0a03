/* What nvcc 13 makes of `kernel<<<grid, block, shared, stream>>>(args...)`: a push of the
   configuration before the host stub runs, a pop inside it, then __cudaLaunchKernel (Python,
   shim/runtime/launch.py). Push and pop are bookkeeping of the calling thread only, so they
   live here: as Python callbacks they cost two crossings into Python per launch, more than
   the runtime layer's whole budget of 2 us (BENCHMARKS.md, "Runtime layer").

   They need no Python runtime, so they work before it starts, and whatever happens to it.
   nvcc pairs them within one expression, so the stack is one deep in practice; an unpaired
   pop (or a push beyond the stack) only comes from code calling these internals by hand:
   it gets cudaErrorMissingConfiguration, and a push beyond the stack skips its launch. */
#include "runtime_shim.h"

#define MAX_PENDING_CONFIGURATIONS 64

struct launch_configuration {
    dim3 grid;
    dim3 block;
    size_t shared_bytes;
    struct CUstream_st *stream;
};

static __thread struct launch_configuration pending[MAX_PENDING_CONFIGURATIONS];
static __thread unsigned pending_count;

unsigned int __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                         struct CUstream_st *stream)
{
    if (pending_count == MAX_PENDING_CONFIGURATIONS)
        return cudaErrorMissingConfiguration; /* non-zero: nvcc's stub skips the launch */
    pending[pending_count++] = (struct launch_configuration){gridDim, blockDim, sharedMem,
                                                            stream};
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream)
{
    const struct launch_configuration *top;

    if (pending_count == 0)
        return cudaErrorMissingConfiguration;
    top = &pending[--pending_count];
    *gridDim = top->grid;
    *blockDim = top->block;
    *sharedMem = top->shared_bytes;
    *(struct CUstream_st **)stream = top->stream;
    return cudaSuccess;
}
