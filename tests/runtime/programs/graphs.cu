// CUDA graphs through the runtime API: a stream capture of copies (pinned and pageable),
// <<<>>> launches and a host function, launched three times over new inputs; a graph built
// node by node (memset, a chain of kernels, a 1D copy) whose kernel node is updated in the
// executable graph and through cudaGraphExecUpdate; conditional nodes (IF with else,
// SWITCH, WHILE) whose condition a kernel sets; host-to-host copy nodes; a graph launch
// captured into another graph; programmatic and launch-order edges (edge data); graphs
// launched by kernels (fire-and-forget and tail); CUDA's errors for misuse. Results are
// checked against values computed on the host.
#include <algorithm>
#include <cstring>
#include <unistd.h>
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
static int nn1_global = 1;  // one element, for one-thread kernel nodes

// The dependent of a programmatic edge (on a device of compute capability 8.0, which has
// no programmatic launches, it runs after its primary as after any kernel).
__global__ void double_after_primary(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] *= 2;
}

// Device graph launches: log[0] counts entries, which follow it in the order they came.
__global__ void stamp(int *log, int id) { log[1 + atomicAdd(log, 1)] = id; }

// Launches `tail` into the tail stream, then `child` fire-and-forget; the codes they return.
__global__ void launch_graphs(cudaGraphExec_t tail, cudaGraphExec_t child, int *codes) {
    codes[0] = cudaGraphLaunch(tail, cudaStreamGraphTailLaunch);
    codes[1] = cudaGraphLaunch(child, cudaStreamGraphFireAndForget);
}

// Conditional nodes: a kernel sets the condition, bodies change v.
__global__ void set_condition(cudaGraphConditionalHandle handle, const int *value) {
    cudaGraphSetConditional(handle, *value);
}

// A WHILE body: one more step of a countdown, the loop going on while steps are left.
__global__ void count_down(cudaGraphConditionalHandle handle, int *left, int *steps) {
    *steps += 1;
    *left -= 1;
    cudaGraphSetConditional(handle, *left > 0);
}

static cudaGraphNode_t add_conditional(cudaGraph_t graph, cudaGraphNode_t *after,
                                       cudaGraphConditionalHandle handle,
                                       cudaGraphConditionalNodeType type, unsigned size,
                                       cudaGraph_t *bodies) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = size;
    p.conditional.phGraph_out = bodies;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, graph, after, nullptr, after ? 1 : 0, &p));
    return node;
}

