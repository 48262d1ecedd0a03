// Memory beyond the basics: pitched allocations and 2D copies and memsets, cudaMemcpyDefault
// in every direction, device-to-device copies, stream-ordered allocation from the pool,
// zero-byte requests, channel descriptions.
#include "check.cuh"

int main()
{
    const int width = 20, height = 6;  // a 20x6 matrix of ints
    int host[height][width], back[height][width];
    for (int r = 0; r < height; ++r)
        for (int c = 0; c < width; ++c)
            host[r][c] = r * 100 + c;
    int *pitched;
    size_t pitch = 0;
    CHECK(cudaMallocPitch((void **)&pitched, &pitch, width * sizeof(int), height));
    EXPECT(pitch >= width * sizeof(int));
    CHECK(cudaMemcpy2D(pitched, pitch, host, width * sizeof(int), width * sizeof(int), height,
                       cudaMemcpyHostToDevice));
    // Clear columns 2..5 of every row, then read the matrix back.
    CHECK(cudaMemset2D((char *)pitched + 2 * sizeof(int), pitch, 0, 4 * sizeof(int), height));
    CHECK(cudaMemcpy2D(back, width * sizeof(int), pitched, pitch, width * sizeof(int), height,
                       cudaMemcpyDeviceToHost));
    for (int r = 0; r < height; ++r)
        for (int c = 0; c < width; ++c)
            EXPECT(back[r][c] == (c >= 2 && c < 6 ? 0 : host[r][c]));
    // Host to host, pitched: columns 1..3 of every row into a 3-wide matrix.
    int narrow[height][3];
    CHECK(cudaMemcpy2D(narrow, 3 * sizeof(int), &host[0][1], width * sizeof(int),
                       3 * sizeof(int), height, cudaMemcpyHostToHost));
    for (int r = 0; r < height; ++r)
        for (int c = 0; c < 3; ++c)
            EXPECT(narrow[r][c] == host[r][c + 1]);
    // Rows wider than a pitch: NVIDIA's runtime reports an invalid value, not a pitch error.
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaMemcpy2D(back, 4, pitched, pitch, 8, 1, cudaMemcpyDeviceToHost));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGetLastError());
    // The async forms: fill column 0 with 0x7f bytes, copy one 3x2 block back.
    cudaStream_t copy_stream;
    CHECK(cudaStreamCreate(&copy_stream));
    CHECK(cudaMemset2DAsync(pitched, pitch, 0x7f, sizeof(int), height, copy_stream));
    int block[2][3];
    CHECK(cudaMemcpy2DAsync(block, 3 * sizeof(int), pitched, pitch, 3 * sizeof(int), 2,
                            cudaMemcpyDeviceToHost, copy_stream));
    CHECK(cudaStreamSynchronize(copy_stream));
    EXPECT(block[0][0] == 0x7f7f7f7f && block[1][0] == 0x7f7f7f7f);
    EXPECT(block[0][1] == 1 && block[1][1] == 101 && block[1][2] == 0);
    CHECK(cudaStreamDestroy(copy_stream));

    // cudaMemcpyDefault infers every direction; device-to-device copies.
    int *a, *b, values[64], out[64];
    for (int i = 0; i < 64; ++i)
        values[i] = i * i;
    CHECK(cudaMalloc(&a, sizeof(values)));
    CHECK(cudaMalloc(&b, sizeof(values)));
    CHECK(cudaMemcpy(a, values, sizeof(values), cudaMemcpyDefault));
    CHECK(cudaMemcpy(b, a, sizeof(values), cudaMemcpyDefault));
    CHECK(cudaMemset(a, 0, sizeof(values)));
    CHECK(cudaMemcpy(a + 32, b, 32 * sizeof(int), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(out, a, sizeof(out), cudaMemcpyDefault));
    for (int i = 0; i < 64; ++i)
        EXPECT(out[i] == (i < 32 ? 0 : (i - 32) * (i - 32)));
    CHECK(cudaMemset(b, 0x01, 8));
    CHECK(cudaMemcpy(out, b, 8, cudaMemcpyDeviceToHost));
    EXPECT(out[0] == 0x01010101 && out[1] == 0x01010101);

    // Stream-ordered allocation from the default pool.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int *pooled;
    CHECK(cudaMallocAsync(&pooled, sizeof(values), stream));
    CHECK(cudaMemcpyAsync(pooled, values, sizeof(values), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemsetAsync(pooled, 0, 4 * sizeof(int), stream));
    CHECK(cudaMemcpyAsync(out, pooled, sizeof(out), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    EXPECT(out[3] == 0 && out[4] == 16 && out[63] == 63 * 63);
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    unsigned long long used = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    EXPECT(used >= sizeof(values));
    CHECK(cudaFreeAsync(pooled, stream));
    CHECK(cudaMallocFromPoolAsync((void **)&pooled, 256, pool, stream));
    CHECK(cudaFreeAsync(pooled, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));

    // Zero bytes: NULL, and freeing NULL is fine.
    void *nothing = (void *)1;
    CHECK(cudaMalloc(&nothing, 0));
    EXPECT(nothing == NULL);
    CHECK(cudaFree(NULL));
    CHECK(cudaFreeHost(NULL));
    // Channel descriptions are host arithmetic: the template and the plain function.
    cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
    EXPECT(f4.x == 32 && f4.y == 32 && f4.z == 32 && f4.w == 32);
    EXPECT(f4.f == cudaChannelFormatKindFloat);
    cudaChannelFormatDesc u8 = cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindUnsigned);
    EXPECT(u8.x == 8 && u8.y == 0 && u8.z == 0 && u8.w == 0);
    EXPECT(u8.f == cudaChannelFormatKindUnsigned);
    cudaChannelFormatDesc s16 = cudaCreateChannelDesc<short2>();
    EXPECT(s16.x == 16 && s16.y == 16 && s16.z == 0 && s16.f == cudaChannelFormatKindSigned);
    // CUDA arrays are not supported: describing one is refused, not faked.
    cudaChannelFormatDesc described;
    EXPECT(cudaGetChannelDesc(&described, NULL) != cudaSuccess);
    cudaGetLastError();

    CHECK(cudaFree(pitched));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    printf("memory_api: pitched, default-direction and pooled memory correct\n");
    return 0;
}
