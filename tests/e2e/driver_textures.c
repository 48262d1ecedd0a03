/* CUDA arrays, texture and surface objects through the driver API, checked against the host:
 * a half-float RGBA array sampled with normalized coordinates, linear filtering and border
 * addressing; a pitched 2D texture over cuMemAllocPitch memory; a layered short array read as
 * integers; a 3D uint2 surface incremented in place; descriptor queries and misuse.
 * Usage: driver_textures TEXTURE_KERNELS.ptx */
#include <cuda.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"


/* IEEE half from a float that is exactly representable (the test's values are). */
static unsigned short half_of(float f) {
    unsigned int bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffff) == 0) return (unsigned short)(bits >> 16);
    int exponent = (int)((bits >> 23) & 0xff) - 127 + 15;
    return (unsigned short)(((bits >> 16) & 0x8000) | (exponent << 10) | ((bits >> 13) & 0x3ff));
}

/* A texture or surface resource over a whole array. */
static CUDA_RESOURCE_DESC array_resource(CUarray array) {
    CUDA_RESOURCE_DESC res;
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = array;
    return res;
}

/* Host rows of `row_bytes`, `rows` per slice, `depth` slices -> the array. */
static CUresult upload_3d(CUarray array, const void *host, size_t row_bytes, size_t rows,
                          size_t depth) {
    CUDA_MEMCPY3D copy;
    memset(&copy, 0, sizeof copy);
    copy.srcMemoryType = CU_MEMORYTYPE_HOST; copy.srcHost = host;
    copy.dstMemoryType = CU_MEMORYTYPE_ARRAY; copy.dstArray = array;
    copy.WidthInBytes = row_bytes; copy.Height = rows; copy.Depth = depth;
    return cuMemcpy3D(&copy);
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod;
    CUfunction sample, layered, increment;
    char *ptx = read_file(argc > 1 ? argv[1] : "texture_kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&sample, mod, "sample"));
    CHECK(cuModuleGetFunction(&layered, mod, "layered"));
    CHECK(cuModuleGetFunction(&increment, mod, "increment"));

    /* A 4x2 half4 array; texel (x, y) = (x, y, x + y, 1). */
    enum { W = 4, H = 2, N = 5 };
    unsigned short texels[H][W][4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            texels[y][x][0] = half_of((float)x);
            texels[y][x][1] = half_of((float)y);
            texels[y][x][2] = half_of((float)(x + y));
            texels[y][x][3] = half_of(1.0f);
        }
    CUDA_ARRAY_DESCRIPTOR ad = {W, H, CU_AD_FORMAT_HALF, 4};
    CUarray array;
    CHECK(cuArrayCreate(&array, &ad));
    CUDA_MEMCPY2D up = {0};
    up.srcMemoryType = CU_MEMORYTYPE_HOST; up.srcHost = texels; up.srcPitch = sizeof texels[0];
    up.dstMemoryType = CU_MEMORYTYPE_ARRAY; up.dstArray = array;
    up.WidthInBytes = sizeof texels[0]; up.Height = H;
    CHECK(cuMemcpy2D(&up));
    CUDA_ARRAY_DESCRIPTOR got;
    CHECK(cuArrayGetDescriptor(&got, array));
    EXPECT(got.Width == W && got.Height == H && got.Format == CU_AD_FORMAT_HALF &&
           got.NumChannels == 4);

    CUDA_RESOURCE_DESC res = array_resource(array);
    CUDA_TEXTURE_DESC td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_BORDER;
    td.filterMode = CU_TR_FILTER_MODE_LINEAR;
    td.flags = CU_TRSF_NORMALIZED_COORDINATES;
    td.borderColor[0] = td.borderColor[1] = td.borderColor[2] = td.borderColor[3] = -1.0f;
    CUtexObject tex;
    CHECK(cuTexObjectCreate(&tex, &res, &td, NULL));
    /* Points between texel centres (weights 1/2), one on a centre, one far outside. */
    float at[N][2] = {{0.25f, 0.5f}, {0.5f, 0.25f}, {0.375f, 0.75f}, {0.625f, 0.25f},
                      {3.0f, 0.5f}};
    float expect[N][4] = {{0.5f, 0.5f, 1.0f, 1.0f}, {1.5f, 0.0f, 1.5f, 1.0f},
                          {1.0f, 1.0f, 2.0f, 1.0f}, {2.0f, 0.0f, 2.0f, 1.0f},
                          {-1.0f, -1.0f, -1.0f, -1.0f}};
    CUdeviceptr d_at, d_out;
    CHECK(cuMemAlloc(&d_at, sizeof at));
    CHECK(cuMemAlloc(&d_out, 4096));
    CHECK(cuMemcpyHtoD(d_at, at, sizeof at));
    int n = N;
    void *sample_args[] = {&tex, &d_at, &d_out, &n};
    CHECK(cuLaunchKernel(sample, 1, 1, 1, 32, 1, 1, 0, NULL, sample_args, NULL));
    float out[N][4];
    CHECK(cuMemcpyDtoH(out, d_out, sizeof out));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < 4; c++)
            if (fabsf(out[i][c] - expect[i][c]) > 1e-6f) {
                fprintf(stderr, "point %d channel %d: %f, expected %f\n", i, c, out[i][c],
                        expect[i][c]);
                return 1;
            }
    CUDA_TEXTURE_DESC td_back;
    CHECK(cuTexObjectGetTextureDesc(&td_back, tex));
    EXPECT(td_back.filterMode == CU_TR_FILTER_MODE_LINEAR && td_back.borderColor[2] == -1.0f);
    CHECK(cuTexObjectDestroy(tex));
    printf("driver_textures: half-float linear sampling with a border correct\n");

    /* A pitched 2D texture over cuMemAllocPitch memory (float, point). */
    CUdeviceptr pitched;
    size_t pitch;
    CHECK(cuMemAllocPitch(&pitched, &pitch, 3 * sizeof(float), 2, 4));
    float rows[2][3] = {{1, 2, 3}, {4, 5, 6}};
    CUDA_MEMCPY2D fill = {0};
    fill.srcMemoryType = CU_MEMORYTYPE_HOST; fill.srcHost = rows; fill.srcPitch = sizeof rows[0];
    fill.dstMemoryType = CU_MEMORYTYPE_DEVICE; fill.dstDevice = pitched; fill.dstPitch = pitch;
    fill.WidthInBytes = sizeof rows[0]; fill.Height = 2;
    CHECK(cuMemcpy2D(&fill));
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_PITCH2D;
    res.res.pitch2D.devPtr = pitched;
    res.res.pitch2D.format = CU_AD_FORMAT_FLOAT;
    res.res.pitch2D.numChannels = 1;
    res.res.pitch2D.width = 3;
    res.res.pitch2D.height = 2;
    res.res.pitch2D.pitchInBytes = pitch;
    memset(&td, 0, sizeof td);
    CHECK(cuTexObjectCreate(&tex, &res, &td, NULL));
    float pts[3][2] = {{2.5f, 1.5f}, {0.5f, 0.5f}, {9.0f, 9.0f}};
    CHECK(cuMemcpyHtoD(d_at, pts, sizeof pts));
    n = 3;
    CHECK(cuLaunchKernel(sample, 1, 1, 1, 32, 1, 1, 0, NULL, sample_args, NULL));
    CHECK(cuMemcpyDtoH(out, d_out, 3 * sizeof out[0]));
    EXPECT(out[0][0] == 6 && out[1][0] == 1 && out[2][0] == 6 && out[0][3] == 1);
    CUDA_RESOURCE_DESC res_back;
    CHECK(cuTexObjectGetResourceDesc(&res_back, tex));
    EXPECT(res_back.resType == CU_RESOURCE_TYPE_PITCH2D && res_back.res.pitch2D.devPtr == pitched);
    CHECK(cuTexObjectDestroy(tex));
    printf("driver_textures: pitched 2D texture correct\n");

    /* A layered 2D short array, 3 layers of 5x2, read as integers. */
    enum { LW = 5, LH = 2, LAYERS = 3 };
    short layers[LAYERS][LH][LW];
    for (int l = 0; l < LAYERS; l++)
        for (int y = 0; y < LH; y++)
            for (int x = 0; x < LW; x++) layers[l][y][x] = (short)(-100 * l + 10 * y + x);
    CUDA_ARRAY3D_DESCRIPTOR ld = {LW, LH, LAYERS, CU_AD_FORMAT_SIGNED_INT16, 1,
                                  CUDA_ARRAY3D_LAYERED};
    CUarray layered_array;
    CHECK(cuArray3DCreate(&layered_array, &ld));
    CHECK(upload_3d(layered_array, layers, LW * sizeof(short), LH, LAYERS));
    res = array_resource(layered_array);
    memset(&td, 0, sizeof td);
    td.flags = CU_TRSF_READ_AS_INTEGER;
    CHECK(cuTexObjectCreate(&tex, &res, &td, NULL));
    int w = LW, nl = LAYERS;
    void *layered_args[] = {&tex, &d_out, &w, &nl};
    CHECK(cuLaunchKernel(layered, LAYERS, 1, 1, 32, 1, 1, 0, NULL, layered_args, NULL));
    short got_layers[LAYERS][LW];
    CHECK(cuMemcpyDtoH(got_layers, d_out, sizeof got_layers));
    for (int l = 0; l < LAYERS; l++)
        for (int x = 0; x < LW; x++) EXPECT(got_layers[l][x] == layers[l][1][x]);
    CHECK(cuTexObjectDestroy(tex));
    printf("driver_textures: layered integer reads correct\n");

    /* A 3D uint2 surface, incremented in place. */
    enum { SX = 3, SY = 2, SZ = 2 };
    unsigned int volume[SZ][SY][SX][2], after[SZ][SY][SX][2];
    for (int i = 0; i < SZ * SY * SX; i++) {
        (&volume[0][0][0])[i][0] = i;
        (&volume[0][0][0])[i][1] = 3 * i + 1;
    }
    CUDA_ARRAY3D_DESCRIPTOR sd = {SX, SY, SZ, CU_AD_FORMAT_UNSIGNED_INT32, 2,
                                  CUDA_ARRAY3D_SURFACE_LDST};
    CUarray surface_array;
    CHECK(cuArray3DCreate(&surface_array, &sd));
    CHECK(upload_3d(surface_array, volume, sizeof volume[0][0], SY, SZ));
    res = array_resource(surface_array);
    CUsurfObject surf;
    CHECK(cuSurfObjectCreate(&surf, &res));
    int sx = SX, sy = SY, sz = SZ;
    void *increment_args[] = {&surf, &sx, &sy, &sz};
    CHECK(cuLaunchKernel(increment, SZ, 1, 1, SX, SY, 1, 0, NULL, increment_args, NULL));
    CUDA_MEMCPY3D outcopy = {0};
    outcopy.srcMemoryType = CU_MEMORYTYPE_ARRAY; outcopy.srcArray = surface_array;
    outcopy.dstMemoryType = CU_MEMORYTYPE_HOST; outcopy.dstHost = after;
    outcopy.WidthInBytes = sizeof volume[0][0]; outcopy.Height = SY; outcopy.Depth = SZ;
    CHECK(cuMemcpy3D(&outcopy));
    for (int i = 0; i < SZ * SY * SX; i++)
        EXPECT((&after[0][0][0])[i][0] == (unsigned)i + 1 &&
               (&after[0][0][0])[i][1] == (3u * i + 1) * 2);
    CHECK(cuSurfObjectDestroy(surf));
    printf("driver_textures: 3D surface updated in place\n");

    /* Misuse. */
    CUsurfObject refused;
    res.res.array.hArray = array; /* created without CUDA_ARRAY3D_SURFACE_LDST */
    EXPECT(cuSurfObjectCreate(&refused, &res) == CUDA_ERROR_INVALID_VALUE);
    CUDA_ARRAY_DESCRIPTOR bad = {4, 4, CU_AD_FORMAT_FLOAT, 3};
    CUarray never;
    EXPECT(cuArrayCreate(&never, &bad) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuTexObjectDestroy(tex) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuArrayDestroy(array));
    EXPECT(cuArrayDestroy(array) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuArrayDestroy(layered_array));
    CHECK(cuArrayDestroy(surface_array));
    CHECK(cuCtxDestroy(ctx));
    printf("driver_textures: all checks passed\n");
    return 0;
}