static cudaGraphNode_t add_kernel(cudaGraph_t graph, void *func, void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = dim3(1);
    p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &p));
    return node;
}

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
    cudaKernelNodeParams captured_params = {};
    CHECK(cudaGraphKernelNodeGetParams(nodes[2], &captured_params));
    EXPECT(captured_params.func == (void *)saxpy && captured_params.blockDim.x == 256 &&
           *(float *)captured_params.kernelParams[0] == 2.0f);
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

    // ---- conditional nodes: IF with an else branch, SWITCH, WHILE; the condition set by
    // a kernel of the graph (cudaGraphSetConditional), bodies built node by node and by a
    // capture into the body graph
    {
        int *flag, *sel, *out;
        CHECK(cudaMalloc(&flag, sizeof(int)));
        CHECK(cudaMalloc(&sel, sizeof(int)));
        CHECK(cudaMalloc(&out, 3 * sizeof(int)));
        cudaGraph_t cg;
        CHECK(cudaGraphCreate(&cg, 0));
        cudaGraphConditionalHandle if_handle, switch_handle;
        CHECK(cudaGraphConditionalHandleCreate(&if_handle, cg, 0, cudaGraphCondAssignDefault));
        CHECK(cudaGraphConditionalHandleCreate(&switch_handle, cg, 0, 0));
        cudaMemsetParams zero = {};
        zero.dst = out; zero.elementSize = 4; zero.width = 3; zero.height = 1;
        cudaGraphNode_t cleared;
        CHECK(cudaGraphAddMemsetNode(&cleared, cg, nullptr, 0, &zero));
        void *set_if[] = {&if_handle, &flag}, *set_switch[] = {&switch_handle, &sel};
        cudaGraphNode_t setter = add_kernel(cg, (void *)set_condition, set_if);
        CHECK(cudaGraphAddDependencies(cg, &cleared, &setter, nullptr, 1));
        cudaGraph_t branches[2];
        cudaGraphNode_t if_node = add_conditional(cg, &setter, if_handle, cudaGraphCondTypeIf,
                                                  2, branches);
        int nn1 = 1, ten = 10;
        void *then_args[] = {&out, &ten, &nn1};
        add_kernel(branches[0], (void *)add_k, then_args);
        // the else branch captured into its body graph, as CUDA's samples fill bodies
        CHECK(cudaStreamBeginCaptureToGraph(s, branches[1], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeGlobal));
        add_k<<<1, 1, 0, s>>>(out, 20, 1);
        cudaGraph_t captured_body;
        CHECK(cudaStreamEndCapture(s, &captured_body));
        EXPECT(captured_body == branches[1]);
        cudaGraphNode_t switch_setter = add_kernel(cg, (void *)set_condition, set_switch);
        CHECK(cudaGraphAddDependencies(cg, &if_node, &switch_setter, nullptr, 1));
        cudaGraph_t cases[3];
        add_conditional(cg, &switch_setter, switch_handle, cudaGraphCondTypeSwitch, 3, cases);
        int *slots[3] = {out, out + 1, out + 2};
        int values[3] = {100, 200, 300};
        void *case_args[3][3];
        for (int c = 0; c < 3; c++) {
            case_args[c][0] = &slots[c]; case_args[c][1] = &values[c]; case_args[c][2] = &nn1;
            add_kernel(cases[c], (void *)add_k, case_args[c]);
        }
        size_t body_nodes = 0;
        CHECK(cudaGraphGetNodes(branches[1], nullptr, &body_nodes));
        EXPECT(body_nodes == 1);
        CHECK(cudaGraphNodeGetType(if_node, &type));
        EXPECT(type == cudaGraphNodeTypeConditional);
        cudaGraphExec_t cexec;
        CHECK(cudaGraphInstantiate(&cexec, cg, 0));
        const int flags[4] = {1, 0, 7, 0}, selectors[4] = {0, 2, 1, 5};
        for (int round = 0; round < 4; round++) {
            CHECK(cudaMemcpy(flag, &flags[round], sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(sel, &selectors[round], sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaGraphLaunch(cexec, s));
            int got[3];
            CHECK(cudaMemcpyAsync(got, out, sizeof got, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            int want[3] = {flags[round] ? 10 : 20, 0, 0};
            if (selectors[round] < 3) want[selectors[round]] += values[selectors[round]];
            for (int c = 0; c < 3; c++) EXPECT(got[c] == want[c]);
        }
        printf("graphs: IF/else and SWITCH nodes chose by the kernel's condition\n");

        // WHILE, its condition 1 at each launch (cudaGraphCondAssignDefault): 5 steps down
        int *left, *steps;
        CHECK(cudaMalloc(&left, sizeof(int)));
        CHECK(cudaMalloc(&steps, sizeof(int)));
        cudaGraph_t wg, loop_body;
        CHECK(cudaGraphCreate(&wg, 0));
        cudaGraphConditionalHandle while_handle;
        CHECK(cudaGraphConditionalHandleCreate(&while_handle, wg, 1, cudaGraphCondAssignDefault));
        add_conditional(wg, nullptr, while_handle, cudaGraphCondTypeWhile, 1, &loop_body);
        void *down_args[] = {&while_handle, &left, &steps};
        add_kernel(loop_body, (void *)count_down, down_args);
        cudaGraphExec_t wexec;
        CHECK(cudaGraphInstantiate(&wexec, wg, 0));
        for (int start = 5; start <= 6; start++) {
            int zero_steps = 0;
            CHECK(cudaMemcpy(left, &start, sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(steps, &zero_steps, sizeof(int), cudaMemcpyHostToDevice));
            CHECK(cudaGraphLaunch(wexec, s));
            CHECK(cudaStreamSynchronize(s));
            int got_left = -1, got_steps = -1;
            CHECK(cudaMemcpy(&got_left, left, sizeof(int), cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(&got_steps, steps, sizeof(int), cudaMemcpyDeviceToHost));
            EXPECT(got_left == 0 && got_steps == start);
        }
        printf("graphs: WHILE node looped until the kernel cleared its condition\n");

        // misuse: a WHILE has one body; a handle of another graph; a host node in a body
        cudaGraph_t pair[2], other;
        cudaGraphNodeParams bad_params = {};
        bad_params.type = cudaGraphNodeTypeConditional;
        bad_params.conditional.handle = while_handle;
        bad_params.conditional.type = cudaGraphCondTypeWhile;
        bad_params.conditional.size = 2;
        bad_params.conditional.phGraph_out = pair;
        cudaGraphNode_t refused;
        EXPECT_ERROR(cudaErrorInvalidValue,
                     cudaGraphAddNode(&refused, wg, nullptr, nullptr, 0, &bad_params));
        bad_params.conditional.size = 1;
        EXPECT_ERROR(cudaErrorInvalidValue,
                     cudaGraphAddNode(&refused, cg, nullptr, nullptr, 0, &bad_params));
        CHECK(cudaGraphCreate(&other, 0));
        cudaGraph_t host_body;
        cudaGraphConditionalHandle other_handle;
        CHECK(cudaGraphConditionalHandleCreate(&other_handle, other, 0, 0));
        add_conditional(other, nullptr, other_handle, cudaGraphCondTypeIf, 1, &host_body);
        cudaHostNodeParams hp = {};
        hp.fn = count_call;
        hp.userData = &calls;
        cudaGraphNode_t host_node;
        CHECK(cudaGraphAddHostNode(&host_node, host_body, nullptr, 0, &hp));
        cudaGraphExec_t never;
        EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphInstantiate(&never, other, 0));
        CHECK(cudaGraphDestroy(other));
        CHECK(cudaGraphExecDestroy(cexec));
        CHECK(cudaGraphExecDestroy(wexec));
        CHECK(cudaGraphDestroy(cg));
        CHECK(cudaGraphDestroy(wg));
        printf("graphs: conditional nodes' misuse refused\n");
    }

    // ---- host-to-host copies in a graph: device -> pinned, then pinned -> pageable, in
    // order after the kernel before them, at each launch
    {
        int *d, *pinned;
        std::vector<int> pageable(n, -1);
        CHECK(cudaMalloc(&d, n * sizeof(int)));
        CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
        cudaGraph_t hg;
        CHECK(cudaGraphCreate(&hg, 0));
        cudaGraphNode_t fill, to_pinned, to_pageable;
        cudaMemsetParams ones = {};
        ones.dst = d; ones.value = 1; ones.elementSize = 4; ones.width = n; ones.height = 1;
        CHECK(cudaGraphAddMemsetNode(&fill, hg, nullptr, 0, &ones));
        int k = 0;
        void *hk_args[] = {&d, &k, &nn};
        cudaKernelNodeParams hkp = add_params(hk_args, n);
        cudaGraphNode_t bump;
        CHECK(cudaGraphAddKernelNode(&bump, hg, &fill, 1, &hkp));
        CHECK(cudaGraphAddMemcpyNode1D(&to_pinned, hg, &bump, 1, pinned, d, n * sizeof(int),
                                       cudaMemcpyDeviceToHost));
        CHECK(cudaGraphAddMemcpyNode1D(&to_pageable, hg, &to_pinned, 1, pageable.data(), pinned,
                                       n * sizeof(int), cudaMemcpyHostToHost));
        cudaGraphExec_t hexec;
        CHECK(cudaGraphInstantiate(&hexec, hg, 0));
        for (int round = 1; round <= 2; round++) {
            k = 4 * round;
            CHECK(cudaGraphKernelNodeSetParams(bump, &hkp));
            CHECK(cudaGraphExecKernelNodeSetParams(hexec, bump, &hkp));
            CHECK(cudaGraphLaunch(hexec, s));
            CHECK(cudaStreamSynchronize(s));
            for (int i = 0; i < n; i++) EXPECT(pageable[i] == 1 + 4 * round);
        }
        // a graph launch captured into another graph: a child graph node running the
        // executable graph as it is now
        std::fill(pageable.begin(), pageable.end(), -1);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaGraphLaunch(hexec, s));
        cudaGraph_t outer;
        CHECK(cudaStreamEndCapture(s, &outer));
        CHECK(cudaGraphGetNodes(outer, nullptr, &count));
        EXPECT(count == 1);
        cudaGraphNode_t launched;
        CHECK(cudaGraphGetNodes(outer, &launched, &count));
        CHECK(cudaGraphNodeGetType(launched, &type));
        EXPECT(type == cudaGraphNodeTypeGraph && pageable[0] == -1);
        cudaGraphExec_t outer_exec;
        CHECK(cudaGraphInstantiate(&outer_exec, outer, 0));
        CHECK(cudaGraphLaunch(outer_exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) EXPECT(pageable[i] == 1 + 4 * 2);
        CHECK(cudaGraphExecDestroy(outer_exec));
        CHECK(cudaGraphDestroy(outer));
        // captured: a host-to-host cudaMemcpyAsync becomes a memcpy node
        std::vector<int> copied(n, 0);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaMemcpyAsync(copied.data(), pinned, n * sizeof(int), cudaMemcpyHostToHost, s));
        cudaGraph_t hcap;
        CHECK(cudaStreamEndCapture(s, &hcap));
        CHECK(cudaGraphGetNodes(hcap, nullptr, &count));
        EXPECT(count == 1);
        cudaGraphNode_t hnode;
        CHECK(cudaGraphGetNodes(hcap, &hnode, &count));
        CHECK(cudaGraphNodeGetType(hnode, &type));
        EXPECT(type == cudaGraphNodeTypeMemcpy);
        EXPECT(copied[0] == 0);  // nothing ran while capturing
        cudaGraphExec_t hcexec;
        CHECK(cudaGraphInstantiate(&hcexec, hcap, 0));
        CHECK(cudaGraphLaunch(hcexec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) EXPECT(copied[i] == 9);
        CHECK(cudaGraphExecDestroy(hcexec));
        CHECK(cudaGraphDestroy(hcap));
        CHECK(cudaGraphExecDestroy(hexec));
        CHECK(cudaGraphDestroy(hg));
        CHECK(cudaFreeHost(pinned));
        CHECK(cudaFree(d));
        printf("graphs: host-to-host copy nodes ran in order, a captured graph launch too\n");
    }

    // ---- copies to and from a device variable, a node's parameters asked back, an event
    // node's event, kernel node attributes, a child graph node of an executable graph given
    // a new graph, the graph written as DOT
    {
        int to_symbol = 77, from_symbol = 0, other = 88;
        cudaGraph_t sg;
        CHECK(cudaGraphCreate(&sg, 0));
        cudaGraphNode_t to_node, from_node, record_node, child_node, refused_node;
        EXPECT_ERROR(cudaErrorInvalidMemcpyDirection,
                     cudaGraphAddMemcpyNodeToSymbol(&refused_node, sg, nullptr, 0, offset_value,
                                                    &to_symbol, sizeof(int), 0,
                                                    cudaMemcpyDeviceToHost));
        CHECK(cudaGraphAddMemcpyNodeToSymbol(&to_node, sg, nullptr, 0, offset_value, &to_symbol,
                                             sizeof(int), 0, cudaMemcpyHostToDevice));
        CHECK(cudaGraphAddMemcpyNodeFromSymbol(&from_node, sg, &to_node, 1, &from_symbol,
                                               offset_value, sizeof(int), 0,
                                               cudaMemcpyDeviceToHost));
        cudaMemcpy3DParms copy_params;
        CHECK(cudaGraphMemcpyNodeGetParams(from_node, &copy_params));
        EXPECT(copy_params.dstPtr.ptr == &from_symbol && copy_params.extent.width == sizeof(int));
        cudaEvent_t ev, got_ev;
        CHECK(cudaEventCreate(&ev));
        CHECK(cudaGraphAddEventRecordNode(&record_node, sg, &from_node, 1, ev));
        CHECK(cudaGraphEventRecordNodeGetEvent(record_node, &got_ev));
        EXPECT(got_ev == ev);
        int *cv;
        CHECK(cudaMalloc(&cv, sizeof(int)));
        CHECK(cudaMemset(cv, 0, sizeof(int)));
        int one_c = 1, five_c = 5;
        void *child_one[] = {&cv, &one_c, &nn1_global}, *child_five[] = {&cv, &five_c, &nn1_global};
        cudaGraph_t child_a, child_b;
        CHECK(cudaGraphCreate(&child_a, 0));
        add_kernel(child_a, (void *)add_k, child_one);
        CHECK(cudaGraphCreate(&child_b, 0));
        add_kernel(child_b, (void *)add_k, child_five);
        CHECK(cudaGraphAddChildGraphNode(&child_node, sg, nullptr, 0, child_a));
        // launch attributes of a kernel node: a hint kept and handed back, a cooperative
        // launch, clusters refused; both kept when the node gets new parameters
        cudaGraphNode_t child_kernel;
        size_t one_node = 1;
        cudaGraph_t child_copy;
        CHECK(cudaGraphChildGraphNodeGetGraph(child_node, &child_copy));
        CHECK(cudaGraphGetNodes(child_copy, &child_kernel, &one_node));
        cudaLaunchAttributeValue window = {}, got_window = {}, coop = {}, cluster = {};
        window.accessPolicyWindow.base_ptr = cv;
        window.accessPolicyWindow.num_bytes = sizeof(int);
        window.accessPolicyWindow.hitRatio = 0.5f;
        window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
        CHECK(cudaGraphKernelNodeSetAttribute(child_kernel,
                                              cudaLaunchAttributeAccessPolicyWindow, &window));
        coop.cooperative = 1;
        CHECK(cudaGraphKernelNodeSetAttribute(child_kernel, cudaLaunchAttributeCooperative,
                                              &coop));
        cudaKernelNodeParams same = {};  // new parameters, the same as before...
        same.func = (void *)add_k;
        same.gridDim = dim3(1);
        same.blockDim = dim3(1);
        same.kernelParams = child_one;
        CHECK(cudaGraphKernelNodeSetParams(child_kernel, &same));
        cluster.clusterDim.x = 2; cluster.clusterDim.y = cluster.clusterDim.z = 1;
        EXPECT_ERROR(cudaErrorNotSupported,
                     cudaGraphKernelNodeSetAttribute(child_kernel,
                                                     cudaLaunchAttributeClusterDimension,
                                                     &cluster));
        CHECK(cudaGraphKernelNodeGetAttribute(child_kernel,
                                              cudaLaunchAttributeAccessPolicyWindow,
                                              &got_window));  // ...and the attributes stay
        EXPECT(got_window.accessPolicyWindow.base_ptr == cv &&
               got_window.accessPolicyWindow.hitRatio == 0.5f);
        cudaLaunchAttributeValue got_coop = {};
        CHECK(cudaGraphKernelNodeGetAttribute(child_kernel, cudaLaunchAttributeCooperative,
                                              &got_coop));
        EXPECT(got_coop.cooperative == 1);
        cudaGraphExec_t sexec;
        CHECK(cudaGraphInstantiate(&sexec, sg, 0));
        CHECK(cudaGraphLaunch(sexec, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(from_symbol == 77);
        CHECK(cudaGraphExecMemcpyNodeSetParamsToSymbol(sexec, to_node, offset_value, &other,
                                                       sizeof(int), 0, cudaMemcpyHostToDevice));
        CHECK(cudaGraphExecChildGraphNodeSetParams(sexec, child_node, child_b));
        CHECK(cudaGraphLaunch(sexec, s));
        CHECK(cudaStreamSynchronize(s));
        int child_sum = 0;
        CHECK(cudaMemcpy(&child_sum, cv, sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT(from_symbol == 88 && child_sum == 1 + 5);
        CHECK(cudaGraphAddEmptyNode(&refused_node, child_a, nullptr, 0));  // another shape
        EXPECT_ERROR(cudaErrorInvalidValue,
                     cudaGraphExecChildGraphNodeSetParams(sexec, child_node, child_a));
        char dot_path[64];
        snprintf(dot_path, sizeof dot_path, "/tmp/vgpu-graphs-%d.dot", (int)getpid());
        CHECK(cudaGraphDebugDotPrint(sg, dot_path, 0));
        FILE *dot_file = fopen(dot_path, "r");
        EXPECT(dot_file != nullptr);
        char dot_text[4096] = {};
        fread(dot_text, 1, sizeof dot_text - 1, dot_file);
        fclose(dot_file);
        remove(dot_path);
        EXPECT(strstr(dot_text, "digraph") && strstr(dot_text, "add_k") &&
               strstr(dot_text, "->") && strstr(dot_text, "EVENT_RECORD"));
        CHECK(cudaGraphExecDestroy(sexec));
        CHECK(cudaGraphDestroy(sg));
        CHECK(cudaGraphDestroy(child_a));
        CHECK(cudaGraphDestroy(child_b));
        CHECK(cudaEventDestroy(ev));
        CHECK(cudaFree(cv));
        printf("graphs: symbol copy nodes, node queries, attributes and a child graph "
               "replaced\n");
    }

    // ---- edge data: a programmatic edge between two kernel nodes is kept, handed back,
    // checked as CUDA checks it, and the dependent sees its primary's results
    {
        int *e;
        CHECK(cudaMalloc(&e, n * sizeof(int)));
        cudaGraph_t eg;
        CHECK(cudaGraphCreate(&eg, 0));
        cudaMemsetParams eset = {};
        eset.dst = e; eset.elementSize = 4; eset.width = n; eset.height = 1;
        cudaGraphNode_t cleared_e, primary, dependent, later;
        CHECK(cudaGraphAddMemsetNode(&cleared_e, eg, nullptr, 0, &eset));
        int three_e = 3;
        void *primary_args[] = {&e, &three_e, &nn};
        cudaKernelNodeParams pp = add_params(primary_args, n);
        CHECK(cudaGraphAddKernelNode(&primary, eg, &cleared_e, 1, &pp));
        cudaGraphEdgeData programmatic = {};
        programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
        programmatic.type = cudaGraphDependencyTypeProgrammatic;
        cudaGraphNodeParams dp = {};
        dp.type = cudaGraphNodeTypeKernel;
        dp.kernel.func = (void *)double_after_primary;
        dp.kernel.gridDim = pp.gridDim;
        dp.kernel.blockDim = pp.blockDim;
        void *dependent_args[] = {&e, &nn};
        dp.kernel.kernelParams = dependent_args;
        cudaGraphNode_t memset_dep = cleared_e;
        EXPECT_ERROR(cudaErrorInvalidValue,  // a programmatic edge leaves a kernel node only
                     cudaGraphAddNode(&dependent, eg, &memset_dep, &programmatic, 1, &dp));
        cudaGraphEdgeData bad = programmatic;
        bad.to_port = 1;
        EXPECT_ERROR(cudaErrorInvalidValue,
                     cudaGraphAddNode(&dependent, eg, &primary, &bad, 1, &dp));
        CHECK(cudaGraphAddNode(&dependent, eg, &primary, &programmatic, 1, &dp));
        cudaGraphNode_t froms[4], tos[4];
        cudaGraphEdgeData datas[4];
        size_t edge_count = 4;
        EXPECT_ERROR(cudaErrorLossyQuery,
                     cudaGraphGetEdges(eg, froms, tos, nullptr, &edge_count));
        edge_count = 4;
        CHECK(cudaGraphGetEdges(eg, froms, tos, datas, &edge_count));
        EXPECT(edge_count == 2);
        for (size_t i = 0; i < edge_count; i++) {
            bool prog = froms[i] == primary && tos[i] == dependent;
            EXPECT(datas[i].type == (prog ? cudaGraphDependencyTypeProgrammatic : 0));
            EXPECT(datas[i].from_port == (prog ? cudaGraphKernelNodePortProgrammatic : 0));
        }
        cudaGraphNode_t dep_out;
        cudaGraphEdgeData dep_data;
        size_t one_dep = 1;
        CHECK(cudaGraphNodeGetDependencies(dependent, &dep_out, &dep_data, &one_dep));
        EXPECT(one_dep == 1 && dep_out == primary &&
               dep_data.type == cudaGraphDependencyTypeProgrammatic);
        // a stream captured into the graph after the dependent, by a launch-order edge
        cudaGraphEdgeData launch_order = {};
        launch_order.from_port = cudaGraphKernelNodePortLaunchCompletion;
        CHECK(cudaStreamBeginCaptureToGraph(s, eg, &dependent, &launch_order, 1,
                                            cudaStreamCaptureModeGlobal));
        const cudaGraphNode_t *frontier_nodes;
        const cudaGraphEdgeData *frontier_edges;
        size_t frontier_size = 0;
        EXPECT_ERROR(cudaErrorLossyQuery,
                     cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &frontier_nodes,
                                              nullptr, &frontier_size));
        CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &frontier_nodes,
                                       &frontier_edges, &frontier_size));
        EXPECT(frontier_size == 1 && frontier_nodes[0] == dependent &&
               frontier_edges[0].from_port == cudaGraphKernelNodePortLaunchCompletion);
        add_k<<<(n + 127) / 128, 128, 0, s>>>(e, 1, n);
        cudaGraph_t same;
        CHECK(cudaStreamEndCapture(s, &same));
        EXPECT(same == eg);
        size_t after_count = 1;
        CHECK(cudaGraphNodeGetDependentNodes(dependent, &later, &dep_data, &after_count));
        EXPECT(after_count == 1 && dep_data.from_port == cudaGraphKernelNodePortLaunchCompletion);
        EXPECT_ERROR(cudaErrorInvalidValue,  // the edge has data: removing a default one fails
                     cudaGraphRemoveDependencies(eg, &primary, &dependent, nullptr, 1));
        cudaGraphExec_t eexec;
        CHECK(cudaGraphInstantiate(&eexec, eg, 0));
        CHECK(cudaGraphLaunch(eexec, s));
        std::vector<int> got(n);
        CHECK(cudaMemcpyAsync(got.data(), e, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) EXPECT(got[i] == 3 * 2 + 1);
        CHECK(cudaGraphRemoveDependencies(eg, &primary, &dependent, &programmatic, 1));
        CHECK(cudaGraphExecDestroy(eexec));
        CHECK(cudaGraphDestroy(eg));
        CHECK(cudaFree(e));
        printf("graphs: edge data kept, handed back and checked\n");
    }

    // ---- graphs launched by kernels: a tail launch runs after the launching grid's
    // fire-and-forget graph; a graph not uploaded or not made for device launch is refused
    {
        int *log, *codes;
        CHECK(cudaMalloc(&log, 8 * sizeof(int)));
        CHECK(cudaMalloc(&codes, 2 * sizeof(int)));
        cudaGraph_t tail_graph, child_graph;
        int one_id = 1, two_id = 2, three_id = 3;
        void *tail_args[] = {&log, &three_id}, *first_args[] = {&log, &one_id},
             *second_args[] = {&log, &two_id};
        CHECK(cudaGraphCreate(&tail_graph, 0));
        add_kernel(tail_graph, (void *)stamp, tail_args);
        CHECK(cudaGraphCreate(&child_graph, 0));  // two kernel nodes, in order
        cudaGraphNode_t first = add_kernel(child_graph, (void *)stamp, first_args);
        cudaGraphNode_t second = add_kernel(child_graph, (void *)stamp, second_args);
        CHECK(cudaGraphAddDependencies(child_graph, &first, &second, nullptr, 1));
        cudaGraphExec_t tail_exec, child_exec, host_only;
        CHECK(cudaGraphInstantiate(&tail_exec, tail_graph, cudaGraphInstantiateFlagDeviceLaunch));
        CHECK(cudaGraphInstantiate(&child_exec, child_graph,
                                   cudaGraphInstantiateFlagDeviceLaunch |
                                   cudaGraphInstantiateFlagUpload));
        CHECK(cudaGraphInstantiate(&host_only, tail_graph, 0));
        unsigned long long exec_flags = 0;
        CHECK(cudaGraphExecGetFlags(tail_exec, &exec_flags));
        EXPECT(exec_flags == cudaGraphInstantiateFlagDeviceLaunch);

        // the launching kernel runs in a graph, as CUDA requires of device launches
        auto run_launcher = [&](cudaGraphExec_t tail, cudaGraphExec_t child, int want_count,
                                const int *want, bool refused) {
            CHECK(cudaMemsetAsync(log, 0, 8 * sizeof(int), s));
            cudaGraph_t lg;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            launch_graphs<<<1, 1, 0, s>>>(tail, child, codes);
            CHECK(cudaStreamEndCapture(s, &lg));
            cudaGraphExec_t lexec;
            CHECK(cudaGraphInstantiate(&lexec, lg, 0));
            CHECK(cudaGraphLaunch(lexec, s));
            CHECK(cudaStreamSynchronize(s));
            int got_log[8], got_codes[2];
            CHECK(cudaMemcpy(got_log, log, sizeof got_log, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(got_codes, codes, sizeof got_codes, cudaMemcpyDeviceToHost));
            EXPECT(got_log[0] == want_count);
            for (int i = 0; i < want_count; i++) EXPECT(got_log[1 + i] == want[i]);
            EXPECT(refused ? got_codes[0] != cudaSuccess : got_codes[0] == cudaSuccess);
            EXPECT(got_codes[1] == cudaSuccess);
            CHECK(cudaGraphExecDestroy(lexec));
            CHECK(cudaGraphDestroy(lg));
        };
        const int child_only[] = {1, 2}, all_three[] = {1, 2, 3};
        run_launcher(tail_exec, child_exec, 2, child_only, true);  // tail graph not uploaded
        run_launcher(host_only, child_exec, 2, child_only, true);  // not for device launch
        CHECK(cudaGraphUpload(tail_exec, s));
        run_launcher(tail_exec, child_exec, 3, all_three, false);
        EXPECT_ERROR(cudaErrorInvalidValue,  // device graphs do not free on launch
                     cudaGraphInstantiate(&host_only, tail_graph,
                                          cudaGraphInstantiateFlagDeviceLaunch |
                                          cudaGraphInstantiateFlagAutoFreeOnLaunch));
        cudaGraph_t with_host;
        CHECK(cudaGraphCreate(&with_host, 0));
        cudaHostNodeParams count_params = {};
        count_params.fn = count_call;
        count_params.userData = &calls;
        cudaGraphNode_t host_step;
        CHECK(cudaGraphAddHostNode(&host_step, with_host, nullptr, 0, &count_params));
        cudaGraphExec_t refused_exec;
        EXPECT_ERROR(cudaErrorInvalidValue,  // a kernel cannot run a host node
                     cudaGraphInstantiate(&refused_exec, with_host,
                                          cudaGraphInstantiateFlagDeviceLaunch));
        CHECK(cudaGraphDestroy(with_host));
        CHECK(cudaGraphExecDestroy(tail_exec));
        CHECK(cudaGraphExecDestroy(child_exec));
        CHECK(cudaGraphExecDestroy(host_only));
        CHECK(cudaGraphDestroy(tail_graph));
        CHECK(cudaGraphDestroy(child_graph));
        printf("graphs: graphs launched by a kernel, tail after fire-and-forget\n");
    }

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
