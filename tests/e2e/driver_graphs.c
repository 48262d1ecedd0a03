/* CUDA graphs through the driver API: a graph built node by node (memset, kernels, a host
 * node, an empty join, a child graph, a copy to pinned memory, an event record), its
 * structure queried, launched twice, a kernel node updated in the executable graph and by
 * cuGraphExecUpdate; a stream capture spread over two streams by events; conditional nodes
 * (IF, WHILE) whose condition kernels set; a host-to-host copy node; edge data; a graph
 * launched by a kernel, one that finds its own handle (cuGraphExecGetFlags on it); a user
 * object whose destructor waits for the last launch holding it; CUDA's errors for misuse.
 * Every result is checked against values computed here. Usage: driver_graphs
 * KERNELS.ptx GRAPH_KERNELS.ptx (tests/e2e/kernels.cu: scale multiplies, add_bias adds 0.25;
 * tests/e2e/graph_kernels.cu: kernels that set conditions and launch graphs). */
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver_checks.h"
#include "test_files.h"
#include <unistd.h>

enum { N = 1000 };
static int host_runs, other_runs;

static void CUDA_CB count_run(void *data) { (*(int *)data)++; }

/* A user object's destructor notes what the graph copied to pinned memory by then. */
static atomic_int destroyed, go;
static float seen_at_destroy = -1.0f;
static void CUDA_CB destroy_object(void *data) {
    seen_at_destroy = *(volatile float *)data;
    atomic_fetch_add(&destroyed, 1);
}
static void CUDA_CB wait_for_go(void *data) {
    (void)data;
    while (!atomic_load(&go)) usleep(200);
}

#define EXPECT_CODE(expected, call) do { CUresult r_ = (call); if (r_ != (expected)) { \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, \
            (int)r_, (int)(expected)); return 1; } } while (0)

static int all_equal(const float *x, float want) {
    for (int i = 0; i < N; i++)
        if (x[i] != want) { fprintf(stderr, "x[%d] = %g, want %g\n", i, x[i], want); return 0; }
    return 1;
}

