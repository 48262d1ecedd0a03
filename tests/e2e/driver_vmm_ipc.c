/* Physical memory of CUDA's virtual memory API shared between two processes, in the manner
 * of cuda-samples' memMapIPCDrv: the parent makes an allocation exportable as a POSIX file
 * descriptor (cuMemCreate with requestedHandleTypes), fills it, exports it and sends the
 * descriptor to a child forked before either touched CUDA (SCM_RIGHTS). The child imports
 * it, maps it into a range of its own, reads the parent's values and doubles them with a
 * kernel; the parent reads the doubled values, writes new ones and lets go of the memory
 * (unmaps and releases it), and the child, which still holds it, reads them. Misuse gets
 * CUDA's errors: exporting memory that did not ask to be exportable, or as another handle
 * type, or with flags; importing as the wrong handle type, or from a descriptor that is no
 * exported memory (none, closed, a socket, another file).
 * Prints one line per check, "name got expected" (the child's named child_...), then the
 * parent's "failures N". Usage: driver_vmm_ipc KERNELS.ptx (stream_kernels.cu) */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "forked_child.h"
#include "test_files.h"

enum { N = 2500, BLOCK = 256, FIRST = 7, SECOND = 1000 };

static int failures = 0;
static void expect(const char *what, long long got, long long want) {
    printf("%s %lld %lld\n", what, got, want);
    if (got != want) failures++;
}

static CUmemAllocationProp device_prop(CUmemAllocationHandleType handle_types) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = handle_types;
    return prop;
}

static size_t granularity(void) {
    CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    return gran;
}

/* A context and `kernel` of the module; the check is named `check`. */
static CUfunction setup(const char *ptx_path, const char *kernel, const char *check) {
    char *ptx = read_file(ptx_path);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f = NULL;
    expect(check,
           ptx != NULL && cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
           cuCtxCreate(&ctx, NULL, 0, dev) == CUDA_SUCCESS &&
           cuModuleLoadData(&mod, ptx) == CUDA_SUCCESS &&
           cuModuleGetFunction(&f, mod, kernel) == CUDA_SUCCESS, 1);
    free(ptx);
    return f;
}

/* `handle` mapped read-write at a new reservation: its address (0 if that failed). */
static CUdeviceptr mapped(CUmemGenericAllocationHandle handle, size_t size) {
    CUdeviceptr at = 0;
    CUmemAccessDesc desc;
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cuMemAddressReserve(&at, size, 0, 0, 0) != CUDA_SUCCESS) return 0;
    if (cuMemMap(at, size, 0, handle, 0) != CUDA_SUCCESS ||
            cuMemSetAccess(at, size, &desc, 1) != CUDA_SUCCESS)
        return 0;
    return at;
}

