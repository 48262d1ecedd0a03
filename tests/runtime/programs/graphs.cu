// CUDA graphs through the runtime API: a stream capture of copies (pinned and pageable),
// <<<>>> launches and a host function, launched three times over new inputs; a graph built
// node by node (memset, a chain of kernels, a 1D copy) whose kernel node is updated in the
// executable graph and through cudaGraphExecUpdate; CUDA's errors for misuse. Results are
// checked against values computed on the host.
#include <cstring>
#include <vector>
#include "check.cuh"

__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void add_k(int *v, int k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += k;
}

__device__ int offset_value;

__global__ void add_offset(int *v) { v[threadIdx.x] += offset_value; }

static void count_call(void *data) { ++*static_cast<int *>(data); }

static cudaKernelNodeParams add_params(void **args, int n) {
    cudaKernelNodeParams p = {};
    p.func = (void *)add_k;
    p.gridDim = dim3((n + 127) / 128);
    p.blockDim = dim3(128);
    p.kernelParams = args;
    return p;
}

int main() {
    const int n = 3000;
    const size_t bytes = n * sizeof(float);
    float *x, *y, *pinned_x, *pinned_out;
    std::vector<float> pageable_y(n);
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMallocHost(&pinned_x, bytes));
    CHECK(cudaMallocHost(&pinned_out, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // ---- the program's device code is first used inside a capture (loaded then, lazily)
    int offset = 42;
    cudaGraph_t symbol_graph;
    cudaGraphExec_t symbol_exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyToSymbolAsync(offset_value, &offset, sizeof offset, 0,
                                  cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamEndCapture(s, &symbol_graph));
    CHECK(cudaGraphInstantiate(&symbol_exec, symbol_graph, 0));
    offset = 43;  // a pageable copy node reads the host memory when the graph runs
    CHECK(cudaGraphLaunch(symbol_exec, s));
    int *offsets;
    CHECK(cudaMalloc(&offsets, 32 * sizeof(int)));
    CHECK(cudaMemsetAsync(offsets, 0, 32 * sizeof(int), s));
    add_offset<<<1, 32, 0, s>>>(offsets);
    int added[32];
    CHECK(cudaMemcpyAsync(added, offsets, sizeof added, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 32; i++) EXPECT(added[i] == 43);
    printf("graphs: module loaded during a capture\n");

    // ---- capture
    int calls = 0;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s, &status));
    EXPECT(status == cudaStreamCaptureStatusActive);
    CHECK(cudaMemcpyAsync(x, pinned_x, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(y, pageable_y.data(), bytes, cudaMemcpyHostToDevice, s));
    saxpy<<<(n + 255) / 256, 256, 0, s>>>(2.0f, x, y, n);
    CHECK(cudaGetLastError());
    CHECK(cudaLaunchHostFunc(s, count_call, &calls));
    CHECK(cudaMemcpyAsync(pinned_out, y, bytes, cudaMemcpyDeviceToHost, s));
    void *scratch;
    EXPECT_ERROR(cudaErrorStreamCaptureUnsupported, cudaMalloc(&scratch, 16));
    unsigned long long id = 0;
    cudaGraph_t graph_of_capture;
    size_t frontier = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &graph_of_capture, nullptr, nullptr,
                                   &frontier));
    EXPECT(status == cudaStreamCaptureStatusActive && id != 0 && frontier == 1);
    cudaGraph_t captured;
    CHECK(cudaStreamEndCapture(s, &captured));
    EXPECT(captured == graph_of_capture);
    EXPECT(calls == 0);  // nothing ran while capturing
    size_t count = 0;
    CHECK(cudaGraphGetNodes(captured, nullptr, &count));
    EXPECT(count == 5);
    std::vector<cudaGraphNode_t> nodes(count);
    CHECK(cudaGraphGetNodes(captured, nodes.data(), &count));
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(nodes[2], &type));
    EXPECT(type == cudaGraphNodeTypeKernel);
    CHECK(cudaGraphNodeGetType(nodes[3], &type));
    EXPECT(type == cudaGraphNodeTypeHost);
    cudaGraphExec_t captured_exec;
    CHECK(cudaGraphInstantiate(&captured_exec, captured, 0));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++) { pinned_x[i] = i * 0.5f + round; pageable_y[i] = 10.0f * round - i; }
        CHECK(cudaGraphLaunch(captured_exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++)
            EXPECT(pinned_out[i] == 2.0f * (i * 0.5f + round) + (10.0f * round - i));
    }
    EXPECT(calls == 3);
    printf("graphs: captured graph ran 3 times\n");

    // ---- built node by node: memset(0) -> +1 -> +2 -> +3 -> copy to pageable memory
    int *v;
    CHECK(cudaMalloc(&v, n * sizeof(int)));
    std::vector<int> result(n);
    int nn = n, one = 1, two = 2, three = 3;
    void *args1[] = {&v, &one, &nn}, *args2[] = {&v, &two, &nn}, *args3[] = {&v, &three, &nn};
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t set, add1, add2, add3, copy;
    cudaMemsetParams ms = {};
    ms.dst = v; ms.value = 0; ms.elementSize = 4; ms.width = n; ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&set, graph, nullptr, 0, &ms));
    cudaKernelNodeParams p1 = add_params(args1, n), p2 = add_params(args2, n),
                         p3 = add_params(args3, n);
    CHECK(cudaGraphAddKernelNode(&add1, graph, &set, 1, &p1));
    CHECK(cudaGraphAddKernelNode(&add2, graph, &add1, 1, &p2));
    cudaGraphNodeParams generic = {};  // the CUDA 12 way: one struct for every node type
    generic.type = cudaGraphNodeTypeKernel;
    generic.kernel.func = (void *)add_k;
    generic.kernel.gridDim = p3.gridDim;
    generic.kernel.blockDim = p3.blockDim;
    generic.kernel.kernelParams = args3;
    CHECK(cudaGraphAddNode(&add3, graph, &add2, nullptr, 1, &generic));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &add3, 1, result.data(), v, n * sizeof(int),
                                   cudaMemcpyDeviceToHost));
    cudaKernelNodeParams got = {};
    CHECK(cudaGraphKernelNodeGetParams(add2, &got));
    EXPECT(got.func == (void *)add_k && *(int *)got.kernelParams[1] == 2);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(result[i] == 6);

    int ten = 10;
    void *args10[] = {&v, &ten, &nn};
    cudaKernelNodeParams p10 = add_params(args10, n);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, add2, &p10));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(result[i] == 1 + 10 + 3);

    int hundred = 100;
    void *args100[] = {&v, &hundred, &nn};
    cudaKernelNodeParams p100 = add_params(args100, n);
    CHECK(cudaGraphKernelNodeSetParams(add3, &p100));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, graph, &info));
    EXPECT(info.result == cudaGraphExecUpdateSuccess);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(result[i] == 1 + 2 + 100);  // the graph's own nodes

    unsigned enabled = 1;
    CHECK(cudaGraphNodeSetEnabled(exec, add1, 0));
    CHECK(cudaGraphNodeGetEnabled(exec, add1, &enabled));
    EXPECT(enabled == 0);
    cudaMemsetParams seven = ms;
    seven.value = 7;
    CHECK(cudaGraphExecMemsetNodeSetParams(exec, set, &seven));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(result[i] == 7 + 2 + 100);
    CHECK(cudaGraphNodeSetEnabled(exec, add1, 1));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(result[i] == 7 + 1 + 2 + 100);
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphNodeSetEnabled(exec, nodes[0], 0));  // foreign
    printf("graphs: built graph ran and was updated\n");

    // ---- stream-ordered allocation in a capture: alloc and free nodes
    int *pinned_ints, *scratch_ints;
    CHECK(cudaMallocHost(&pinned_ints, n * sizeof(int)));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaMallocAsync(&scratch_ints, n * sizeof(int), s));
    CHECK(cudaMemsetAsync(scratch_ints, 0, n * sizeof(int), s));
    add_k<<<(n + 127) / 128, 128, 0, s>>>(scratch_ints, 5, n);
    CHECK(cudaMemcpyAsync(pinned_ints, scratch_ints, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(scratch_ints, s));
    cudaGraph_t with_memory;
    CHECK(cudaStreamEndCapture(s, &with_memory));
    CHECK(cudaGraphGetNodes(with_memory, nullptr, &count));
    EXPECT(count == 5);
    std::vector<cudaGraphNode_t> memory_nodes(count);
    CHECK(cudaGraphGetNodes(with_memory, memory_nodes.data(), &count));
    CHECK(cudaGraphNodeGetType(memory_nodes[0], &type));
    EXPECT(type == cudaGraphNodeTypeMemAlloc);
    CHECK(cudaGraphNodeGetType(memory_nodes[4], &type));
    EXPECT(type == cudaGraphNodeTypeMemFree);
    cudaMemAllocNodeParams alloc_params;
    CHECK(cudaGraphMemAllocNodeGetParams(memory_nodes[0], &alloc_params));
    EXPECT(alloc_params.dptr == scratch_ints && alloc_params.bytesize == n * sizeof(int));
    cudaGraphExec_t memory_exec;
    CHECK(cudaGraphInstantiate(&memory_exec, with_memory, 0));
    for (int round = 0; round < 2; round++) {
        memset(pinned_ints, 0xff, n * sizeof(int));
        CHECK(cudaGraphLaunch(memory_exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) EXPECT(pinned_ints[i] == 5);
    }
    unsigned long long graph_bytes = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &graph_bytes));
    EXPECT(graph_bytes == n * sizeof(int));
    CHECK(cudaGraphExecDestroy(memory_exec));
    CHECK(cudaGraphDestroy(with_memory));
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &graph_bytes));
    EXPECT(graph_bytes == 0);
    printf("graphs: stream-ordered allocation captured\n");

    // ---- misuse
    cudaGraph_t none;
    EXPECT_ERROR(cudaErrorIllegalState, cudaStreamEndCapture(s, &none));
    EXPECT_ERROR(cudaErrorStreamCaptureUnsupported,
                 cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal));
    cudaGraphNode_t bad;
    cudaGraphNode_t foreign = nodes[0];
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphAddEmptyNode(&bad, graph, &foreign, 1));
    CHECK(cudaGraphAddEmptyNode(&bad, graph, nullptr, 0));
    EXPECT_ERROR(cudaErrorGraphExecUpdateFailure, cudaGraphExecUpdate(exec, graph, &info));
    EXPECT(info.result == cudaGraphExecUpdateErrorTopologyChanged);
    printf("graphs: misuse refused\n");

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(captured_exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaGraphDestroy(captured));
    CHECK(cudaFree(v));
    CHECK(cudaStreamDestroy(s));
    printf("graphs: all checks passed\n");
    return 0;
}
