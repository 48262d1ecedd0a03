// Textures, surfaces and CUDA arrays through the runtime API, checked against sampling
// computed on the host: a 2D float array sampled with point and linear filtering, a uchar4
// array read as normalized floats with wrapped normalized coordinates, tex1Dfetch from linear
// memory, a 3D array filled with cudaMemcpy3D, a layered array, a cubemap, a mipmapped array
// sampled at levels of detail, a surface written by a kernel and read back, and the errors of
// misuse.
#include <cmath>
#include "check.cuh"

__global__ void sample2d(cudaTextureObject_t t, const float2 *at, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2D<float>(t, at[i].x, at[i].y);
}

__global__ void sample_rgba(cudaTextureObject_t t, const float *u, float4 *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2D<float4>(t, u[i], 0.25f);
}

__global__ void fetch_linear(cudaTextureObject_t t, int2 *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int2>(t, i * 3 - 1);
}

__global__ void sample3d(cudaTextureObject_t t, float *out, int w, int h, int d) {
    int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
    out[(z * h + y) * w + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}

__global__ void sample_layers(cudaTextureObject_t t, float *out, int w, int layers) {
    int x = threadIdx.x, layer = blockIdx.x;
    if (x < w && layer < layers) out[layer * w + x] = tex1DLayered<float>(t, x + 0.5f, layer);
}

__global__ void sample_cubemap(cudaTextureObject_t t, const float3 *dir, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = texCubemap<float>(t, dir[i].x, dir[i].y, dir[i].z);
}

__global__ void sample_lod(cudaTextureObject_t t, const float *lod, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2DLod<float>(t, 0.3f, 0.6f, lod[i]);
}

__global__ void blur_into_surface(cudaTextureObject_t t, cudaSurfaceObject_t s, int w, int h) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) {
        float sum = tex2D<float>(t, x - 0.5f, y + 0.5f) + tex2D<float>(t, x + 1.5f, y + 0.5f);
        surf2Dwrite(sum, s, x * (int)sizeof(float), y);
    }
}

static float clamp_at(const float *image, int w, int h, int x, int y) {
    x = x < 0 ? 0 : x >= w ? w - 1 : x;
    y = y < 0 ? 0 : y >= h ? h - 1 : y;
    return image[y * w + x];
}

static float host_linear(const float *image, int w, int h, float x, float y) {
    float xb = x - 0.5f, yb = y - 0.5f;
    int x0 = (int)floorf(xb), y0 = (int)floorf(yb);
    float a = xb - x0, b = yb - y0;
    return (1 - a) * (1 - b) * clamp_at(image, w, h, x0, y0) +
           a * (1 - b) * clamp_at(image, w, h, x0 + 1, y0) +
           (1 - a) * b * clamp_at(image, w, h, x0, y0 + 1) +
           a * b * clamp_at(image, w, h, x0 + 1, y0 + 1);
}

// The texel a point-sampled cubemap fetch reads (the programming guide's cubemap table).
static float host_cubemap(const float *faces, int size, float x, float y, float z) {
    float ax = fabsf(x), ay = fabsf(y), az = fabsf(z), s, t, m;
    int face;
    if (ax >= ay && ax >= az) { face = x >= 0 ? 0 : 1; s = x >= 0 ? -z : z; t = -y; m = ax; }
    else if (ay >= az) { face = y >= 0 ? 2 : 3; s = x; t = y >= 0 ? z : -z; m = ay; }
    else { face = z >= 0 ? 4 : 5; s = z >= 0 ? x : -x; t = -y; m = az; }
    int u = (int)floorf((s / m + 1) / 2 * size), v = (int)floorf((t / m + 1) / 2 * size);
    u = u < 0 ? 0 : u >= size ? size - 1 : u;
    v = v < 0 ? 0 : v >= size ? size - 1 : v;
    return faces[(face * size + v) * size + u];
}