static int unmapped(CUdeviceptr at, size_t size) {
    return cuMemUnmap(at, size) == CUDA_SUCCESS && cuMemAddressFree(at, size) == CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, void **params) {
    CUresult rc = cuLaunchKernel(f, (N + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, NULL,
                                 params, NULL);
    return rc != CUDA_SUCCESS ? rc : cuCtxSynchronize();
}

/* Whether the N ints at `v` are base + 3i, times `times`. */
static int holds(CUdeviceptr v, int base, int times) {
    static int host[N];
    if (cuMemcpyDtoH(host, v, sizeof host) != CUDA_SUCCESS) return 0;
    for (int i = 0; i < N; i++)
        if (host[i] != (base + 3 * i) * times) return 0;
    return 1;
}

static void *as_handle(int fd) { return (void *)(uintptr_t)fd; }

static CUresult import_from(int fd, CUmemAllocationHandleType type) {
    CUmemGenericAllocationHandle refused;
    return cuMemImportFromShareableHandle(&refused, as_handle(fd), type);
}

static int child(const char *ptx_path, int from_parent, int to_parent) {
    char note = 0;
    int fd = receive_fd(from_parent, &note, 1);
    expect("child_received_fd", fd >= 0, 1);
    CUfunction add_into = setup(ptx_path, "add_into", "child_setup");
    size_t gran = granularity();

    /* the wrong handle types, and descriptors that are no exported memory */
    CUmemGenericAllocationHandle handle;
    expect("child_import_type_none", import_from(fd, CU_MEM_HANDLE_TYPE_NONE),
           CUDA_ERROR_INVALID_VALUE);
    expect("child_import_type_win32", import_from(fd, CU_MEM_HANDLE_TYPE_WIN32),
           CUDA_ERROR_NOT_SUPPORTED);
    expect("child_import_type_unknown", import_from(fd, (CUmemAllocationHandleType)0x40),
           CUDA_ERROR_INVALID_VALUE);
    expect("child_import_null_handle",
           cuMemImportFromShareableHandle(NULL, as_handle(fd),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    expect("child_import_no_fd", import_from(-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    int closed = dup(fd);
    close(closed);
    expect("child_import_closed_fd",
           import_from(closed, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    expect("child_import_socket",
           import_from(from_parent, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    FILE *other = tmpfile();
    char junk[64];
    memset(junk, 'x', sizeof junk);
    fwrite(junk, 1, sizeof junk, other);
    fflush(other);
    expect("child_import_other_file",
           import_from(fileno(other), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    fclose(other);

    expect("child_import",
           cuMemImportFromShareableHandle(&handle, as_handle(fd),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_SUCCESS);
    close(fd);  /* the imported handle holds the memory, not the descriptor */
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    expect("child_imported_properties", cuMemGetAllocationPropertiesFromHandle(&got, handle),
           CUDA_SUCCESS);
    expect("child_imported_handle_types", got.requestedHandleTypes,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    expect("child_imported_location", got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           got.location.id == 0, 1);

    CUdeviceptr v = mapped(handle, gran);
    expect("child_mapped", v != 0, 1);
    expect("child_sees_parents_values", holds(v, FIRST, 1), 1);
    int n = N;
    void *params[] = {&v, &v, &v, &n};
    expect("child_doubles_them", launch(add_into, params), CUDA_SUCCESS);
    char done = 'd';
    transfer(to_parent, &done, 1, 1);

    /* the parent writes new values and lets go of the memory: the child's hold keeps it */
    expect("child_parent_let_go", transfer(from_parent, &done, 1, 0) && done == 'r', 1);
    expect("child_sees_values_after_parents_release", holds(v, SECOND, 1), 1);
    expect("child_unmapped", unmapped(v, gran), 1);
    expect("child_release", cuMemRelease(handle), CUDA_SUCCESS);
    expect("child_release_again", cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
    return failures != 0;
}

int main(int argc, char **argv) {
    const char *ptx_path = argc > 1 ? argv[1] : "stream_kernels.ptx";
    setvbuf(stdout, NULL, _IOLBF, 0);  /* whole lines, between the two processes' */
    struct forked other;
    if (!fork_with_channels(&other)) {
        fprintf(stderr, "driver_vmm_ipc: no child process\n");
        return 1;
    }
    if (other.pid == 0)
        return child(ptx_path, other.in, other.out);

    CUfunction fill = setup(ptx_path, "fill", "setup");
    size_t gran = granularity();
    expect("granularity", gran > 0 && gran >= N * sizeof(int), 1);
    CUmemAllocationProp exportable = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemAllocationProp plain = device_prop(CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle shared, private_one;
    expect("create_exportable", cuMemCreate(&shared, gran, &exportable, 0), CUDA_SUCCESS);
    expect("create_private", cuMemCreate(&private_one, gran, &plain, 0), CUDA_SUCCESS);
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    cuMemGetAllocationPropertiesFromHandle(&got, shared);
    expect("exportable_handle_types", got.requestedHandleTypes,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    cuMemGetAllocationPropertiesFromHandle(&got, private_one);
    expect("private_handle_types", got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);

    /* memory exports only as a handle type its allocation requested, with no flags */
    int fd = -1, refused = -1;
    expect("export_private", cuMemExportToShareableHandle(
               &refused, private_one, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    expect("export_win32", cuMemExportToShareableHandle(&refused, shared,
                                                        CU_MEM_HANDLE_TYPE_WIN32, 0),
           CUDA_ERROR_INVALID_VALUE);
    expect("export_none", cuMemExportToShareableHandle(&refused, shared,
                                                       CU_MEM_HANDLE_TYPE_NONE, 0),
           CUDA_ERROR_INVALID_VALUE);
    expect("export_flags", cuMemExportToShareableHandle(
               &refused, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
           CUDA_ERROR_INVALID_VALUE);
    expect("export_null", cuMemExportToShareableHandle(
               NULL, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    expect("export_refused_leaves_fd", refused, -1);
    expect("export", cuMemExportToShareableHandle(&fd, shared,
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_SUCCESS);
    struct stat st;
    expect("export_is_a_descriptor", fd >= 0 && fstat(fd, &st) == 0, 1);
    int again = -1;
    expect("export_again", cuMemExportToShareableHandle(
               &again, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    expect("export_again_is_another_descriptor", again >= 0 && again != fd, 1);
    close(again);

    CUdeviceptr v = mapped(shared, gran);
    expect("mapped", v != 0, 1);
    int n = N, base = FIRST;
    void *params[] = {&v, &n, &base};
    expect("fill", launch(fill, params), CUDA_SUCCESS);
    char note = 'f';
    expect("sent_fd", send_fd(other.out, fd, &note, 1), 1);
    close(fd);

    expect("child_done", transfer(other.in, &note, 1, 0) && note == 'd', 1);
    expect("sees_childs_doubling", holds(v, FIRST, 2), 1);
    base = SECOND;
    expect("fill_again", launch(fill, params), CUDA_SUCCESS);
    expect("unmapped", unmapped(v, gran), 1);
    expect("release", cuMemRelease(shared), CUDA_SUCCESS);
    note = 'r';
    transfer(other.out, &note, 1, 1);
    expect("child_succeeded", child_succeeded(other.pid), 1);
    expect("release_private", cuMemRelease(private_one), CUDA_SUCCESS);
    printf("failures %d\n", failures);
    return failures != 0;
}
