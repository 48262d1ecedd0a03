// Misuse of device graphs gets CUDA's errors. Instantiating for device launch a graph that
// holds what a device graph may not (host, event, memory-allocation and conditional nodes,
// a copy of pageable host memory, a child graph holding one, a kernel that launches kernels)
// fails with cudaErrorInvalidValue, and cudaGraphInstantiateWithParams reports
// cudaGraphInstantiateNodeOperationNotSupported and the node at fault. From a kernel of a
// host graph, cudaGraphLaunch refuses a graph not instantiated for device launch, one not
// uploaded, a stream that is no graph launch stream, and a graph whose earlier device
// launch still runs (a graph enqueues itself as its tail once); the launches it accepted
// run, as the values worked out on the host show.
#include "check.cuh"
#include <cstdlib>

__global__ void add_k(int *v, int k) { atomicAdd(v, k); }
__global__ void launches_kernel(int *v) { add_k<<<1, 1>>>(v, 1); }

// codes[i]: what the i-th device-side launch returned
__global__ void launch_twice(cudaGraphExec_t graph, cudaStream_t mode, int *codes) {
    codes[0] = cudaGraphLaunch(graph, mode);
    codes[1] = cudaGraphLaunch(graph, mode);
}

// A device graph's kernel: on its first run, enqueues its own graph as its tail twice.
__global__ void self_tail_twice(int *runs, int *codes) {
    if ((*runs)++ == 0) {
        codes[0] = cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
        codes[1] = cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
    }
}

static void noop(void *) {}

static cudaGraphNode_t add_kernel(cudaGraph_t graph, void *func, void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &p));
    return node;
}

// Instantiating `graph` for device launch fails on `at` (nullptr: on no node named).
static void refused(cudaGraph_t graph, cudaGraphNode_t at) {
    cudaGraphInstantiateParams params = {};
    params.flags = cudaGraphInstantiateFlagDeviceLaunch;
    cudaGraphExec_t exec;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphInstantiateWithParams(&exec, graph, &params));
    EXPECT(params.result_out == cudaGraphInstantiateNodeOperationNotSupported);
    EXPECT(params.errNode_out == at);
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch));
    CHECK(cudaGraphDestroy(graph));
}

static cudaGraph_t kernel_graph(int *v, int *k) {
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    void *args[] = {&v, k};
    add_kernel(graph, (void *)add_k, args);
    return graph;
}

