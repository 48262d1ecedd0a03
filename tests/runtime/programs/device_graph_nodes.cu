// What else a device graph may hold, run from a kernel. Cooperative kernel nodes (the
// launch attribute set on a kernel node, or a captured cudaLaunchCooperativeKernel) meet at
// grid.sync() across all their blocks; memcpy nodes copying to and from pinned host memory
// the device maps (cudaHostAlloc'd with cudaHostAllocMapped, cudaHostRegister'd with
// cudaHostRegisterMapped), named by host or device pointer, copy what that memory holds
// when the graph runs. The results are checked against values worked out on the host.
#include "check.cuh"
#include <cooperative_groups.h>
#include <cstdlib>
#include <cstring>

namespace cg = cooperative_groups;

constexpr int BLOCKS = 4, THREADS = 64, N = BLOCKS * THREADS;

// out[i] = in[i] * k + in[(i + THREADS) % N] * k: the second term was written by another
// block before the grid barrier.
__global__ void scale_then_mix(const int *in, int *scratch, int *out, int k) {
    cg::grid_group grid = cg::this_grid();
    int i = grid.thread_rank();
    scratch[i] = in[i] * k;
    grid.sync();
    out[i] = scratch[i] + scratch[(i + THREADS) % N];
}

__global__ void add_one(int *v) { v[blockIdx.x * blockDim.x + threadIdx.x] += 1; }

__global__ void launch_graph(cudaGraphExec_t graph, int *code) {
    *code = cudaGraphLaunch(graph, cudaStreamGraphFireAndForget);
}

// `graph` launched by a kernel of a host graph (device graphs are launched from graphs).
static void launch_from_device(cudaStream_t s, cudaGraphExec_t graph, int *code) {
    cudaGraph_t host_graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    launch_graph<<<1, 1, 0, s>>>(graph, code);
    CHECK(cudaStreamEndCapture(s, &host_graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, host_graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    int got = -1;
    CHECK(cudaMemcpy(&got, code, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == cudaSuccess);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(host_graph));
}

static cudaGraphExec_t for_device(cudaStream_t s, cudaGraph_t graph) {
    cudaGraphInstantiateParams params = {};
    params.flags = cudaGraphInstantiateFlagDeviceLaunch;
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithParams(&exec, graph, &params));
    EXPECT(params.result_out == cudaGraphInstantiateSuccess);
    CHECK(cudaGraphUpload(exec, s));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

static void expect_mixed(const int *dout, const int *in, int k) {
    int got[N];
    CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) EXPECT(got[i] == in[i] * k + in[(i + THREADS) % N] * k);
}

static void cooperative_nodes(cudaStream_t s, int *code) {
    int in[N];
    for (int i = 0; i < N; i++) in[i] = (i * 7) % 23 - 5;
    int *din, *scratch, *dout;
    CHECK(cudaMalloc(&din, sizeof in));
    CHECK(cudaMalloc(&scratch, sizeof in));
    CHECK(cudaMalloc(&dout, sizeof in));
    CHECK(cudaMemcpy(din, in, sizeof in, cudaMemcpyHostToDevice));

    // A kernel node made cooperative by its launch attribute.
    int k = 3;
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    void *args[] = {&din, &scratch, &dout, &k};
    cudaKernelNodeParams p = {};
    p.func = (void *)scale_then_mix;
    p.gridDim = dim3(BLOCKS);
    p.blockDim = dim3(THREADS);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &p));
    cudaLaunchAttributeValue cooperative = {};
    cooperative.cooperative = 1;
    CHECK(cudaGraphKernelNodeSetAttribute(node, cudaLaunchAttributeCooperative, &cooperative));
    cudaGraphExec_t by_attribute = for_device(s, graph);
    launch_from_device(s, by_attribute, code);
    expect_mixed(dout, in, 3);

    // A captured cooperative launch.
    k = 5;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaLaunchCooperativeKernel((void *)scale_then_mix, dim3(BLOCKS), dim3(THREADS), args,
                                      0, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t captured = for_device(s, graph);
    launch_from_device(s, captured, code);
    expect_mixed(dout, in, 5);
    // Launched again (after the other), each grid meets at a barrier of its own run.
    launch_from_device(s, by_attribute, code);
    expect_mixed(dout, in, 3);

    for (cudaGraphExec_t e : {by_attribute, captured}) CHECK(cudaGraphExecDestroy(e));
    for (int *d : {din, scratch, dout}) CHECK(cudaFree(d));
    printf("device_graph_nodes: cooperative kernel nodes met at grid.sync() from the device\n");
}

// in (mapped, by host pointer) -> device -> +1 -> registered (mapped, by host pointer), and
// by device pointers: registered -> in's second third, device -> in's last third.
static void pinned_copies(cudaStream_t s, int *code) {
    int *in;
    CHECK(cudaHostAlloc(&in, 3 * N * sizeof(int), cudaHostAllocMapped));
    int *registered = (int *)aligned_alloc(4096, N * sizeof(int));
    memset(registered, 0, N * sizeof(int));
    CHECK(cudaHostRegister(registered, N * sizeof(int), cudaHostRegisterMapped));
    int *in_device, *registered_device, *d;
    CHECK(cudaHostGetDevicePointer((void **)&in_device, in, 0));
    CHECK(cudaHostGetDevicePointer((void **)&registered_device, registered, 0));
    CHECK(cudaMalloc(&d, N * sizeof(int)));

    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t to_device, kernel, to_host, between, back;
    CHECK(cudaGraphAddMemcpyNode1D(&to_device, graph, nullptr, 0, d, in, N * sizeof(int),
                                   cudaMemcpyHostToDevice));
    void *args[] = {&d};
    cudaKernelNodeParams p = {};
    p.func = (void *)add_one;
    p.gridDim = dim3(BLOCKS);
    p.blockDim = dim3(THREADS);
    p.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&kernel, graph, &to_device, 1, &p));
    CHECK(cudaGraphAddMemcpyNode1D(&to_host, graph, &kernel, 1, registered, d, N * sizeof(int),
                                   cudaMemcpyDefault));
    CHECK(cudaGraphAddMemcpyNode1D(&between, graph, &to_host, 1, in_device + N,
                                   registered_device, N * sizeof(int), cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddMemcpyNode1D(&back, graph, &kernel, 1, in_device + 2 * N, d,
                                   N * sizeof(int), cudaMemcpyDeviceToDevice));
    cudaGraphExec_t exec = for_device(s, graph);

    // The copies read the host memory as it is when the graph runs, each time.
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) in[i] = i * (round + 2) - 100;
        launch_from_device(s, exec, code);
        for (int i = 0; i < N; i++) {
            EXPECT(registered[i] == i * (round + 2) - 99);
            EXPECT(in[N + i] == i * (round + 2) - 99);
            EXPECT(in[2 * N + i] == i * (round + 2) - 99);
        }
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaHostUnregister(registered));
    free(registered);
    CHECK(cudaFreeHost(in));
    CHECK(cudaFree(d));
    printf("device_graph_nodes: copies of mapped pinned memory ran from the device\n");
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *code;
    CHECK(cudaMalloc(&code, sizeof(int)));
    cooperative_nodes(s, code);
    pinned_copies(s, code);
    CHECK(cudaFree(code));
    CHECK(cudaStreamDestroy(s));
    printf("device_graph_nodes: all checks passed\n");
    return 0;
}