static CUDA_KERNEL_NODE_PARAMS kernel_params(CUfunction f, void **args) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = (N + 127) / 128; p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 128; p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = args;
    return p;
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction scale, add_bias;
    char *ptx = read_file(argc > 1 ? argv[1] : "kernels.ptx");
    EXPECT(ptx != NULL);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&scale, mod, "scale"));
    CHECK(cuModuleGetFunction(&add_bias, mod, "add_bias"));
    CUstream stream, side;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CUevent done, fork, join;
    CHECK(cuEventCreate(&done, 0));
    CHECK(cuEventCreate(&fork, 0));
    CHECK(cuEventCreate(&join, 0));
    CUdeviceptr x, y;
    CHECK(cuMemAlloc(&x, N * sizeof(float)));
    CHECK(cuMemAlloc(&y, N * sizeof(float)));
    float *out;
    CHECK(cuMemAllocHost((void **)&out, N * sizeof(float)));
    int n = N;
    float three = 3.0f, two = 2.0f;

    /* memset(1.0) -> scale(3) -> {host, add_bias} -> empty -> child{scale(2)} -> copy -> event */
    CUgraph graph, child;
    CUgraphNode set, times3, host, bias, joined, nested, copy, record, inner;
    CHECK(cuGraphCreate(&graph, 0));
    CUDA_MEMSET_NODE_PARAMS ms = {.dst = x, .pitch = 0, .value = 0x3f800000, .elementSize = 4,
                                  .width = N, .height = 1};
    CHECK(cuGraphAddMemsetNode(&set, graph, NULL, 0, &ms, ctx));
    void *scale3[] = {&x, &three, &n};
    CUDA_KERNEL_NODE_PARAMS kp = kernel_params(scale, scale3);
    CHECK(cuGraphAddKernelNode(&times3, graph, &set, 1, &kp));
    CUDA_HOST_NODE_PARAMS hp = {.fn = count_run, .userData = &host_runs};
    CHECK(cuGraphAddHostNode(&host, graph, &times3, 1, &hp));
    void *bias_args[] = {&x, &n};
    CUDA_KERNEL_NODE_PARAMS bp = kernel_params(add_bias, bias_args);
    CHECK(cuGraphAddKernelNode(&bias, graph, &times3, 1, &bp));
    CUgraphNode both[] = {host, bias};
    CHECK(cuGraphAddEmptyNode(&joined, graph, both, 2));
    CHECK(cuGraphCreate(&child, 0));
    void *scale2[] = {&x, &two, &n};
    CUDA_KERNEL_NODE_PARAMS cp = kernel_params(scale, scale2);
    CHECK(cuGraphAddKernelNode(&inner, child, NULL, 0, &cp));
    CHECK(cuGraphAddChildGraphNode(&nested, graph, &joined, 1, child));
    CHECK(cuGraphDestroy(child)); /* the node holds its own copy */
    CUDA_MEMCPY3D m;
    memset(&m, 0, sizeof m);
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE; m.srcDevice = x;
    m.dstMemoryType = CU_MEMORYTYPE_HOST; m.dstHost = out;
    m.WidthInBytes = N * sizeof(float); m.Height = 1; m.Depth = 1;
    CHECK(cuGraphAddMemcpyNode(&copy, graph, &nested, 1, &m, ctx));
    CHECK(cuGraphAddEventRecordNode(&record, graph, &copy, 1, done));

    size_t count = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &count));
    EXPECT(count == 8);
    CUgraphNode roots[4];
    count = 4;
    CHECK(cuGraphGetRootNodes(graph, roots, &count));
    EXPECT(count == 1 && roots[0] == set);
    CHECK(cuGraphGetEdges(graph, NULL, NULL, NULL, &count));
    EXPECT(count == 8);
    CUgraphNode deps[4];
    count = 4;
    CHECK(cuGraphNodeGetDependencies(joined, deps, NULL, &count));
    EXPECT(count == 2 && deps[0] == host && deps[1] == bias);
    count = 4;
    CHECK(cuGraphNodeGetDependentNodes(times3, deps, NULL, &count));
    EXPECT(count == 2);
    CUgraphNodeType type;
    CHECK(cuGraphNodeGetType(nested, &type));
    EXPECT(type == CU_GRAPH_NODE_TYPE_GRAPH);
    CHECK(cuGraphNodeGetType(host, &type));
    EXPECT(type == CU_GRAPH_NODE_TYPE_HOST);
    CUDA_KERNEL_NODE_PARAMS got;
    CHECK(cuGraphKernelNodeGetParams(times3, &got));
    EXPECT(got.func == scale && got.blockDimX == 128 && *(float *)got.kernelParams[1] == 3.0f);
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeGetParams(set, &got));
    printf("driver_graphs: structure queried\n");

    CUgraphExec exec;
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int launch = 0; launch < 2; launch++) CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuEventSynchronize(done));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(all_equal(out, (1.0f * 3 + 0.25f) * 2));
    EXPECT(host_runs == 2);
    printf("driver_graphs: built graph ran twice\n");

    float five = 5.0f;
    void *scale5[] = {&x, &five, &n};
    CUDA_KERNEL_NODE_PARAMS kp5 = kernel_params(scale, scale5);
    CHECK(cuGraphExecKernelNodeSetParams(exec, times3, &kp5));
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(all_equal(out, (1.0f * 5 + 0.25f) * 2));

    CUgraph edited;
    CUgraphNode twin;
    CHECK(cuGraphClone(&edited, graph));
    CHECK(cuGraphNodeFindInClone(&twin, times3, edited));
    float seven = 7.0f;
    void *scale7[] = {&x, &seven, &n};
    CUDA_KERNEL_NODE_PARAMS kp7 = kernel_params(scale, scale7);
    CHECK(cuGraphKernelNodeSetParams(twin, &kp7));
    CUgraphExecUpdateResultInfo info;
    CHECK(cuGraphExecUpdate(exec, edited, &info));
    EXPECT(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS);
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(all_equal(out, (1.0f * 7 + 0.25f) * 2));
    int runs_before = host_runs;
    CUDA_HOST_NODE_PARAMS other = {.fn = count_run, .userData = &other_runs};
    CHECK(cuGraphExecHostNodeSetParams(exec, host, &other));
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(other_runs == 1 && host_runs == runs_before);
    CUgraphNode extra;
    CHECK(cuGraphAddEmptyNode(&extra, edited, NULL, 0));
    EXPECT_CODE(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(exec, edited, &info));
    EXPECT(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    printf("driver_graphs: kernel node parameters updated\n");

    /* capture: memset x and y on stream; fork to side (scale y by 4) while stream scales x
     * by 3; join; add_bias on x. */
    CUstreamCaptureStatus status;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamIsCapturing(stream, &status));
    EXPECT(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(cuMemsetD32Async(x, 0x40000000, N, stream)); /* 2.0f */
    CHECK(cuMemsetD32Async(y, 0x40000000, N, stream));
    CHECK(cuEventRecord(fork, stream));
    CHECK(cuStreamWaitEvent(side, fork, 0));
    float four = 4.0f;
    void *scale_y[] = {&y, &four, &n};
    CHECK(cuLaunchKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, side, scale_y, NULL));
    CHECK(cuLaunchKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, stream, scale3, NULL));
    CUdeviceptr scratch;
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&scratch, 64));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    CHECK(cuMemAlloc(&scratch, 64)); /* this thread relaxed: allowed */
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == CU_STREAM_CAPTURE_MODE_RELAXED);
    CHECK(cuEventRecord(join, side));
    EXPECT_CODE(CUDA_ERROR_CAPTURED_EVENT, cuEventQuery(join));
    CHECK(cuStreamWaitEvent(stream, join, 0));
    CHECK(cuLaunchKernel(add_bias, (N + 127) / 128, 1, 1, 128, 1, 1, 0, stream, bias_args,
                         NULL));
    const CUgraphNode *frontier;
    size_t frontier_size = 0;
    cuuint64_t capture_id;
    CHECK(cuStreamGetCaptureInfo(stream, &status, &capture_id, NULL, &frontier, NULL,
                                 &frontier_size));
    EXPECT(status == CU_STREAM_CAPTURE_STATUS_ACTIVE && frontier_size == 1);
    CUgraph captured;
    CHECK(cuStreamEndCapture(stream, &captured));
    CHECK(cuStreamIsCapturing(side, &status));
    EXPECT(status == CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK(cuGraphGetNodes(captured, NULL, &count));
    EXPECT(count == 5);
    CHECK(cuGraphGetRootNodes(captured, NULL, &count));
    EXPECT(count == 1);
    CUgraphExec captured_exec;
    CHECK(cuGraphInstantiate(&captured_exec, captured, 0));
    CHECK(cuGraphLaunch(captured_exec, stream));
    CHECK(cuStreamSynchronize(stream)); /* a non-blocking stream: the copy would not wait */
    CHECK(cuMemcpyDtoH(out, x, N * sizeof(float)));
    EXPECT(all_equal(out, 2.0f * 3 + 0.25f));
    CHECK(cuMemcpyDtoH(out, y, N * sizeof(float)));
    EXPECT(all_equal(out, 2.0f * 4));
    /* a cooperative launch captured: a kernel node that launches cooperatively */
    CUgraph cooperative;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchCooperativeKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, stream,
                                    scale3));
    CHECK(cuStreamEndCapture(stream, &cooperative));
    CHECK(cuGraphGetNodes(cooperative, NULL, &count));
    EXPECT(count == 1);
    CUgraphExec cooperative_exec;
    CHECK(cuGraphInstantiate(&cooperative_exec, cooperative, 0));
    CHECK(cuGraphLaunch(cooperative_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(out, x, N * sizeof(float)));
    EXPECT(all_equal(out, (2.0f * 3 + 0.25f) * 3));
    CHECK(cuGraphExecDestroy(cooperative_exec));
    CHECK(cuGraphDestroy(cooperative));
    printf("driver_graphs: captured graph ran\n");

    /* memory nodes: alloc -> memset(1.0) -> scale(3) -> copy to pinned -> free */
    CUgraph with_memory;
    CUgraphNode alloc_node, free_node, fill, triple, fetch;
    CHECK(cuGraphCreate(&with_memory, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.bytesize = N * sizeof(float);
    CHECK(cuGraphAddMemAllocNode(&alloc_node, with_memory, NULL, 0, &ap));
    EXPECT(ap.dptr != 0);
    CUdeviceptr graph_memory = ap.dptr;
    cuuint64_t used = 0;
    CHECK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used == N * sizeof(float));
    CUDA_MEMSET_NODE_PARAMS fill_params = ms;
    fill_params.dst = graph_memory;
    CHECK(cuGraphAddMemsetNode(&fill, with_memory, &alloc_node, 1, &fill_params, ctx));
    void *scale_graph_memory[] = {&graph_memory, &three, &n};
    CUgraphNodeParams generic; /* the CUDA 12 way: one struct for every node type */
    memset(&generic, 0, sizeof generic);
    generic.type = CU_GRAPH_NODE_TYPE_KERNEL;
    generic.kernel.func = scale;
    generic.kernel.gridDimX = (N + 127) / 128; generic.kernel.gridDimY = 1;
    generic.kernel.gridDimZ = 1;
    generic.kernel.blockDimX = 128; generic.kernel.blockDimY = generic.kernel.blockDimZ = 1;
    generic.kernel.kernelParams = scale_graph_memory;
    CHECK(cuGraphAddNode(&triple, with_memory, &fill, NULL, 1, &generic));
    m.srcDevice = graph_memory;
    CHECK(cuGraphAddMemcpyNode(&fetch, with_memory, &triple, 1, &m, ctx));
    CHECK(cuGraphAddMemFreeNode(&free_node, with_memory, &fetch, 1, graph_memory));
    CUDA_MEM_ALLOC_NODE_PARAMS ap_got;
    CHECK(cuGraphMemAllocNodeGetParams(alloc_node, &ap_got));
    EXPECT(ap_got.dptr == graph_memory && ap_got.bytesize == N * sizeof(float));
    CUdeviceptr freed = 0;
    CHECK(cuGraphMemFreeNodeGetParams(free_node, &freed));
    EXPECT(freed == graph_memory);
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphAddMemFreeNode(&extra, with_memory, NULL, 0, x));
    CUgraphExec memory_exec;
    CHECK(cuGraphInstantiateWithFlags(&memory_exec, with_memory, 0));
    memset(out, 0, N * sizeof(float));
    CHECK(cuGraphLaunch(memory_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(all_equal(out, 3.0f));
    void *scale_graph_memory5[] = {&graph_memory, &five, &n};
    generic.kernel.kernelParams = scale_graph_memory5;
    CHECK(cuGraphExecNodeSetParams(memory_exec, triple, &generic));
    CHECK(cuGraphDestroy(with_memory)); /* the executable graph keeps what it needs */
    CHECK(cuGraphLaunch(memory_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    EXPECT(all_equal(out, 5.0f));
    CHECK(cuGraphExecDestroy(memory_exec)); /* the last holder: the free node frees it */
    CHECK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used == 0);
    CHECK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &used));
    EXPECT(used == N * sizeof(float));
    CHECK(cuDeviceGraphMemTrim(dev));
    printf("driver_graphs: memory nodes ran\n");

    /* conditional nodes: IF runs its body when the kernel before it sets the condition;
     * WHILE (condition 1 at each launch) counts down until its kernel clears it */
    CUmodule cond_mod;
    CUfunction set_condition, count_down;
    char *cond_ptx = read_file(argc > 2 ? argv[2] : "graph_kernels.ptx");
    EXPECT(cond_ptx != NULL);
    CHECK(cuModuleLoadData(&cond_mod, cond_ptx));
    CHECK(cuModuleGetFunction(&set_condition, cond_mod, "set_condition"));
    CHECK(cuModuleGetFunction(&count_down, cond_mod, "count_down"));
    CUdeviceptr flag, left, steps;
    CHECK(cuMemAlloc(&flag, sizeof(int)));
    CHECK(cuMemAlloc(&left, sizeof(int)));
    CHECK(cuMemAlloc(&steps, sizeof(int)));
    CUgraph cond_graph, if_body, while_body;
    CHECK(cuGraphCreate(&cond_graph, 0));
    CUgraphConditionalHandle if_handle, while_handle;
    CHECK(cuGraphConditionalHandleCreate(&if_handle, cond_graph, ctx, 0, 0));
    CHECK(cuGraphConditionalHandleCreate(&while_handle, cond_graph, ctx, 1,
                                         CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUDA_MEMSET_NODE_PARAMS ones = ms; /* x = 1.0f */
    CUgraphNode reset, setter, if_node, while_node, body_node;
    CHECK(cuGraphAddMemsetNode(&reset, cond_graph, NULL, 0, &ones, ctx));
    void *set_args[] = {&if_handle, &flag};
    CUDA_KERNEL_NODE_PARAMS sp = kernel_params(set_condition, set_args);
    sp.gridDimX = 1; sp.blockDimX = 1;
    CHECK(cuGraphAddKernelNode(&setter, cond_graph, &reset, 1, &sp));
    CUgraphNodeParams cond;
    memset(&cond, 0, sizeof cond);
    cond.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    cond.conditional.handle = if_handle;
    cond.conditional.type = CU_GRAPH_COND_TYPE_IF;
    cond.conditional.size = 1;
    cond.conditional.phGraph_out = &if_body;
    cond.conditional.ctx = ctx;
    CHECK(cuGraphAddNode(&if_node, cond_graph, &setter, NULL, 1, &cond));
    CUDA_KERNEL_NODE_PARAMS body_scale = kernel_params(scale, scale3); /* x *= 3 */
    CHECK(cuGraphAddKernelNode(&body_node, if_body, NULL, 0, &body_scale));
    cond.conditional.handle = while_handle;
    cond.conditional.type = CU_GRAPH_COND_TYPE_WHILE;
    cond.conditional.phGraph_out = &while_body;
    CHECK(cuGraphAddNode(&while_node, cond_graph, &if_node, NULL, 1, &cond));
    void *down_args[] = {&while_handle, &left, &steps};
    CUDA_KERNEL_NODE_PARAMS dp = kernel_params(count_down, down_args);
    dp.gridDimX = 1; dp.blockDimX = 1;
    CHECK(cuGraphAddKernelNode(&body_node, while_body, NULL, 0, &dp));
    CHECK(cuGraphNodeGetType(while_node, &type));
    EXPECT(type == CU_GRAPH_NODE_TYPE_CONDITIONAL);
    CUgraphExec cond_exec;
    CHECK(cuGraphInstantiate(&cond_exec, cond_graph, 0));
    for (int round = 0; round < 2; round++) {
        int flag_value = round == 0 ? 3 : 0, start = 4 + round, zero = 0, got_left, got_steps;
        CHECK(cuMemcpyHtoD(flag, &flag_value, sizeof(int)));
        CHECK(cuMemcpyHtoD(left, &start, sizeof(int)));
        CHECK(cuMemcpyHtoD(steps, &zero, sizeof(int)));
        CHECK(cuGraphLaunch(cond_exec, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemcpyDtoH(out, x, N * sizeof(float)));
        EXPECT(all_equal(out, flag_value ? 3.0f : 1.0f));
        CHECK(cuMemcpyDtoH(&got_left, left, sizeof(int)));
        CHECK(cuMemcpyDtoH(&got_steps, steps, sizeof(int)));
        EXPECT(got_left == 0 && got_steps == start);
    }
    cond.conditional.type = CU_GRAPH_COND_TYPE_SWITCH;
    cond.conditional.size = 0;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphAddNode(&extra, cond_graph, NULL, NULL, 0,
                                                         &cond));
    cond.conditional.size = 1;
    cond.conditional.handle = 0;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphAddNode(&extra, cond_graph, NULL, NULL, 0,
                                                         &cond));
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(if_body)); /* the node owns it */
    CHECK(cuGraphExecDestroy(cond_exec));
    CHECK(cuGraphDestroy(cond_graph));
    printf("driver_graphs: conditional nodes ran\n");

    /* a host-to-host copy node, after a copy to pinned memory, at each launch */
    CUgraph host_copies;
    CUgraphNode to_pinned, to_pageable;
    CHECK(cuGraphCreate(&host_copies, 0));
    CUDA_MEMCPY3D d2h = m;
    d2h.srcDevice = y;
    CHECK(cuGraphAddMemcpyNode(&to_pinned, host_copies, NULL, 0, &d2h, ctx));
    float *pageable = calloc(N, sizeof(float));
    CUDA_MEMCPY3D h2h = m;
    h2h.srcMemoryType = CU_MEMORYTYPE_HOST; h2h.srcHost = out;
    h2h.dstMemoryType = CU_MEMORYTYPE_HOST; h2h.dstHost = pageable;
    CHECK(cuGraphAddMemcpyNode(&to_pageable, host_copies, &to_pinned, 1, &h2h, ctx));
    CUgraphExec host_copies_exec;
    CHECK(cuGraphInstantiate(&host_copies_exec, host_copies, 0));
    for (int round = 1; round <= 2; round++) {
        CHECK(cuMemsetD32(y, round == 1 ? 0x41000000 : 0x41100000, N)); /* 8.0f, 9.0f */
        CHECK(cuGraphLaunch(host_copies_exec, stream));
        CHECK(cuStreamSynchronize(stream));
        EXPECT(all_equal(pageable, round == 1 ? 8.0f : 9.0f));
    }
    CHECK(cuGraphExecDestroy(host_copies_exec));
    CHECK(cuGraphDestroy(host_copies));
    free(pageable);
    printf("driver_graphs: host-to-host copy node ran\n");

    /* edge data: a programmatic edge added between two kernel nodes, handed back by the
     * _v2 queries (the plain query refuses to lose it), then a capture continuing from it */
    CUgraph edged;
    CUgraphNode first, second;
    CHECK(cuGraphCreate(&edged, 0));
    CUgraphNode edged_set;
    CHECK(cuGraphAddMemsetNode(&edged_set, edged, NULL, 0, &ones, ctx)); /* x = 1.0f */
    CUDA_KERNEL_NODE_PARAMS kp3 = kernel_params(scale, scale3);
    CHECK(cuGraphAddKernelNode(&first, edged, &edged_set, 1, &kp3));
    CHECK(cuGraphAddKernelNode(&second, edged, NULL, 0, &bp));
    CUgraphEdgeData programmatic;
    memset(&programmatic, 0, sizeof programmatic);
    programmatic.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE,  /* only kernel nodes' edges leave other ports */
                cuGraphAddDependencies_v2(edged, &edged_set, &second, &programmatic, 1));
    CHECK(cuGraphAddDependencies_v2(edged, &first, &second, &programmatic, 1));
    CUgraphNode from[2], to[2];
    CUgraphEdgeData data[2];
    count = 2;
    EXPECT_CODE(CUDA_ERROR_LOSSY_QUERY, cuGraphGetEdges(edged, from, to, NULL, &count));
    count = 2;
    CHECK(cuGraphGetEdges(edged, from, to, data, &count));
    EXPECT(count == 2 && from[1] == first && to[1] == second &&
           data[1].type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC && data[0].type == 0);
    CHECK(cuStreamBeginCaptureToGraph(stream, edged, NULL, NULL, 0,
                                      CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamUpdateCaptureDependencies_v2(stream, &second, &programmatic, 1,
                                               CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    CHECK(cuLaunchKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, stream, scale2, NULL));
    CHECK(cuStreamEndCapture(stream, &edged));
    CUgraphNode last;
    count = 1;
    CHECK(cuGraphNodeGetDependentNodes(second, &last, data, &count));
    EXPECT(count == 1 && data[0].type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
    CUgraphExec edged_exec;
    CHECK(cuGraphInstantiate(&edged_exec, edged, 0));
    CHECK(cuGraphLaunch(edged_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(out, x, N * sizeof(float)));
    EXPECT(all_equal(out, (1.0f * 3 + 0.25f) * 2));
    CHECK(cuGraphExecDestroy(edged_exec));
    CHECK(cuGraphDestroy(edged));
    printf("driver_graphs: edge data kept\n");

    /* a graph launched by a kernel (of a graph): uploaded, then launched fire-and-forget */
    CUfunction launch_graph;
    CHECK(cuModuleGetFunction(&launch_graph, cond_mod, "launch_graph"));
    CUgraph device_graph, launcher_graph;
    CUgraphNode scaled, launcher;
    CHECK(cuGraphCreate(&device_graph, 0));
    CUDA_KERNEL_NODE_PARAMS scale3_params = kernel_params(scale, scale3);
    CHECK(cuGraphAddKernelNode(&scaled, device_graph, NULL, 0, &scale3_params));
    CUgraphExec device_exec, launcher_exec;
    CHECK(cuGraphInstantiateWithFlags(&device_exec, device_graph,
                                      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH));
    CHECK(cuGraphCreate(&launcher_graph, 0));
    CUdeviceptr code;
    CHECK(cuMemAlloc(&code, sizeof(int)));
    void *launch_args[] = {&device_exec, &code};
    CUDA_KERNEL_NODE_PARAMS lp = kernel_params(launch_graph, launch_args);
    lp.gridDimX = 1; lp.blockDimX = 1;
    CHECK(cuGraphAddKernelNode(&launcher, launcher_graph, NULL, 0, &lp));
    CHECK(cuGraphInstantiate(&launcher_exec, launcher_graph, 0));
    for (int round = 0; round < 2; round++) {
        int got_code = -1;
        CHECK(cuMemsetD32(x, 0x3f800000, N)); /* 1.0f */
        if (round == 1) CHECK(cuGraphUpload(device_exec, stream));
        CHECK(cuGraphLaunch(launcher_exec, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuMemcpyDtoH(out, x, N * sizeof(float)));
        CHECK(cuMemcpyDtoH(&got_code, code, sizeof(int)));
        /* not uploaded yet: refused, and nothing ran */
        EXPECT(round == 0 ? got_code != 0 && all_equal(out, 1.0f)
                          : got_code == 0 && all_equal(out, 3.0f));
    }
    CHECK(cuGraphExecDestroy(launcher_exec));
    CHECK(cuGraphExecDestroy(device_exec));
    CHECK(cuGraphDestroy(launcher_graph));
    CHECK(cuGraphDestroy(device_graph));
    printf("driver_graphs: graph launched by a kernel\n");

    /* a device graph's kernel finds its graph (cudaGetCurrentGraphExec), a plain launch
     * of it finds none */
    CUfunction record_current;
    CHECK(cuModuleGetFunction(&record_current, cond_mod, "record_current_graph"));
    CUdeviceptr current;
    CHECK(cuMemAlloc(&current, sizeof(unsigned long long)));
    void *current_args[] = {&current};
    CUDA_KERNEL_NODE_PARAMS rp = kernel_params(record_current, current_args);
    rp.gridDimX = 1; rp.blockDimX = 1;
    CUgraph finder;
    CUgraphNode finder_node;
    CUgraphExec finder_exec;
    CHECK(cuGraphCreate(&finder, 0));
    CHECK(cuGraphAddKernelNode(&finder_node, finder, NULL, 0, &rp));
    CHECK(cuGraphInstantiateWithFlags(&finder_exec, finder,
                                      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH));
    CHECK(cuGraphLaunch(finder_exec, stream));
    CHECK(cuStreamSynchronize(stream));
    unsigned long long found = 0;
    CHECK(cuMemcpyDtoH(&found, current, sizeof found));
    EXPECT(found == (unsigned long long)(uintptr_t)finder_exec);
    cuuint64_t found_flags = 0;
    CHECK(cuGraphExecGetFlags((CUgraphExec)(uintptr_t)found, &found_flags));
    EXPECT(found_flags == CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH);
    CHECK(cuLaunchKernel(record_current, 1, 1, 1, 1, 1, 1, 0, stream, current_args, NULL));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(&found, current, sizeof found));
    EXPECT(found == 0);
    CHECK(cuGraphExecDestroy(finder_exec));
    CHECK(cuGraphDestroy(finder));
    CHECK(cuMemFree(current));
    printf("driver_graphs: a device graph found its own handle\n");

    /* a user object moved into a graph: destroyed once its executable graph is, and only
     * after that graph's launch (held back by a host function) has run */
    CUuserObject object;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuUserObjectCreate(&object, out, destroy_object, 1, 0));
    CHECK(cuUserObjectCreate(&object, out, destroy_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuUserObjectRelease(object, 0));
    CUgraph owner;
    CUgraphNode owner_set, owner_scale, owner_copy;
    CHECK(cuGraphCreate(&owner, 0));
    CHECK(cuGraphAddMemsetNode(&owner_set, owner, NULL, 0, &ms, ctx)); /* x = 1.0f */
    CHECK(cuGraphAddKernelNode(&owner_scale, owner, &owner_set, 1, &kp)); /* x *= 3 */
    CUDA_MEMCPY3D to_out = m;
    to_out.srcDevice = x;
    CHECK(cuGraphAddMemcpyNode(&owner_copy, owner, &owner_scale, 1, &to_out, ctx));
    CHECK(cuGraphRetainUserObject(owner, object, 1, CU_GRAPH_USER_OBJECT_MOVE));
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphReleaseUserObject(owner, object, 2));
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuUserObjectRelease(object, 1)); /* the graph's */
    CUgraphExec owner_exec;
    CHECK(cuGraphInstantiate(&owner_exec, owner, 0));
    CHECK(cuGraphDestroy(owner));
    out[0] = 0.0f;
    CHECK(cuLaunchHostFunc(stream, wait_for_go, NULL));
    CHECK(cuGraphLaunch(owner_exec, stream));
    CHECK(cuGraphExecDestroy(owner_exec));
    usleep(20000);
    EXPECT(atomic_load(&destroyed) == 0); /* its launch is still held back */
    atomic_store(&go, 1);
    CHECK(cuStreamSynchronize(stream));
    for (int i = 0; i < 5000 && atomic_load(&destroyed) == 0; i++) usleep(1000);
    EXPECT(atomic_load(&destroyed) == 1 && seen_at_destroy == 3.0f);
    printf("driver_graphs: user object destroyed after its graph's launch\n");

    /* misuse */
    CUgraph none;
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CODE(CUDA_ERROR_ILLEGAL_STATE, cuStreamEndCapture(stream, &none));
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CODE(CUDA_ERROR_ILLEGAL_STATE,
                cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuEventRecord(fork, stream));
    CHECK(cuStreamWaitEvent(side, fork, 0));
    CHECK(cuLaunchKernel(scale, 1, 1, 1, 32, 1, 1, 0, side, scale_y, NULL));
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cuStreamEndCapture(side, &none));
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cuStreamEndCapture(stream, &none));
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(stream));
    EXPECT_CODE(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(stream, &none));
    EXPECT(none == NULL);
    kp.blockDimX = 4096;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphAddKernelNode(&extra, graph, NULL, 0, &kp));
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&extra, graph, &twin, 1));
    /* a graph with a host node is no device graph: instantiating says which node */
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH};
    CUgraphExec refused;
    EXPECT_CODE(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiateWithParams(&refused, graph, &ip));
    EXPECT(ip.result_out == CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED);
    EXPECT(ip.hErrNode_out == host);
    printf("driver_graphs: misuse refused\n");

    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphExecDestroy(captured_exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuGraphDestroy(edited));
    CHECK(cuGraphDestroy(captured));
    CHECK(cuCtxSynchronize());
    printf("driver_graphs: all checks passed\n");
    return 0;
}
