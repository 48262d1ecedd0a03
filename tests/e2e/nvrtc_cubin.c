/* An unmodified NVRTC program that compiles for the device's own sm_XY, as JIT users do, and
 * loads the cubin NVRTC hands back: a kernel template reached by its lowered name, then two
 * relocatable (-rdc) compilations linked with cuLink* as cubins. Exits 0 only if every result
 * is right. */
#include <cuda.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"

static const char SAXPY[] =
    "template <typename T>\n"
    "__global__ void saxpy(T a, const T *x, T *y, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";
static const char HELPER[] =
    "__device__ float cube(float v) { return v * v * v; }\n";
static const char USES_HELPER[] =
    "__device__ float cube(float v);\n"
    "extern \"C\" __global__ void cubes(float *x, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] = cube(x[i]);\n"
    "}\n";

/* Compiles `source` with `arch` (and -rdc when asked); the cubin NVRTC hands back, its size
 * in *size; the lowered name of `expression` (if any) copied to `lowered`. */
static char *compile(const char *source, const char *arch, int rdc, const char *expression,
                     char *lowered, size_t *size)
{
    nvrtcProgram program;
    const char *options[] = {arch, "-rdc=true"};
    const char *name;
    char *cubin;

    if (nvrtcCreateProgram(&program, source, "jit.cu", 0, NULL, NULL) != NVRTC_SUCCESS)
        return NULL;
    if (expression)
        nvrtcAddNameExpression(program, expression);
    if (nvrtcCompileProgram(program, rdc ? 2 : 1, options) != NVRTC_SUCCESS) {
        size_t log_size;
        nvrtcGetProgramLogSize(program, &log_size);
        char *log = malloc(log_size);
        nvrtcGetProgramLog(program, log);
        fprintf(stderr, "compile failed:\n%s\n", log);
        return NULL;
    }
    if (expression && nvrtcGetLoweredName(program, expression, &name) == NVRTC_SUCCESS)
        strcpy(lowered, name);
    if (nvrtcGetCUBINSize(program, size) != NVRTC_SUCCESS || *size == 0)
        return NULL;
    cubin = malloc(*size);
    if (nvrtcGetCUBIN(program, cubin) != NVRTC_SUCCESS)
        return NULL;
    nvrtcDestroyProgram(&program);
    return cubin;
}

int main(void) {
    enum { N = 1000 };
    CUdevice dev; CUcontext ctx; CUmodule mod, linked_mod;
    CUfunction saxpy, cubes;
    CUlinkState link;
    int major = 0, minor = 0, n = N;
    char arch[32], lowered[256] = "";
    size_t size, helper_size, user_size, linked_size;
    float x[N], y[N], a = 2.5f;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    snprintf(arch, sizeof arch, "-arch=sm_%d%d", major, minor);
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));

    /* One compilation, loaded from the cubin bytes NVRTC gave. */
    char *cubin = compile(SAXPY, arch, 0, "saxpy<float>", lowered, &size);
    EXPECT(cubin != NULL && lowered[0] != '\0');
    CHECK(cuModuleLoadData(&mod, cubin));
    CHECK(cuModuleGetFunction(&saxpy, mod, lowered));
    for (int i = 0; i < N; i++) { x[i] = i * 0.25f; y[i] = 1.0f - i; }
    CUdeviceptr dx, dy;
    CHECK(cuMemAlloc(&dx, sizeof x));
    CHECK(cuMemAlloc(&dy, sizeof y));
    CHECK(cuMemcpyHtoD(dx, x, sizeof x));
    CHECK(cuMemcpyHtoD(dy, y, sizeof y));
    void *saxpy_args[] = {&a, &dx, &dy, &n};
    CHECK(cuLaunchKernel(saxpy, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, saxpy_args, NULL));
    float out[N];
    CHECK(cuMemcpyDtoH(out, dy, sizeof out));
    for (int i = 0; i < N; i++) EXPECT(out[i] == a * x[i] + y[i]);
    printf("nvrtc_cubin: %s cubin of %zu bytes ran\n", arch + 6, size);

    /* Relocatable compilations linked as cubins. */
    char *helper = compile(HELPER, arch, 1, NULL, NULL, &helper_size);
    char *user = compile(USES_HELPER, arch, 1, NULL, NULL, &user_size);
    EXPECT(helper != NULL && user != NULL);
    void *linked;
    CHECK(cuLinkCreate(0, NULL, NULL, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_CUBIN, helper, helper_size, "helper", 0, NULL, NULL));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_CUBIN, user, user_size, "user", 0, NULL, NULL));
    CHECK(cuLinkComplete(link, &linked, &linked_size));
    CHECK(cuModuleLoadData(&linked_mod, linked));
    CHECK(cuLinkDestroy(link));
    CHECK(cuModuleGetFunction(&cubes, linked_mod, "cubes"));
    CHECK(cuMemcpyHtoD(dx, x, sizeof x));
    void *cubes_args[] = {&dx, &n};
    CHECK(cuLaunchKernel(cubes, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, cubes_args, NULL));
    CHECK(cuMemcpyDtoH(out, dx, sizeof out));
    for (int i = 0; i < N; i++) EXPECT(out[i] == x[i] * x[i] * x[i]);

    CHECK(cuModuleUnload(mod));
    CHECK(cuModuleUnload(linked_mod));
    CHECK(cuCtxDestroy(ctx));
    printf("nvrtc_cubin: all checks passed\n");
    return 0;
}
