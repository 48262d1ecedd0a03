// What kernels do on the device side, checked against the host: dynamic parallelism (a parent
// launches children, which launch grandchildren; a tail launch runs after the parent's other
// children), device malloc/free and C++ new/delete on the heap cudaLimitMallocHeapSize sizes
// (fixed once such a kernel ran), virtual functions (calls through a register), recursion,
// and a cooperative launch whose blocks meet at grid.sync(). Built with -rdc=true -lcudadevrt.
#include <cooperative_groups.h>
#include "check.cuh"

namespace cg = cooperative_groups;

// ---- dynamic parallelism
__global__ void grandchild(int *out, int at) { out[at + threadIdx.x] += 1000; }

__global__ void child(int *out, int base)
{
    out[base + threadIdx.x] = base + threadIdx.x;
    if (threadIdx.x == 0) grandchild<<<1, 4>>>(out, base);
}

__global__ void after_children(int *out, int n, int *sum)
{
    int total = 0;  // runs after the parent's other children, and their children, are done
    for (int i = 0; i < n; i++) total += out[i];
    *sum = total;
}

__global__ void parent(int *out, int *sum)
{
    if (threadIdx.x == 0) {
        child<<<1, 8>>>(out, blockIdx.x * 8);
        if (blockIdx.x == 0) after_children<<<1, 1, 0, cudaStreamTailLaunch>>>(out, 32, sum);
    }
}

// ---- device heap
__global__ void allocate(int **slots, int count)
{
    int *block = (int *)malloc(count * sizeof(int));
    slots[threadIdx.x] = block;
    if (block)
        for (int i = 0; i < count; i++) block[i] = threadIdx.x * 100 + i;
}

__global__ void grab(int **slots, size_t bytes)
{
    int *block = (int *)malloc(bytes);
    if (block) block[bytes / sizeof(int) - 1] = 7;  // the whole block is usable
    slots[threadIdx.x] = block;
}

__global__ void sum_and_free(int **slots, int count, int *sums)
{
    int *block = slots[threadIdx.x];
    int total = 0;
    for (int i = 0; i < count; i++) total += block[i];
    sums[threadIdx.x] = total;
    free(block);  // malloc'd by an earlier launch
}

struct Node {
    int value;
    Node *next;
};

__global__ void linked_list(int *out, int n)
{
    Node *head = nullptr;
    for (int i = 1; i <= n; i++) head = new Node{i * (int)(threadIdx.x + 1), head};
    int total = 0;
    while (head) {
        total += head->value;
        Node *next = head->next;
        delete head;
        head = next;
    }
    int *scratch = new int[4];
    scratch[3] = total;
    out[threadIdx.x] = scratch[3];
    delete[] scratch;
}

// ---- virtual functions and recursion
struct Shape {
    __device__ virtual int area() const = 0;
    __device__ virtual ~Shape() {}
};
struct Square : Shape {
    int side;
    __device__ Square(int s) : side(s) {}
    __device__ int area() const override { return side * side; }
};
struct Rectangle : Shape {
    int w, h;
    __device__ Rectangle(int a, int b) : w(a), h(b) {}
    __device__ int area() const override { return w * h; }
};

__global__ void areas(int *out)
{
    int t = threadIdx.x;
    Shape *shape = t % 2 ? (Shape *)new Square(t) : (Shape *)new Rectangle(t, 3);
    out[t] = shape->area();
    delete shape;
}

__device__ __noinline__ int fibonacci(int n)
{
    return n < 2 ? n : fibonacci(n - 1) + fibonacci(n - 2);
}

__device__ __noinline__ int ackermann_sum(int depth, int *trail)
{
    int local[3] = {depth, depth * 2, depth * 3};  // a frame of its own per call
    if (depth == 0) return 0;
    int below = ackermann_sum(depth - 1, trail);
    trail[depth] = local[0] + local[1] + local[2];
    return below + local[2];
}

__global__ void recursion(int *fib, int *sums, int *trail)
{
    int t = threadIdx.x;
    fib[t] = fibonacci(t);
    sums[t] = ackermann_sum(t, trail + t * 16);
}

// ---- cooperative launch
__global__ void grid_sum(const int *in, int *partial, int *total, int n)
{
    cg::grid_group grid = cg::this_grid();
    int sum = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) sum += in[i];
    atomicAdd(&partial[blockIdx.x], sum);
    grid.sync();  // every block's partial sum is in
    if (grid.thread_rank() == 0) {
        int all = 0;
        for (int b = 0; b < gridDim.x; b++) all += partial[b];
        *total = all;
    }
    grid.sync();
    partial[blockIdx.x] = *total;  // each block reads what block 0 wrote
}