static void instantiation(int *v) {
    int one = 1;
    cudaGraph_t graph;
    cudaGraphNode_t node;

    graph = kernel_graph(v, &one);
    cudaHostNodeParams host = {noop, nullptr};
    CHECK(cudaGraphAddHostNode(&node, graph, nullptr, 0, &host));
    refused(graph, node);

    graph = kernel_graph(v, &one);
    cudaEvent_t event;
    CHECK(cudaEventCreate(&event));
    CHECK(cudaGraphAddEventRecordNode(&node, graph, nullptr, 0, event));
    refused(graph, node);

    graph = kernel_graph(v, &one);
    cudaMemAllocNodeParams alloc = {};
    alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    alloc.poolProps.location = {cudaMemLocationTypeDevice, 0};
    alloc.bytesize = 256;
    CHECK(cudaGraphAddMemAllocNode(&node, graph, nullptr, 0, &alloc));
    refused(graph, node);

    graph = kernel_graph(v, &one);
    int *pageable = (int *)malloc(sizeof(int));
    CHECK(cudaGraphAddMemcpyNode1D(&node, graph, nullptr, 0, v, pageable, sizeof(int),
                                   cudaMemcpyHostToDevice));
    refused(graph, node);

    graph = kernel_graph(v, &one);
    cudaGraphConditionalHandle condition;
    CHECK(cudaGraphConditionalHandleCreate(&condition, graph, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams conditional = {};
    conditional.type = cudaGraphNodeTypeConditional;
    conditional.conditional.handle = condition;
    conditional.conditional.type = cudaGraphCondTypeIf;
    conditional.conditional.size = 1;
    cudaGraph_t body;
    conditional.conditional.phGraph_out = &body;
    CHECK(cudaGraphAddNode(&node, graph, nullptr, nullptr, 0, &conditional));
    refused(graph, node);

    // A child graph holding a host node: the child graph node is at fault.
    cudaGraph_t inner;
    CHECK(cudaGraphCreate(&inner, 0));
    cudaGraphNode_t inner_host;
    CHECK(cudaGraphAddHostNode(&inner_host, inner, nullptr, 0, &host));
    graph = kernel_graph(v, &one);
    CHECK(cudaGraphAddChildGraphNode(&node, graph, nullptr, 0, inner));
    refused(graph, node);

    // A kernel that launches kernels (dynamic parallelism).
    CHECK(cudaGraphCreate(&graph, 0));
    void *child_args[] = {&v};
    add_kernel(graph, (void *)launches_kernel, child_args);
    cudaGraphInstantiateParams params = {};
    params.flags = cudaGraphInstantiateFlagDeviceLaunch;
    cudaGraphExec_t exec;
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphInstantiateWithParams(&exec, graph, &params));
    EXPECT(params.result_out == cudaGraphInstantiateNodeOperationNotSupported);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));  // a host graph may hold it
    CHECK(cudaGraphExecDestroy(exec));

    // Device launch and freeing on launch do not go together.
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch |
                                                    cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CHECK(cudaGraphDestroy(graph));

    // What a device graph may hold: kernels, memsets, device copies, child graphs of them.
    graph = kernel_graph(v, &one);
    cudaMemsetParams memset = {};
    memset.dst = v + 1;
    memset.elementSize = sizeof(int);
    memset.width = memset.height = 1;
    CHECK(cudaGraphAddMemsetNode(&node, graph, nullptr, 0, &memset));
    CHECK(cudaGraphAddMemcpyNode1D(&node, graph, nullptr, 0, v + 2, v + 3, sizeof(int),
                                   cudaMemcpyDeviceToDevice));
    cudaGraph_t clean = kernel_graph(v, &one);
    CHECK(cudaGraphAddChildGraphNode(&node, graph, nullptr, 0, clean));
    params = {};
    params.flags = cudaGraphInstantiateFlagDeviceLaunch;
    params.result_out = cudaGraphInstantiateError;
    CHECK(cudaGraphInstantiateWithParams(&exec, graph, &params));
    EXPECT(params.result_out == cudaGraphInstantiateSuccess && params.errNode_out == nullptr);
    CHECK(cudaGraphExecDestroy(exec));
    for (cudaGraph_t g : {graph, clean, inner}) CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(event));
    free(pageable);
    printf("device_graph_errors: graphs a device may not launch failed to instantiate\n");
}

// `launcher` launched by a host graph (device graphs are launched from graphs).
template <typename... Args>
static void from_host_graph(cudaStream_t s, void (*launcher)(Args...), Args... args) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    launcher<<<1, 1, 0, s>>>(args...);
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
}

static void expect_codes(const int *codes, int first, int second) {
    int got[2];
    CHECK(cudaMemcpy(got, codes, sizeof got, cudaMemcpyDeviceToHost));
    if (got[0] != first || got[1] != second)
        fprintf(stderr, "codes %d %d, not %d %d\n", got[0], got[1], first, second);
    EXPECT(got[0] == first && got[1] == second);
}

static int value_of(const int *v) {
    int got;
    CHECK(cudaMemcpy(&got, v, sizeof got, cudaMemcpyDeviceToHost));
    return got;
}

