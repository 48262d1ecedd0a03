// Kernels of driver_textures.c (compiled to PTX by the test).
extern "C" __global__ void sample(cudaTextureObject_t t, const float2 *at, float4 *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2D<float4>(t, at[i].x, at[i].y);
}

extern "C" __global__ void layered(cudaTextureObject_t t, short *out, int w, int layers) {
    int x = threadIdx.x, layer = blockIdx.x;
    if (x < w) out[layer * w + x] = tex2DLayered<short>(t, x, 1, layer);
}

extern "C" __global__ void increment(cudaSurfaceObject_t s, int w, int h, int d) {
    int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
    if (x < w && y < h && z < d) {
        uint2 v = surf3Dread<uint2>(s, x * 8, y, z);
        surf3Dwrite(make_uint2(v.x + 1, v.y * 2), s, x * 8, y, z);
    }
}