int main()
{
    // The device heap's size is the program's to set until a kernel that may malloc runs.
    size_t heap = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 1 << 20));
    CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
    EXPECT(heap == 1 << 20);

    // Dynamic parallelism.
    int *out, *sum;
    CHECK(cudaMalloc(&out, 32 * sizeof(int)));
    CHECK(cudaMalloc(&sum, sizeof(int)));
    parent<<<4, 2>>>(out, sum);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int host[32], total = 0, expected = 0;
    CHECK(cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&total, sum, sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; i++) {
        int want = i + ((i % 8) < 4 ? 1000 : 0);
        EXPECT(host[i] == want);
        expected += want;
    }
    EXPECT(total == expected);
    printf("device_side: children, grandchildren and a tail launch ran in order\n");

    // The device heap.
    int **slots, *sums;
    const int threads = 64, count = 100;
    CHECK(cudaMalloc(&slots, threads * sizeof(int *)));
    CHECK(cudaMalloc(&sums, threads * sizeof(int)));
    allocate<<<1, threads>>>(slots, count);
    CHECK(cudaGetLastError());
    EXPECT_ERROR(cudaErrorInvalidValue, cudaDeviceSetLimit(cudaLimitMallocHeapSize, 2 << 20));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGetLastError());  // and it was the last error
    sum_and_free<<<1, threads>>>(slots, count, sums);
    int got[threads];
    CHECK(cudaMemcpy(got, sums, sizeof(got), cudaMemcpyDeviceToHost));
    for (int t = 0; t < threads; t++) EXPECT(got[t] == t * 100 * count + count * (count - 1) / 2);
    int *pointers[threads];
    grab<<<1, threads>>>(slots, 256 << 10);  // a 1 MiB heap runs out
    CHECK(cudaMemcpy(pointers, slots, sizeof(pointers), cudaMemcpyDeviceToHost));
    int granted = 0;
    for (int t = 0; t < threads; t++) granted += pointers[t] != nullptr;
    EXPECT(granted >= 1 && granted <= 3);  // the rest got NULL
    linked_list<<<1, 32>>>(sums, 10);
    CHECK(cudaMemcpy(got, sums, 32 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int t = 0; t < 32; t++) EXPECT(got[t] == 55 * (t + 1));
    printf("device_side: malloc, free, new and delete on a 1 MiB heap\n");

    // Virtual functions and recursion.
    areas<<<1, 16>>>(sums);
    CHECK(cudaMemcpy(got, sums, 16 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int t = 0; t < 16; t++) EXPECT(got[t] == (t % 2 ? t * t : 3 * t));
    int *fib, *trail;
    CHECK(cudaMalloc(&fib, 12 * sizeof(int)));
    CHECK(cudaMalloc(&trail, 12 * 16 * sizeof(int)));
    recursion<<<1, 12>>>(fib, sums, trail);
    CHECK(cudaGetLastError());
    int fibs[12], trails[12 * 16];
    CHECK(cudaMemcpy(fibs, fib, sizeof(fibs), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got, sums, 12 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(trails, trail, sizeof(trails), cudaMemcpyDeviceToHost));
    int a = 0, b = 1;
    for (int t = 0; t < 12; t++) {
        EXPECT(fibs[t] == a);
        int next = a + b; a = b; b = next;
        EXPECT(got[t] == 3 * t * (t + 1) / 2);
        for (int d = 1; d <= t; d++) EXPECT(trails[t * 16 + d] == 6 * d);
    }
    printf("device_side: virtual functions and recursion correct\n");

    // Cooperative launch: the device says it can, and the grid meets at grid.sync().
    int cooperative = 0, sms = 0, per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(cooperative == 1 && prop.cooperativeLaunch == 1);
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_sum, 128, 0));
    const int n = 10000, blocks = 8;
    EXPECT(blocks <= per_sm * sms);
    int *values = (int *)malloc(n * sizeof(int)), *din, *partial, *grand;
    long long want = 0;
    for (int i = 0; i < n; i++) { values[i] = (i * 37) % 101; want += values[i]; }
    CHECK(cudaMalloc(&din, n * sizeof(int)));
    CHECK(cudaMalloc(&partial, blocks * sizeof(int)));
    CHECK(cudaMalloc(&grand, sizeof(int)));
    CHECK(cudaMemcpy(din, values, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(partial, 0, blocks * sizeof(int)));
    int size = n;
    void *args[] = {&din, &partial, &grand, &size};
    CHECK(cudaLaunchCooperativeKernel((void *)grid_sum, dim3(blocks), dim3(128), args, 0, 0));
    int partials[blocks];
    CHECK(cudaMemcpy(partials, partial, sizeof(partials), cudaMemcpyDeviceToHost));
    for (int k = 0; k < blocks; k++) EXPECT(partials[k] == want);
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge,
                 cudaLaunchCooperativeKernel((void *)grid_sum, dim3(per_sm * sms + 1),
                                             dim3(128), args, 0, 0));
    EXPECT_ERROR(cudaErrorCooperativeLaunchTooLarge, cudaGetLastError());
    printf("device_side: a cooperative grid of %d blocks met at grid.sync()\n", blocks);
    return 0;
}