static void device_launches(cudaStream_t s, int *v) {
    int *codes;
    CHECK(cudaMalloc(&codes, 2 * sizeof(int)));
    int ten = 10;
    cudaGraph_t graph = kernel_graph(v, &ten);
    cudaGraphExec_t host_only, not_uploaded, ready;
    CHECK(cudaGraphInstantiate(&host_only, graph, 0));
    CHECK(cudaGraphInstantiate(&not_uploaded, graph, cudaGraphInstantiateFlagDeviceLaunch));
    CHECK(cudaGraphInstantiate(&ready, graph, cudaGraphInstantiateFlagDeviceLaunch));
    CHECK(cudaGraphUpload(ready, s));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaMemset(v, 0, sizeof(int)));

    // Neither a host graph nor a device graph not uploaded yet, nor a regular stream.
    from_host_graph(s, launch_twice, host_only, cudaStreamGraphFireAndForget, codes);
    expect_codes(codes, cudaErrorInvalidValue, cudaErrorInvalidValue);
    from_host_graph(s, launch_twice, not_uploaded, cudaStreamGraphTailLaunch, codes);
    expect_codes(codes, cudaErrorInvalidValue, cudaErrorInvalidValue);
    from_host_graph(s, launch_twice, ready, (cudaStream_t)0, codes);
    expect_codes(codes, cudaErrorInvalidValue, cudaErrorInvalidValue);
    from_host_graph(s, launch_twice, ready, cudaStreamPerThread, codes);
    expect_codes(codes, cudaErrorInvalidValue, cudaErrorInvalidValue);
    EXPECT(value_of(v) == 0);

    // A second launch while the first still runs is refused; the first runs.
    for (cudaStream_t mode : {cudaStreamGraphFireAndForget, cudaStreamGraphTailLaunch,
                              cudaStreamGraphFireAndForgetAsSibling}) {
        from_host_graph(s, launch_twice, ready, mode, codes);
        expect_codes(codes, cudaSuccess, cudaErrorInvalidValue);
    }
    EXPECT(value_of(v) == 30);
    // Once it completed, it launches again.
    from_host_graph(s, launch_twice, ready, cudaStreamGraphFireAndForget, codes);
    expect_codes(codes, cudaSuccess, cudaErrorInvalidValue);
    EXPECT(value_of(v) == 40);

    // An uploaded graph launched from the host is still a device graph.
    CHECK(cudaGraphLaunch(not_uploaded, s));
    from_host_graph(s, launch_twice, not_uploaded, cudaStreamGraphTailLaunch, codes);
    expect_codes(codes, cudaSuccess, cudaErrorInvalidValue);
    EXPECT(value_of(v) == 60);

    // A graph enqueues itself as its tail once at a time.
    int *runs;
    CHECK(cudaMalloc(&runs, sizeof(int)));
    CHECK(cudaMemset(runs, 0, sizeof(int)));
    cudaGraph_t self_graph;
    CHECK(cudaGraphCreate(&self_graph, 0));
    void *self_args[] = {&runs, &codes};
    add_kernel(self_graph, (void *)self_tail_twice, self_args);
    cudaGraphExec_t self;
    CHECK(cudaGraphInstantiate(&self, self_graph, cudaGraphInstantiateFlagDeviceLaunch));
    CHECK(cudaGraphLaunch(self, s));
    CHECK(cudaStreamSynchronize(s));
    expect_codes(codes, cudaSuccess, cudaErrorInvalidValue);
    EXPECT(value_of(runs) == 2);  // its run and the one tail launch

    for (cudaGraphExec_t e : {host_only, not_uploaded, ready, self}) CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(self_graph));
    CHECK(cudaFree(runs));
    CHECK(cudaFree(codes));
    printf("device_graph_errors: kernels' misplaced graph launches were refused, the rest ran\n");
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *v;
    CHECK(cudaMalloc(&v, 4 * sizeof(int)));
    instantiation(v);
    device_launches(s, v);
    CHECK(cudaFree(v));
    CHECK(cudaStreamDestroy(s));
    printf("device_graph_errors: all checks passed\n");
    return 0;
}
