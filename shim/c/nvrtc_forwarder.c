/* vgpu's libnvrtc.so.13: NVIDIA's NVRTC, with cubins that also carry their PTX.

   Programs that JIT-compile with NVRTC mostly ask for a cubin of the device's `sm_XY` (CuPy
   does) and load it with cuModuleLoadData. A cubin is SASS, which the emu backend cannot run;
   but an sm_XY compilation also leaves its PTX in the program (nvrtcGetPTX). So this library
   forwards every call to NVIDIA's libnvrtc.so.13 and changes one answer: nvrtcGetCUBINSize
   and nvrtcGetCUBIN hand back a fatbin container holding the cubin and that PTX, which
   cuModuleLoadData takes on any driver: a GPU runs the cubin, emu the PTX.

   Plain C with no dependency but libc and libdl, since `vgpu run` preloads it into every
   program (cuda-python finds NVRTC by asking which libnvrtc.so.13 is loaded before looking
   in site-packages): NVIDIA's library, named by VGPU_NVRTC_LIBRARY (`vgpu run` sets it),
   is loaded only at a program's first NVRTC call (a program started otherwise gets the one
   behind this on LD_LIBRARY_PATH). Without it, every call fails with
   NVRTC_ERROR_INTERNAL_ERROR and one line on stderr says why.

   The fatbin is written as nvcc 13's `fatbinary` writes one (vgpu/fatbin.py describes the
   layout and reads it; tests/shim/test_nvrtc_library.py compares the two byte for byte). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_OUT_OF_MEMORY = 1, NVRTC_ERROR_INVALID_INPUT = 3,
       NVRTC_ERROR_INTERNAL_ERROR = 11 };

/* NVIDIA's prototypes (nvrtc.h of CUDA 13.0), declared here so that building vgpu needs no
   toolkit. */
const char *nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int *major, int *minor);
nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs);
nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                               int numHeaders, const char *const *headers,
                               const char *const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char *const *options);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
nvrtcResult nvrtcGetLTOIRSize(nvrtcProgram prog, size_t *LTOIRSizeRet);
nvrtcResult nvrtcGetLTOIR(nvrtcProgram prog, char *LTOIR);
nvrtcResult nvrtcGetOptiXIRSize(nvrtcProgram prog, size_t *optixirSizeRet);
nvrtcResult nvrtcGetOptiXIR(nvrtcProgram prog, char *optixir);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
nvrtcResult nvrtcAddNameExpression(nvrtcProgram prog, const char *const name_expression);
nvrtcResult nvrtcGetLoweredName(nvrtcProgram prog, const char *const name_expression,
                                const char **lowered_name);