static cudaTextureObject_t texture_of(cudaArray_t array, cudaTextureFilterMode filter,
                                      cudaTextureAddressMode mode, int normalized,
                                      cudaTextureReadMode read) {
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    cudaTextureDesc tex = {};
    tex.addressMode[0] = tex.addressMode[1] = tex.addressMode[2] = mode;
    tex.filterMode = filter;
    tex.readMode = read;
    tex.normalizedCoords = normalized;
    cudaTextureObject_t object = 0;
    CHECK(cudaCreateTextureObject(&object, &res, &tex, nullptr));
    return object;
}

int main() {
    const int W = 16, H = 8, N = 6;
    float image[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) image[y][x] = (float)(y * 100 + x * x);

    // 2D float array: point and linear filtering, clamped.
    cudaChannelFormatDesc float1 = cudaCreateChannelDesc<float>();
    cudaArray_t array;
    CHECK(cudaMallocArray(&array, &float1, W, H));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, image, W * sizeof(float), W * sizeof(float), H,
                              cudaMemcpyHostToDevice));
    float2 at[N] = {{0.5f, 0.5f}, {3.25f, 2.75f}, {15.9f, 7.5f}, {-3.f, 4.f}, {8.f, 20.f},
                    {7.5f, 0.0f}};
    float2 *d_at;
    float *d_out;
    CHECK(cudaMalloc(&d_at, sizeof at));
    CHECK(cudaMalloc(&d_out, 1024 * sizeof(float)));
    CHECK(cudaMemcpy(d_at, at, sizeof at, cudaMemcpyHostToDevice));
    float out[1024];
    for (int filter = 0; filter < 2; filter++) {
        cudaTextureObject_t t = texture_of(array, (cudaTextureFilterMode)filter,
                                           cudaAddressModeClamp, 0, cudaReadModeElementType);
        sample2d<<<1, 32>>>(t, d_at, d_out, N);
        CHECK(cudaMemcpy(out, d_out, N * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) {
            float expected = filter ? host_linear(&image[0][0], W, H, at[i].x, at[i].y)
                                    : clamp_at(&image[0][0], W, H, (int)floorf(at[i].x),
                                               (int)floorf(at[i].y));
            if (fabsf(out[i] - expected) > 1e-3f * fmaxf(1.f, fabsf(expected))) {
                fprintf(stderr, "filter %d point %d: %f, expected %f\n", filter, i, out[i],
                        expected);
                return 1;
            }
        }
        CHECK(cudaDestroyTextureObject(t));
    }
    printf("textures: 2D point and linear sampling correct\n");

    // uchar4 read as normalized floats, normalized coordinates wrapping around.
    const int RW = 4;
    uchar4 rgba[2][RW];
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < RW; x++)
            rgba[y][x] = make_uchar4(x * 60, 255 - x * 60, y * 100, 255);
    cudaChannelFormatDesc uchar4_desc = cudaCreateChannelDesc<uchar4>();
    cudaArray_t rgba_array;
    CHECK(cudaMallocArray(&rgba_array, &uchar4_desc, RW, 2));
    CHECK(cudaMemcpy2DToArray(rgba_array, 0, 0, rgba, sizeof rgba[0], sizeof rgba[0], 2,
                              cudaMemcpyHostToDevice));
    cudaTextureObject_t rt = texture_of(rgba_array, cudaFilterModePoint, cudaAddressModeWrap, 1,
                                        cudaReadModeNormalizedFloat);
    float u[N] = {0.1f, 0.3f, 0.6f, 0.9f, 1.1f, -0.1f};
    float *d_u;
    float4 *d_rgba;
    CHECK(cudaMalloc(&d_u, sizeof u));
    CHECK(cudaMalloc(&d_rgba, N * sizeof(float4)));
    CHECK(cudaMemcpy(d_u, u, sizeof u, cudaMemcpyHostToDevice));
    sample_rgba<<<1, 32>>>(rt, d_u, d_rgba, N);
    float4 colours[N];
    CHECK(cudaMemcpy(colours, d_rgba, sizeof colours, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) {
        int x = ((int)floorf(u[i] * RW) % RW + RW) % RW;
        uchar4 c = rgba[0][x];
        EXPECT(fabsf(colours[i].x - c.x / 255.f) < 1e-6f && fabsf(colours[i].y - c.y / 255.f) <
               1e-6f && colours[i].z == 0.f && colours[i].w == 1.f);
    }
    printf("textures: normalized reads with wrapped coordinates correct\n");

    // tex1Dfetch from linear memory (int2 texels); out of range clamps.
    int2 pairs[10];
    for (int i = 0; i < 10; i++) pairs[i] = make_int2(i, -i * 7);
    int2 *d_pairs, *d_fetched;
    CHECK(cudaMalloc(&d_pairs, sizeof pairs));
    CHECK(cudaMalloc(&d_fetched, 5 * sizeof(int2)));
    CHECK(cudaMemcpy(d_pairs, pairs, sizeof pairs, cudaMemcpyHostToDevice));
    cudaResourceDesc linear = {};
    linear.resType = cudaResourceTypeLinear;
    linear.res.linear.devPtr = d_pairs;
    linear.res.linear.desc = cudaCreateChannelDesc<int2>();
    linear.res.linear.sizeInBytes = sizeof pairs;
    cudaTextureDesc plain = {};
    plain.readMode = cudaReadModeElementType;
    cudaTextureObject_t lt;
    CHECK(cudaCreateTextureObject(&lt, &linear, &plain, nullptr));
    fetch_linear<<<1, 32>>>(lt, d_fetched, 5);
    int2 fetched[5];
    CHECK(cudaMemcpy(fetched, d_fetched, sizeof fetched, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 5; i++) {
        int k = i * 3 - 1 < 0 ? 0 : i * 3 - 1 > 9 ? 9 : i * 3 - 1;
        EXPECT(fetched[i].x == pairs[k].x && fetched[i].y == pairs[k].y);
    }
    printf("textures: tex1Dfetch from linear memory correct\n");

    // A 3D array through cudaMemcpy3D, and back.
    const int X = 5, Y = 4, Z = 3;
    float volume[Z][Y][X], back[Z][Y][X];
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < X; x++) volume[z][y][x] = z * 1000.f + y * 10.f + x;
    cudaArray_t volume_array;
    CHECK(cudaMalloc3DArray(&volume_array, &float1, make_cudaExtent(X, Y, Z)));
    cudaMemcpy3DParms up = {};
    up.srcPtr = make_cudaPitchedPtr(volume, X * sizeof(float), X, Y);
    up.dstArray = volume_array;
    up.extent = make_cudaExtent(X, Y, Z);
    up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&up));
    cudaTextureObject_t vt = texture_of(volume_array, cudaFilterModePoint, cudaAddressModeClamp,
                                        0, cudaReadModeElementType);
    sample3d<<<Z, dim3(X, Y)>>>(vt, d_out, X, Y, Z);
    CHECK(cudaMemcpy(out, d_out, X * Y * Z * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(memcmp(out, volume, sizeof volume) == 0);
    cudaMemcpy3DParms down = {};
    down.srcArray = volume_array;
    down.dstPtr = make_cudaPitchedPtr(back, X * sizeof(float), X, Y);
    down.extent = make_cudaExtent(X, Y, Z);
    down.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&down));
    EXPECT(memcmp(back, volume, sizeof volume) == 0);
    cudaChannelFormatDesc got;
    cudaExtent extent;
    unsigned int flags;
    CHECK(cudaArrayGetInfo(&got, &extent, &flags, volume_array));
    EXPECT(got.x == 32 && got.y == 0 && got.f == cudaChannelFormatKindFloat);
    EXPECT(extent.width == X && extent.height == Y && extent.depth == Z && flags == 0);
    printf("textures: 3D array copies and sampling correct\n");

    // A layered 1D array: each layer its own row.
    const int LW = 6, LAYERS = 3;
    float rows[LAYERS][LW];
    for (int l = 0; l < LAYERS; l++)
        for (int x = 0; x < LW; x++) rows[l][x] = l * 10.f - x;
    cudaArray_t layered;
    CHECK(cudaMalloc3DArray(&layered, &float1, make_cudaExtent(LW, 0, LAYERS),
                            cudaArrayLayered));
    cudaMemcpy3DParms fill = {};
    fill.srcPtr = make_cudaPitchedPtr(rows, LW * sizeof(float), LW, 1);
    fill.dstArray = layered;
    fill.extent = make_cudaExtent(LW, 1, LAYERS);
    fill.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&fill));
    cudaTextureObject_t lyt = texture_of(layered, cudaFilterModePoint, cudaAddressModeClamp, 0,
                                         cudaReadModeElementType);
    sample_layers<<<LAYERS, 32>>>(lyt, d_out, LW, LAYERS);
    CHECK(cudaMemcpy(out, d_out, sizeof rows, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(out, rows, sizeof rows) == 0);
    printf("textures: layered array correct\n");

    // A cubemap: six 4x4 faces, sampled along directions towards each face and in between.
    const int C = 4, D = 8;
    float faces[6][C][C];
    for (int f = 0; f < 6; f++)
        for (int v = 0; v < C; v++)
            for (int u = 0; u < C; u++) faces[f][v][u] = f * 100.f + v * 10.f + u;
    cudaArray_t cube;
    CHECK(cudaMalloc3DArray(&cube, &float1, make_cudaExtent(C, C, 6), cudaArrayCubemap));
    cudaMemcpy3DParms cube_up = {};
    cube_up.srcPtr = make_cudaPitchedPtr(faces, C * sizeof(float), C, C);
    cube_up.dstArray = cube;
    cube_up.extent = make_cudaExtent(C, C, 6);
    cube_up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&cube_up));
    cudaTextureObject_t ct = texture_of(cube, cudaFilterModePoint, cudaAddressModeClamp, 1,
                                        cudaReadModeElementType);
    float3 dirs[D] = {{1, 0.3f, -0.2f}, {-1, -0.6f, 0.1f}, {0.2f, 1, 0.7f}, {0.4f, -1, -0.3f},
                      {-0.5f, 0.1f, 1}, {0.9f, -0.2f, -1}, {0.25f, -0.5f, 0.75f},
                      {-2, 1.5f, 0.5f}};
    float3 *d_dirs;
    CHECK(cudaMalloc(&d_dirs, sizeof dirs));
    CHECK(cudaMemcpy(d_dirs, dirs, sizeof dirs, cudaMemcpyHostToDevice));
    sample_cubemap<<<1, 32>>>(ct, d_dirs, d_out, D);
    CHECK(cudaMemcpy(out, d_out, D * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < D; i++)
        if (out[i] != host_cubemap(&faces[0][0][0], C, dirs[i].x, dirs[i].y, dirs[i].z)) {
            fprintf(stderr, "direction %d: %f, expected %f\n", i, out[i],
                    host_cubemap(&faces[0][0][0], C, dirs[i].x, dirs[i].y, dirs[i].z));
            return 1;
        }
    printf("textures: cubemap faces correct\n");

    // A mipmapped array of 4 levels (8x8 down to 1x1): level k's texel (x, y) = 100k + 10y
    // + x; sampled at levels of detail with the nearest level and between two levels.
    const int LEVELS = 4, M = 6;
    cudaMipmappedArray_t mipmapped;
    CHECK(cudaMallocMipmappedArray(&mipmapped, &float1, make_cudaExtent(8, 8, 0), LEVELS));
    for (int k = 0; k < LEVELS; k++) {
        int size = 8 >> k;
        float level[8][8];
        for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++) level[y][x] = 100.f * k + 10.f * y + x;
        cudaArray_t level_array;
        CHECK(cudaGetMipmappedArrayLevel(&level_array, mipmapped, k));
        CHECK(cudaMemcpy2DToArray(level_array, 0, 0, level, sizeof level[0],
                                  size * sizeof(float), size, cudaMemcpyHostToDevice));
    }
    float lods[M] = {0.25f, 0.75f, 2.25f, 9.f, -1.f, 1.5f};  // fractions 8-bit weights hold
    float *d_lods;
    CHECK(cudaMalloc(&d_lods, sizeof lods));
    CHECK(cudaMemcpy(d_lods, lods, sizeof lods, cudaMemcpyHostToDevice));
    cudaResourceDesc mip_res = {};
    mip_res.resType = cudaResourceTypeMipmappedArray;
    mip_res.res.mipmap.mipmap = mipmapped;
    for (int mip_linear = 0; mip_linear < 2; mip_linear++) {
        cudaTextureDesc mip_tex = {};
        mip_tex.normalizedCoords = 1;
        mip_tex.filterMode = cudaFilterModePoint;
        mip_tex.mipmapFilterMode = mip_linear ? cudaFilterModeLinear : cudaFilterModePoint;
        mip_tex.maxMipmapLevelClamp = LEVELS - 1;
        cudaTextureObject_t mt;
        CHECK(cudaCreateTextureObject(&mt, &mip_res, &mip_tex, nullptr));
        sample_lod<<<1, 32>>>(mt, d_lods, d_out, M);
        CHECK(cudaMemcpy(out, d_out, M * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < M; i++) {
            float lod = fminf(fmaxf(lods[i], 0.f), LEVELS - 1.f);
            int low = (int)floorf(lod), high = low + 1 < LEVELS ? low + 1 : low;
            float w = mip_linear ? lod - low : 0.f;
            if (!mip_linear) low = high = (int)floorf(lod + 0.5f);
            float at_low = 100.f * low + 10.f * floorf(0.6f * (8 >> low)) +
                           floorf(0.3f * (8 >> low));
            float at_high = 100.f * high + 10.f * floorf(0.6f * (8 >> high)) +
                            floorf(0.3f * (8 >> high));
            float expected = (1 - w) * at_low + w * at_high;
            if (fabsf(out[i] - expected) > 1e-4f) {
                fprintf(stderr, "mip filter %d lod %f: %f, expected %f\n", mip_linear, lods[i],
                        out[i], expected);
                return 1;
            }
        }
        CHECK(cudaDestroyTextureObject(mt));
    }
    CHECK(cudaFreeMipmappedArray(mipmapped));
    printf("textures: mipmap levels of detail correct\n");

    // A surface written by a kernel from a texture, read back with cudaMemcpy2DFromArray.
    cudaArray_t target;
    CHECK(cudaMallocArray(&target, &float1, W, H, cudaArraySurfaceLoadStore));
    cudaResourceDesc surface_res = {};
    surface_res.resType = cudaResourceTypeArray;
    surface_res.res.array.array = target;
    cudaSurfaceObject_t surface;
    CHECK(cudaCreateSurfaceObject(&surface, &surface_res));
    cudaTextureObject_t pt = texture_of(array, cudaFilterModePoint, cudaAddressModeClamp, 0,
                                        cudaReadModeElementType);
    blur_into_surface<<<H, 32>>>(pt, surface, W, H);
    float blurred[H][W];
    CHECK(cudaMemcpy2DFromArray(blurred, W * sizeof(float), target, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            EXPECT(blurred[y][x] == clamp_at(&image[0][0], W, H, x - 1, y) +
                                        clamp_at(&image[0][0], W, H, x + 1, y));
    printf("textures: surface writes correct\n");

    // Misuse: a surface over an array without the flag, a bad channel description,
    // destroying an object twice.
    cudaSurfaceObject_t refused;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaCreateSurfaceObject(&refused, &linear));
    cudaResourceDesc no_ldst = surface_res;
    no_ldst.res.array.array = array;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaCreateSurfaceObject(&refused, &no_ldst));
    cudaChannelFormatDesc odd = cudaCreateChannelDesc(8, 16, 0, 0, cudaChannelFormatKindUnsigned);
    cudaArray_t never;
    EXPECT_ERROR(cudaErrorInvalidChannelDescriptor, cudaMallocArray(&never, &odd, 4, 4));
    CHECK(cudaDestroySurfaceObject(surface));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaDestroySurfaceObject(surface));
    CHECK(cudaGetLastError() == cudaErrorInvalidValue ? cudaSuccess : cudaErrorUnknown);
    CHECK(cudaFreeArray(target));
    CHECK(cudaFreeArray(array));
    printf("textures: misuse refused with CUDA's errors\n");
    return 0;
}
