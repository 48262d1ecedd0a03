// Several devices through the runtime API (run on `vgpu server --devices 2`): each device
// gets its own buffer and kernel through cudaSetDevice, a kernel on device 0 reads device 1's
// memory once peer access is enabled, peer copies move data between them, and misuse gets
// CUDA's errors. Results are checked against values computed here.
#include "check.cuh"
#include <cstring>
#include <thread>

__global__ void fill(int *data, int n, int base)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = base + i;
}

__global__ void add_peer(int *mine, const int *theirs, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        mine[i] += theirs[i];
}

int main()
{
    const int n = 500;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count == 2);
    cudaDeviceProp props[2];
    CHECK(cudaGetDeviceProperties(&props[0], 0));
    CHECK(cudaGetDeviceProperties(&props[1], 1));
    EXPECT(props[0].pciBusID != props[1].pciBusID);
    EXPECT(memcmp(&props[0].uuid, &props[1].uuid, sizeof props[0].uuid) != 0);
    printf("multi_device: 2 devices told apart\n");

    int *buffers[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        int current = -1;
        CHECK(cudaGetDevice(&current));
        EXPECT(current == d);
        CHECK(cudaMalloc(&buffers[d], n * sizeof(int)));
        fill<<<(n + 127) / 128, 128>>>(buffers[d], n, 1000 * (d + 1));
        CHECK(cudaGetLastError());
        cudaPointerAttributes attributes;
        CHECK(cudaPointerGetAttributes(&attributes, buffers[d]));
        EXPECT(attributes.device == d);
    }
    // The current device is the calling thread's own.
    int other_thread_device = -1;
    std::thread other([&] {
        CHECK(cudaGetDevice(&other_thread_device));
        CHECK(cudaSetDevice(0));
    });
    other.join();
    int current = -1;
    CHECK(cudaGetDevice(&current));
    EXPECT(other_thread_device == 0 && current == 1);
    cudaStream_t stream1;
    CHECK(cudaStreamCreate(&stream1));  // on device 1, the current one
    int stream_device = -1;
    CHECK(cudaStreamGetDevice(stream1, &stream_device));
    EXPECT(stream_device == 1);
    CHECK(cudaDeviceSynchronize());

    int can = -1;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
    EXPECT(can == 1);
    CHECK(cudaDeviceCanAccessPeer(&can, 1, 1));
    EXPECT(can == 0);
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    EXPECT_ERROR(cudaErrorPeerAccessAlreadyEnabled, cudaDeviceEnablePeerAccess(1, 0));
    add_peer<<<(n + 127) / 128, 128>>>(buffers[0], buffers[1], n);
    int host[n];
    CHECK(cudaMemcpy(host, buffers[0], sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(host[i] == 3000 + 2 * i);
    printf("multi_device: a kernel on device 0 read device 1's memory\n");

    CHECK(cudaMemcpyPeer(buffers[1], 1, buffers[0], 0, 100 * sizeof(int)));
    CHECK(cudaMemcpy(host, buffers[1], sizeof host, cudaMemcpyDeviceToHost));
    EXPECT(host[0] == 3000 && host[99] == 3198 && host[100] == 2100);
    CHECK(cudaMemcpyPeerAsync(buffers[0], 0, buffers[1], 1, n * sizeof(int), stream1));
    CHECK(cudaStreamSynchronize(stream1));
    CHECK(cudaMemcpy(host, buffers[0], sizeof host, cudaMemcpyDeviceToHost));
    EXPECT(host[0] == 3000 && host[100] == 2100 && host[n - 1] == 2000 + n - 1);
    printf("multi_device: peer copies correct\n");

    CHECK(cudaDeviceDisablePeerAccess(1));
    EXPECT_ERROR(cudaErrorPeerAccessNotEnabled, cudaDeviceDisablePeerAccess(1));
    EXPECT_ERROR(cudaErrorPeerAccessUnsupported, cudaDeviceEnablePeerAccess(0, 0));
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaDeviceEnablePeerAccess(2, 0));
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaSetDevice(2));
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaMemcpyPeer(buffers[1], 5, buffers[0], 0, 4));
    int value = -1;
    CHECK(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrAccessSupported, 0, 1));
    EXPECT(value == 1);
    CHECK(cudaFree(buffers[0]));
    CHECK(cudaSetDevice(1));
    CHECK(cudaFree(buffers[1]));
    CHECK(cudaStreamDestroy(stream1));
    printf("multi_device: misuse refused with CUDA's errors\n");
    return 0;
}