nvrtcResult nvrtcGetPCHHeapSize(size_t *ret);
nvrtcResult nvrtcSetPCHHeapSize(size_t size);
nvrtcResult nvrtcGetPCHCreateStatus(nvrtcProgram prog);
nvrtcResult nvrtcGetPCHHeapSizeRequired(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcSetFlowCallback(nvrtcProgram prog, int (*callback)(void *, void *),
                                 void *payload);

/* ------------------------------------------------------------ NVIDIA's library */

static void *nvidia;
static pthread_once_t nvidia_once = PTHREAD_ONCE_INIT;

/* NVIDIA's NVRTC loads its builtins (libnvrtc-builtins.so.13.N) from the folder of the
   libnvrtc.so.13 it finds loaded, which is this one's, else by the loader's search. Loaded
   here first from NVIDIA's folder, they are found by their soname. */
static void load_builtins_beside(const char *nvrtc_path)
{
    static const char prefix[] = "libnvrtc-builtins.so.";
    const char *slash = strrchr(nvrtc_path, '/');
    char folder[4096], path[4096 + 256];
    struct dirent *entry;
    DIR *dir;

    if (slash == NULL || (size_t)(slash - nvrtc_path) >= sizeof folder)
        return;
    memcpy(folder, nvrtc_path, (size_t)(slash - nvrtc_path));
    folder[slash - nvrtc_path] = '\0';
    dir = opendir(folder);
    if (dir == NULL)
        return;
    while ((entry = readdir(dir)) != NULL)
        if (strncmp(entry->d_name, prefix, sizeof prefix - 1) == 0) {
            snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
            dlopen(path, RTLD_NOW | RTLD_LOCAL); /* NVRTC's own error names what failed */
        }
    closedir(dir);
}

/* NVIDIA's library at `path`, or NULL with the reason in *why: it cannot be loaded, or it
   is this one (the same soname: a path naming this very file would forward to itself). */
static void *open_nvidia(const char *path, const char **why)
{
    void *handle;

    load_builtins_beside(path);
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        *why = dlerror();
    else if (dlsym(handle, "nvrtcVersion") == (void *)nvrtcVersion) {
        *why = "it is vgpu's own libnvrtc.so.13";
        handle = NULL;
    }
    return handle;
}

/* Without VGPU_NVRTC_LIBRARY (a program not started by `vgpu run`): the first
   libnvrtc.so.13 behind this one on LD_LIBRARY_PATH, else the toolkit's. */
static void *search_nvidia(void)
{
    const char *list = getenv("LD_LIBRARY_PATH"), *start = list != NULL ? list : "";
    char path[4096 + 32];
    const char *why;
    void *handle;

    for (;;) {
        size_t length = strcspn(start, ":");
        if (length > 0 && length < 4096) {
            snprintf(path, sizeof path, "%.*s/libnvrtc.so.13", (int)length, start);
            if (access(path, F_OK) == 0 && (handle = open_nvidia(path, &why)) != NULL)
                return handle;
        }
        if (start[length] == '\0')
            break;
        start += length + 1;
    }
    return open_nvidia("/usr/local/cuda/lib64/libnvrtc.so.13", &why);
}

static void load_nvidia(void)
{
    const char *path = getenv("VGPU_NVRTC_LIBRARY"), *why = NULL;

    if (path == NULL || path[0] == '\0') {
        nvidia = search_nvidia();
        if (nvidia == NULL)
            fprintf(stderr, "vgpu: NVIDIA's NVRTC (libnvrtc.so.13) was not found: install it "
                    "(pip install nvidia-cuda-nvrtc, or the CUDA toolkit) or name its file in "
                    "VGPU_NVRTC_LIBRARY; NVRTC calls fail.\n");
        return;
    }
    nvidia = open_nvidia(path, &why);
    if (nvidia == NULL)
        fprintf(stderr, "vgpu: cannot load NVIDIA's NVRTC from %s (VGPU_NVRTC_LIBRARY): %s; "
                "NVRTC calls fail.\n", path, why);
}

/* NVIDIA's function `name`, or NULL (said once on stderr) if it cannot be had. */
static void *nvidia_function(const char *name)
{
    void *function;

    pthread_once(&nvidia_once, load_nvidia);
    if (nvidia == NULL)
        return NULL;
    function = dlsym(nvidia, name);
    if (function == NULL)
        fprintf(stderr, "vgpu: NVIDIA's NVRTC has no %s; the call fails.\n", name);
    return function;
}

/* Calls NVIDIA's `name` with the arguments; its pointer is looked up once. */
#define FORWARD(name, ...)                                                                  \
    do {                                                                                    \
        static __typeof__(&name) forward_to;                                                \
        __typeof__(&name) function = __atomic_load_n(&forward_to, __ATOMIC_ACQUIRE);        \
        if (function == NULL) {                                                             \
            function = (__typeof__(&name))nvidia_function(#name);                          \
            if (function == NULL)                                                           \
                return NVRTC_ERROR_INTERNAL_ERROR;                                          \
            __atomic_store_n(&forward_to, function, __ATOMIC_RELEASE);                      \
        }                                                                                   \
        return function(__VA_ARGS__);                                                       \
    } while (0)

const char *nvrtcGetErrorString(nvrtcResult result)
{
    const char *(*function)(nvrtcResult) =
        (const char *(*)(nvrtcResult))nvidia_function("nvrtcGetErrorString");

    if (function == NULL)
        return result == NVRTC_SUCCESS ? "NVRTC_SUCCESS"
                                       : "NVRTC error (NVIDIA's NVRTC library is not available)";
    return function(result);
}

nvrtcResult nvrtcVersion(int *major, int *minor) { FORWARD(nvrtcVersion, major, minor); }

nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs)
{
    FORWARD(nvrtcGetNumSupportedArchs, numArchs);
}

nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs)
{
    FORWARD(nvrtcGetSupportedArchs, supportedArchs);
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                               int numHeaders, const char *const *headers,
                               const char *const *includeNames)
{
    FORWARD(nvrtcCreateProgram, prog, src, name, numHeaders, headers, includeNames);
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog) { FORWARD(nvrtcDestroyProgram, prog); }

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char *const *options)
{
    FORWARD(nvrtcCompileProgram, prog, numOptions, options);
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet)
{
    FORWARD(nvrtcGetPTXSize, prog, ptxSizeRet);
}

nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx) { FORWARD(nvrtcGetPTX, prog, ptx); }

nvrtcResult nvrtcGetLTOIRSize(nvrtcProgram prog, size_t *LTOIRSizeRet)
{
    FORWARD(nvrtcGetLTOIRSize, prog, LTOIRSizeRet);
}

nvrtcResult nvrtcGetLTOIR(nvrtcProgram prog, char *LTOIR) { FORWARD(nvrtcGetLTOIR, prog, LTOIR); }

