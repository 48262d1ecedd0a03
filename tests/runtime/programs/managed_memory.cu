// Managed memory through the runtime API: one pointer on host and device, with the contract
// of a device without concurrent managed access (host writes before a launch are what the
// kernel reads; kernel writes are what the host reads after synchronizing), __managed__
// variables, pointers stored in managed memory, copies and memsets, and CUDA's errors.
#include "check.cuh"
#include <cstring>

__managed__ int counter = 5;
__managed__ float weights[4];

struct Node {
    int value;
    Node *next;
};

__global__ void scale(int *data, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = data[i] * 2 + 1;
}

__global__ void sum_list(const Node *head, int *out)
{
    int total = 0;
    for (const Node *node = head; node; node = node->next)
        total += node->value;
    *out = total;
}

__global__ void weigh(const int *data, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(&counter, (int)(weights[i % 4]) * data[i]);
}

__global__ void fill_bytes(unsigned char *bytes, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        bytes[i] = (unsigned char)(bytes[i] + i % 251);
}

int main()
{
    int managed = -1, concurrent = -1;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(managed == 1 && prop.managedMemory == 1);
    EXPECT(concurrent == 0 && prop.concurrentManagedAccess == 0);
    printf("managed_memory: attributes say managed memory without concurrent access\n");

    // Host writes, a kernel, the host reads after synchronizing; twice over one pointer.
    const int n = 1000;
    int *data = nullptr;
    CHECK(cudaMallocManaged(&data, n * sizeof(int)));
    for (int i = 0; i < n; i++)
        data[i] = i;
    scale<<<(n + 255) / 256, 256>>>(data, n);
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++)
        EXPECT(data[i] == 2 * i + 1);
    for (int i = 0; i < n; i += 2)
        data[i] = -i;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    scale<<<(n + 255) / 256, 256, 0, stream>>>(data, n);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; i++)
        EXPECT(data[i] == (i % 2 ? 2 * (2 * i + 1) + 1 : -2 * i + 1));
    printf("managed_memory: host and kernel writes seen across launches\n");

    // A linked list built by the host in managed memory, walked by a kernel.
    Node *nodes = nullptr;
    int *total = nullptr;
    CHECK(cudaMallocManaged(&nodes, 10 * sizeof(Node)));
    CHECK(cudaMallocManaged(&total, sizeof(int), cudaMemAttachHost));
    for (int i = 0; i < 10; i++)
        nodes[i] = Node{i * i, i + 1 < 10 ? &nodes[i + 1] : nullptr};
    CHECK(cudaStreamAttachMemAsync(stream, total, 0, cudaMemAttachSingle));
    sum_list<<<1, 1, 0, stream>>>(nodes, total);
    cudaEvent_t done;
    CHECK(cudaEventCreate(&done));
    CHECK(cudaEventRecord(done, stream));
    CHECK(cudaEventSynchronize(done));
    EXPECT(*total == 285);
    printf("managed_memory: pointers stored in managed memory work on the device\n");

    // __managed__ variables: their initial value, host writes, kernel atomics.
    EXPECT(counter == 5);
    for (int i = 0; i < 4; i++)
        weights[i] = (float)(i + 1);
    counter = 0;
    for (int i = 0; i < n; i++)
        data[i] = 1;
    weigh<<<(n + 255) / 256, 256>>>(data, n);
    CHECK(cudaDeviceSynchronize());
    EXPECT(counter == 250 * (1 + 2 + 3 + 4));
    int *counter_address = nullptr;
    CHECK(cudaGetSymbolAddress((void **)&counter_address, counter));
    EXPECT(counter_address == &counter);
    printf("managed_memory: __managed__ variables shared by host and device\n");

    // Copies and memsets to and from managed memory, and a kernel over a large allocation.
    int host[8];
    CHECK(cudaMemcpy(host, data, sizeof(host), cudaMemcpyDefault));
    EXPECT(host[0] == 1 && host[7] == 1);
    int *device_buffer = nullptr;
    CHECK(cudaMalloc(&device_buffer, sizeof(host)));
    for (int i = 0; i < 8; i++)
        host[i] = 100 + i;
    CHECK(cudaMemcpy(device_buffer, host, sizeof(host), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(data, device_buffer, sizeof(host), cudaMemcpyDeviceToDevice));
    EXPECT(data[0] == 100 && data[7] == 107 && data[8] == 1);
    CHECK(cudaMemset(data, 0, 4 * sizeof(int)));
    EXPECT(data[0] == 0 && data[3] == 0 && data[4] == 104);
    const size_t big = 3 << 20;
    unsigned char *bytes = nullptr;
    CHECK(cudaMallocManaged(&bytes, big));
    memset(bytes, 7, big);
    fill_bytes<<<(unsigned)((big + 255) / 256), 256>>>(bytes, big);
    CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < big; i += 4093)
        EXPECT(bytes[i] == (unsigned char)(7 + i % 251));
    EXPECT(bytes[big - 1] == (unsigned char)(7 + (big - 1) % 251));
    printf("managed_memory: copies, memsets and a 3 MiB allocation correct\n");

    // What CUDA says about pointers, advice, prefetches and attachments.
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, data + 3));
    EXPECT(attributes.type == cudaMemoryTypeManaged);
    EXPECT(attributes.devicePointer == data + 3 && attributes.hostPointer == data + 3);
    CHECK(cudaMemAdvise(data, n * sizeof(int), cudaMemAdviseSetReadMostly, {}));
    int read_mostly = 0;
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof(int), cudaMemRangeAttributeReadMostly,
                                   data, n * sizeof(int)));
    EXPECT(read_mostly == 1);
    cudaMemLocation device0 = {cudaMemLocationTypeDevice, 0};
    EXPECT_ERROR(cudaErrorInvalidDevice, cudaMemPrefetchAsync(data, 64, device0, 0, stream));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMemAdvise(device_buffer, 8, cudaMemAdviseSetReadMostly,
                                                      {}));
    void *none = &host;  // NVIDIA's runtime answers 0 bytes as cudaMalloc does: NULL
    CHECK(cudaMallocManaged(&none, 0));
    EXPECT(none == nullptr);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaMallocManaged(&none, 64, 4));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaStreamAttachMemAsync(0, total, 0, cudaMemAttachSingle));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaStreamAttachMemAsync(stream, device_buffer, 0,
                                                                 cudaMemAttachGlobal));
    CHECK(cudaFree(data));
    CHECK(cudaPointerGetAttributes(&attributes, data));
    EXPECT(attributes.type == cudaMemoryTypeUnregistered);
    CHECK(cudaFree(nodes));
    CHECK(cudaFree(total));
    CHECK(cudaFree(bytes));
    CHECK(cudaFree(device_buffer));
    printf("managed_memory: misuse refused with CUDA's errors\n");
    return 0;
}
