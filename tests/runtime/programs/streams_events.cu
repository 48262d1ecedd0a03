// Several streams with events: work on three streams, a fourth step on stream 0 that waits
// (cudaStreamWaitEvent) for the other two, a consumer on one stream reading what a slow
// producer on another wrote (after a wait on its event), the host reading page-locked memory
// once an event says the copy into it is done, timing events, queries, the per-thread and
// legacy default streams. What is checked is results: a missing wait gives wrong ones.
#include "check.cuh"

__global__ void scale(float *v, float factor, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] *= factor;
}

// Writes v[i] = i + 1 after a delay (a computation kept in `busy`) long enough that a
// consumer not waiting for it would read the zeros before them.
__global__ void produce(int *v, unsigned *busy, int n, int rounds)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned t = i;
    for (int r = 0; r < rounds; ++r)
        t = t * 1664525u + 1013904223u;
    if (i < n) {
        busy[i] = t;
        v[i] = i + 1;
    }
}

__global__ void consume(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = 2 * in[i];
}

__global__ void combine(float *out, const float *a, const float *b, const float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a[i] + b[i] + c[i];
}

int main()
{
    const int n = 256, streams = 3;
    float *host, *device[streams], *out;
    CHECK(cudaMallocHost(&host, streams * n * sizeof(float)));
    CHECK(cudaMalloc(&out, n * sizeof(float)));
    for (int i = 0; i < streams * n; ++i)
        host[i] = (float)(i % n);

    cudaStream_t stream[streams];
    CHECK(cudaStreamCreate(&stream[0]));
    CHECK(cudaStreamCreateWithFlags(&stream[1], cudaStreamNonBlocking));
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(cudaStreamCreateWithPriority(&stream[2], cudaStreamDefault, greatest));
    int priority;
    unsigned flags;
    CHECK(cudaStreamGetPriority(stream[2], &priority));
    EXPECT(priority == greatest);
    CHECK(cudaStreamGetFlags(stream[1], &flags));
    EXPECT(flags == cudaStreamNonBlocking);
    int stream_device = -1;
    CHECK(cudaStreamGetDevice(stream[0], &stream_device));
    EXPECT(stream_device == 0);
    cudaStreamCaptureStatus capture;
    CHECK(cudaStreamIsCapturing(stream[0], &capture));
    EXPECT(capture == cudaStreamCaptureStatusNone);

    cudaEvent_t start, stop, done[streams];
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
    for (int s = 0; s < streams; ++s)
        CHECK(cudaEventCreateWithFlags(&done[s], cudaEventDisableTiming));

    CHECK(cudaEventRecord(start, stream[0]));
    for (int s = 0; s < streams; ++s) {
        CHECK(cudaMalloc(&device[s], n * sizeof(float)));
        CHECK(cudaMemcpyAsync(device[s], host + s * n, n * sizeof(float),
                              cudaMemcpyHostToDevice, stream[s]));
        scale<<<(n + 63) / 64, 64, 0, stream[s]>>>(device[s], (float)(s + 1), n);
        CHECK(cudaEventRecord(done[s], stream[s]));
    }
    CHECK(cudaStreamWaitEvent(stream[0], done[1], 0));
    CHECK(cudaStreamWaitEvent(stream[0], done[2], 0));
    combine<<<(n + 63) / 64, 64, 0, stream[0]>>>(out, device[0], device[1], device[2], n);
    CHECK(cudaMemcpyAsync(host, out, n * sizeof(float), cudaMemcpyDeviceToHost, stream[0]));
    CHECK(cudaEventRecord(stop, stream[0]));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventQuery(stop));
    CHECK(cudaStreamQuery(stream[1]));
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    EXPECT(ms > 0.0f);  // the events were stamped when the work between them ran
    EXPECT_ERROR(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, done[0], stop));
    for (int i = 0; i < n; ++i)
        EXPECT(host[i] == 6.0f * i);

    // A producer on stream 1, a consumer on stream 2 that waits for it; the host reads the
    // consumer's results from page-locked memory once the event after the copy is done.
    {
        int *produced, *consumed, *seen;
        cudaEvent_t made, copied;
        CHECK(cudaMalloc(&produced, n * sizeof(int)));
        CHECK(cudaMalloc(&consumed, n * sizeof(int)));
        CHECK(cudaMallocHost(&seen, n * sizeof(int)));
        CHECK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
        for (int i = 0; i < n; ++i)
            seen[i] = -1;
        CHECK(cudaMemsetAsync(produced, 0, n * sizeof(int), stream[1]));
        produce<<<(n + 63) / 64, 64, 0, stream[1]>>>(produced, (unsigned *)consumed, n, 2000);
        CHECK(cudaEventRecord(made, stream[1]));
        CHECK(cudaStreamWaitEvent(stream[2], made, 0));
        consume<<<(n + 63) / 64, 64, 0, stream[2]>>>(produced, consumed, n);
        CHECK(cudaMemcpyAsync(seen, consumed, n * sizeof(int), cudaMemcpyDeviceToHost,
                              stream[2]));
        CHECK(cudaEventRecord(copied, stream[2]));
        CHECK(cudaEventSynchronize(copied));
        for (int i = 0; i < n; ++i)
            EXPECT(seen[i] == 2 * (i + 1));
        CHECK(cudaEventDestroy(made));
        CHECK(cudaEventDestroy(copied));
        CHECK(cudaFreeHost(seen));
        CHECK(cudaFree(produced));
        CHECK(cudaFree(consumed));
    }

    // The per-thread and the legacy default streams take work like any other.
    scale<<<(n + 63) / 64, 64, 0, cudaStreamPerThread>>>(out, 2.0f, n);
    scale<<<(n + 63) / 64, 64, 0, cudaStreamLegacy>>>(out, 0.5f, n);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(cudaMemcpy(host, out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(host[i] == 6.0f * i);

    for (int s = 0; s < streams; ++s) {
        CHECK(cudaEventDestroy(done[s]));
        CHECK(cudaStreamDestroy(stream[s]));
        CHECK(cudaFree(device[s]));
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaFree(out));
    CHECK(cudaFreeHost(host));
    printf("streams_events: %d streams joined, elapsed time measured\n", streams);
    return 0;
}