nvrtcResult nvrtcGetOptiXIRSize(nvrtcProgram prog, size_t *optixirSizeRet)
{
    FORWARD(nvrtcGetOptiXIRSize, prog, optixirSizeRet);
}

nvrtcResult nvrtcGetOptiXIR(nvrtcProgram prog, char *optixir)
{
    FORWARD(nvrtcGetOptiXIR, prog, optixir);
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet)
{
    FORWARD(nvrtcGetProgramLogSize, prog, logSizeRet);
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)
{
    FORWARD(nvrtcGetProgramLog, prog, log);
}

nvrtcResult nvrtcAddNameExpression(nvrtcProgram prog, const char *const name_expression)
{
    FORWARD(nvrtcAddNameExpression, prog, name_expression);
}

nvrtcResult nvrtcGetLoweredName(nvrtcProgram prog, const char *const name_expression,
                                const char **lowered_name)
{
    FORWARD(nvrtcGetLoweredName, prog, name_expression, lowered_name);
}

nvrtcResult nvrtcGetPCHHeapSize(size_t *ret) { FORWARD(nvrtcGetPCHHeapSize, ret); }

nvrtcResult nvrtcSetPCHHeapSize(size_t size) { FORWARD(nvrtcSetPCHHeapSize, size); }

nvrtcResult nvrtcGetPCHCreateStatus(nvrtcProgram prog)
{
    FORWARD(nvrtcGetPCHCreateStatus, prog);
}

nvrtcResult nvrtcGetPCHHeapSizeRequired(nvrtcProgram prog, size_t *size)
{
    FORWARD(nvrtcGetPCHHeapSizeRequired, prog, size);
}

nvrtcResult nvrtcSetFlowCallback(nvrtcProgram prog, int (*callback)(void *, void *),
                                 void *payload)
{
    FORWARD(nvrtcSetFlowCallback, prog, callback, payload);
}

/* ------------------------------------------------------------ cubin + PTX in one fatbin */

static nvrtcResult nvidia_cubin_size(nvrtcProgram prog, size_t *size)
{
    FORWARD(nvrtcGetCUBINSize, prog, size);
}

static nvrtcResult nvidia_cubin(nvrtcProgram prog, char *cubin)
{
    FORWARD(nvrtcGetCUBIN, prog, cubin);
}

enum {
    CONTAINER_MAGIC = 0xBA55ED50u,
    CONTAINER_HEADER = 16,
    KIND_PTX = 1,
    KIND_CUBIN = 2,
    CUBIN_HEADER = 0x40,
    PTX_HEADER = 0x50, /* 0x40 and an empty options block: {u32 offset 0x48, u32 length 0} */
    PTX_OPTIONS = 0x40,
    EI_ABIVERSION = 8, /* the cubin's ELF ABI version: the minor of its entry's version */
};

/* Entry flags as nvcc writes them: 64-bit addresses, Linux host; `sm_XYa` code adds the
   arch-specific bit (vgpu/fatbin.py EntryFlags). */
static const uint64_t FLAGS_PLAIN = 0x11, FLAG_ARCH_SPECIFIC = 0x100000;

/* What a program's compilation left: the cubin's size and the PTX (text, NUL included), with
   the PTX's `.version` and `.target`, which the fatbin's entries state. */
struct compiled {
    size_t cubin_size, ptx_size;
    char *ptx;
    unsigned ptx_major, ptx_minor, arch;
    int arch_specific;
};

static size_t padded(size_t size) { return (size + 7) & ~(size_t)7; }

static size_t fatbin_size(const struct compiled *c)
{
    return CONTAINER_HEADER + CUBIN_HEADER + padded(c->cubin_size) + PTX_HEADER
           + padded(c->ptx_size);
}

/* The line of `text` that starts with `prefix`, or NULL. */
static const char *line_starting(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    const char *at = text;

    while (at != NULL && strncmp(at, prefix, n) != 0) {
        at = strchr(at, '\n');
        if (at != NULL)
            at++;
    }
    return at;
}

/* 1 if the PTX states `.version M.m` and a `.target sm_XY` or `sm_XYa`. A family target
   (`sm_XYf`) is left as NVIDIA made it: its fatbin entry carries a table vgpu does not write. */
static int read_ptx_header(struct compiled *c)
{
    const char *version = line_starting(c->ptx, ".version "),
               *target = line_starting(c->ptx, ".target sm_");
    char suffix;
    int n;

    if (version == NULL || target == NULL)
        return 0;
    if (sscanf(version, ".version %u.%u", &c->ptx_major, &c->ptx_minor) != 2)
        return 0;
    if (sscanf(target, ".target sm_%u%n", &c->arch, &n) != 1)
        return 0;
    suffix = target[n];
    if (suffix != 'a' && suffix != ',' && suffix != ' ' && suffix != '\n' && suffix != '\r')
        return 0;
    c->arch_specific = suffix == 'a';
    return 1;
}

