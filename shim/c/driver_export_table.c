/* cuGetExportTable: NVIDIA's private driver tables, which vgpu does not provide. The call
   fails for everyone; what the user is told depends on who asked, found from the caller's
   return address (dladdr):
   - NVIDIA's compiler libraries (NVRTC, nvJitLink, ...) ask for their own reasons and
     compile without the tables: nothing to say;
   - cuda-python's cuda.bindings.runtime, which embeds NVIDIA's runtime: say what to use
     instead;
   - NVIDIA's shared runtime (libcudart.so*) loaded by its path instead of vgpu's: name it;
   - a file carrying NVIDIA's runtime linked statically (nvcc's default), recognised by the
     names of the runtime's shared-memory segments, which only it writes: rebuild it with
     `-cudart shared`;
   - anyone else: name the file and the call that failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver_shim.h"

/* Libraries of the CUDA toolkit that ask for the tables and manage without them. */
static const char *const quiet_libraries[] = {"libnvrtc", "libnvJitLink", "libnvptxcompiler",
                                              "libnvvm", "libnvfatbin"};

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static int starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* 1 if the file at `path` holds the static runtime's shared-memory segment names (the marker
   `vgpu run` looks for before starting a program, vgpu/binary_check.py: keep them alike). */
static int carries_static_cudart(const char *path)
{
    static const char marker[] = "/cudart.shm.";
    struct stat st;
    void *data;
    int fd = open(path, O_RDONLY | O_CLOEXEC), found = 0;

    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        data = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (data != MAP_FAILED) {
            found = memmem(data, (size_t)st.st_size, marker, sizeof marker - 1) != NULL;
            munmap(data, (size_t)st.st_size);
        }
    }
    close(fd);
    return found;
}

static void explain(const void *caller)
{
    Dl_info info;
    const char *path = NULL, *name;
    size_t i;

    if (dladdr(caller, &info) != 0 && info.dli_fname != NULL && info.dli_fname[0] != '\0')
        path = info.dli_fname;
    if (path == NULL || access(path, R_OK) != 0)
        path = "/proc/self/exe"; /* the main program, named by its argv[0] or not at all */
    name = base_name(path);
    for (i = 0; i < sizeof quiet_libraries / sizeof quiet_libraries[0]; i++)
        if (starts_with(name, quiet_libraries[i]))
            return;
    if (strstr(path, "/cuda/bindings/") != NULL)
        fprintf(stderr, "vgpu: cuda-python's cuda.bindings.runtime carries NVIDIA's CUDA runtime "
                "(%s), which cannot run on vgpu; its calls fail. Use cuda.bindings.driver or "
                "cuda.core instead.\n", path);
    else if (starts_with(name, "libcudart.so"))
        fprintf(stderr, "vgpu: NVIDIA's CUDA runtime (%s) was loaded by its path instead of "
                "vgpu's libcudart.so.13, and cannot run on vgpu; its calls fail.\n", path);
    else if (carries_static_cudart(path))
        fprintf(stderr, "vgpu: %s carries NVIDIA's CUDA runtime linked statically; vgpu cannot "
                "run it. Rebuild it with 'nvcc -cudart shared'.\n",
                strcmp(path, "/proc/self/exe") == 0 ? "this program" : path);
    else
        fprintf(stderr, "vgpu: %s asked for NVIDIA's private driver tables "
                "(cuGetExportTable), which vgpu does not provide; the call fails.\n", path);
    fflush(stderr);
}

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    static atomic_flag explained = ATOMIC_FLAG_INIT;
    const void *caller = __builtin_return_address(0);

    (void)pExportTableId;
    if (ppExportTable != NULL)
        *ppExportTable = NULL;
    if (!atomic_flag_test_and_set(&explained))
        explain(caller);
    return CUDA_ERROR_NOT_SUPPORTED;
}