/* Fills `c` and answers 1 if the program's cubin is to be handed back as a fatbin with its
   PTX; 0 (with *result NVRTC_SUCCESS) to hand back NVIDIA's answer unchanged. */
static int plan_fatbin(nvrtcProgram prog, struct compiled *c, nvrtcResult *result)
{
    memset(c, 0, sizeof *c);
    *result = nvidia_cubin_size(prog, &c->cubin_size);
    if (*result != NVRTC_SUCCESS || c->cubin_size == 0)
        return 0;
    *result = nvrtcGetPTXSize(prog, &c->ptx_size);
    if (*result != NVRTC_SUCCESS || c->ptx_size <= 1) {
        *result = NVRTC_SUCCESS; /* a cubin without PTX (none seen): NVIDIA's answer */
        return 0;
    }
    c->ptx = calloc(1, c->ptx_size + 1);
    if (c->ptx == NULL) {
        *result = NVRTC_ERROR_OUT_OF_MEMORY;
        return 0;
    }
    *result = nvrtcGetPTX(prog, c->ptx);
    if (*result == NVRTC_SUCCESS && read_ptx_header(c))
        return 1;
    free(c->ptx);
    c->ptx = NULL;
    return 0;
}

static void put16(char *at, uint16_t v) { memcpy(at, &v, sizeof v); }
static void put32(char *at, uint32_t v) { memcpy(at, &v, sizeof v); }
static void put64(char *at, uint64_t v) { memcpy(at, &v, sizeof v); }

static void entry_header(char *at, uint16_t kind, uint32_t header, size_t payload,
                         unsigned major, unsigned minor, const struct compiled *c)
{
    memset(at, 0, header);
    put16(at, kind);
    put16(at + 2, 0x0101);
    put32(at + 4, header);
    put64(at + 8, padded(payload));
    put16(at + 0x18, (uint16_t)minor);
    put16(at + 0x1a, (uint16_t)major);
    put32(at + 0x1c, c->arch);
    put64(at + 0x28, FLAGS_PLAIN | (c->arch_specific ? FLAG_ARCH_SPECIFIC : 0));
}

/* Writes the fatbin into `out` (fatbin_size(c) bytes): the container, the cubin's entry
   (NVIDIA's cubin copied straight into place), the PTX's entry. */
static nvrtcResult write_fatbin(nvrtcProgram prog, const struct compiled *c, char *out)
{
    char *cubin_entry = out + CONTAINER_HEADER, *cubin = cubin_entry + CUBIN_HEADER;
    char *ptx_entry = cubin + padded(c->cubin_size), *ptx = ptx_entry + PTX_HEADER;
    nvrtcResult result;

    memset(out, 0, fatbin_size(c));
    result = nvidia_cubin(prog, cubin);
    if (result != NVRTC_SUCCESS)
        return result;
    put32(out, CONTAINER_MAGIC);
    put16(out + 4, 1);
    put16(out + 6, CONTAINER_HEADER);
    put64(out + 8, fatbin_size(c) - CONTAINER_HEADER);
    entry_header(cubin_entry, KIND_CUBIN, CUBIN_HEADER, c->cubin_size, 1,
                 (unsigned char)cubin[EI_ABIVERSION], c);
    entry_header(ptx_entry, KIND_PTX, PTX_HEADER, c->ptx_size, c->ptx_major, c->ptx_minor, c);
    put32(ptx_entry + 0x14, PTX_OPTIONS);
    put32(ptx_entry + PTX_OPTIONS, PTX_OPTIONS + 8);
    memcpy(ptx, c->ptx, c->ptx_size);
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet)
{
    struct compiled c;
    nvrtcResult result;

    if (cubinSizeRet == NULL)
        return nvidia_cubin_size(prog, cubinSizeRet); /* NVIDIA's error for it */
    if (!plan_fatbin(prog, &c, &result)) {
        if (result == NVRTC_SUCCESS)
            *cubinSizeRet = c.cubin_size;
        return result;
    }
    *cubinSizeRet = fatbin_size(&c);
    free(c.ptx);
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)
{
    struct compiled c;
    nvrtcResult result;

    if (cubin == NULL)
        return nvidia_cubin(prog, cubin);
    if (!plan_fatbin(prog, &c, &result))
        return result == NVRTC_SUCCESS ? nvidia_cubin(prog, cubin) : result;
    result = write_fatbin(prog, &c, cubin);
    free(c.ptx);
    return result;
}
