// What graphs hold and what they launch: user objects (a destructor run when the last
// reference goes, never before the launches of a graph holding it have finished; references
// moved, cloned, held by child graph nodes and executable graphs), and device graphs: the
// order of tail launches (after the whole launching graph and its fire-and-forget work, one
// at a time, a tail graph's own tail launches first), a device graph of a memset, a kernel
// and a copy launched by a kernel, and cudaGetCurrentGraphExec, which a kernel of a device
// graph uses to launch its graph again. Results are checked against orders and values
// worked out on the host.
#include <atomic>
#include <cstring>
#include <unistd.h>
#include "check.cuh"

__global__ void add_k(int *v, int k) { *v += k; }

// Device graphs: log[0] counts entries, which follow it in the order they came; a launch
// that fails logs -1.
__device__ void log_id(int *log, int id) { log[1 + atomicAdd(log, 1)] = id; }
__device__ void launch_or_log(int *log, cudaGraphExec_t graph, cudaStream_t mode) {
    if (graph && cudaGraphLaunch(graph, mode) != cudaSuccess) log_id(log, -1);
}

__global__ void stamp(int *log, int id) { log_id(log, id); }

__global__ void stamp_then_tail(int *log, int id, cudaGraphExec_t first,
                                cudaGraphExec_t second) {
    log_id(log, id);
    launch_or_log(log, first, cudaStreamGraphTailLaunch);
    launch_or_log(log, second, cudaStreamGraphTailLaunch);
}

__global__ void stamp_then_fire(int *log, int id, cudaGraphExec_t graph) {
    log_id(log, id);
    launch_or_log(log, graph, cudaStreamGraphFireAndForget);
}

// Records the graph it runs in, and relaunches it as its own tail until it ran 3 times.
__global__ void relaunch_self(unsigned long long *seen, int *runs) {
    cudaGraphExec_t current = cudaGetCurrentGraphExec();
    seen[*runs] = (unsigned long long)current;
    if (++*runs < 3 && cudaGraphLaunch(current, cudaStreamGraphTailLaunch) != cudaSuccess)
        *runs = -100;
}

// ---------------------------------------------------------------- user objects

struct Resource {
    const int *watched;       // what the graph's kernel writes (mapped pinned memory)
    std::atomic<int> destroyed{0};
    int watched_at_destroy = -1;
};

static void destroy_resource(void *data) {
    Resource *r = static_cast<Resource *>(data);
    r->watched_at_destroy = *(volatile const int *)r->watched;
    r->destroyed.fetch_add(1);
}

// A destructor runs asynchronously (as CUDA says): wait a bounded while for it.
static bool destroyed_within(Resource &r, int times) {
    for (int i = 0; i < 5000 && r.destroyed.load() < times; i++) usleep(1000);
    return r.destroyed.load() == times;
}

static void count_run(void *data) { ++*static_cast<int *>(data); }

// What a host node saw of a log kernels write (log[0] counts its entries).
struct LogSeen {
    const int *log;
    int count;
};
static void count_entries(void *data) {
    LogSeen *seen = static_cast<LogSeen *>(data);
    seen->count = *(volatile const int *)seen->log;
}

static std::atomic<int> go{0};
static void wait_for_go(void *) {
    while (!go.load()) usleep(200);
}

static void user_objects(cudaStream_t s) {
    int *watched, *watched_dev;
    CHECK(cudaHostAlloc(&watched, sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&watched_dev, watched, 0));
    *watched = 0;
    Resource r;
    r.watched = watched;
    cudaUserObject_t obj;
    EXPECT_ERROR(cudaErrorInvalidValue,  // the one flag CUDA requires
                 cudaUserObjectCreate(&obj, &r, destroy_resource, 1, 0));
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaUserObjectCreate(&obj, &r, destroy_resource, 0,
                                      cudaUserObjectNoDestructorSync));
    EXPECT_ERROR(cudaErrorInvalidValue,
                 cudaUserObjectCreate(&obj, &r, nullptr, 1, cudaUserObjectNoDestructorSync));
    CHECK(cudaUserObjectCreate(&obj, &r, destroy_resource, 1, cudaUserObjectNoDestructorSync));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaUserObjectRetain(obj, 0));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaUserObjectRelease(obj, 2));  // the program owns 1

    // The program's reference moves to a graph whose kernel writes `watched`.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaKernelNodeParams p = {};
    int five = 5;
    void *args[] = {&watched_dev, &five};
    p.func = (void *)add_k;
    p.gridDim = p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &p));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphRetainUserObject(g, obj, 1, 2));  // no flag 2
    CHECK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaUserObjectRelease(obj, 1));  // now the graph's
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphReleaseUserObject(g, obj, 2));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));  // holds references of its own
    CHECK(cudaGraphDestroy(g));
    EXPECT(r.destroyed.load() == 0);

    // The stream is held by a host function until `go`: the graph launched behind it
    // cannot have run when its executable graph, the last holder, is destroyed.
    CHECK(cudaLaunchHostFunc(s, wait_for_go, nullptr));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaGraphExecDestroy(exec));
    usleep(20000);
    EXPECT(r.destroyed.load() == 0);  // the launch has not run yet
    go.store(1);
    CHECK(cudaStreamSynchronize(s));
    EXPECT(destroyed_within(r, 1));
    EXPECT(r.watched_at_destroy == 5);  // it ran after the graph's kernel
    EXPECT(*watched == 5);

    // References counted across clones, child graph nodes and the program's own.
    Resource q;
    q.watched = watched;
    CHECK(cudaUserObjectCreate(&obj, &q, destroy_resource, 2, cudaUserObjectNoDestructorSync));
    cudaGraph_t held, copy, parent;
    CHECK(cudaGraphCreate(&held, 0));
    CHECK(cudaGraphRetainUserObject(held, obj, 3, 0));  // the program's 2, held's 3
    CHECK(cudaGraphClone(&copy, held));                  // the copy's 3
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t child;
    CHECK(cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, held));  // the child's 3
    CHECK(cudaGraphReleaseUserObject(held, obj, 1));
    EXPECT_ERROR(cudaErrorInvalidValue, cudaGraphReleaseUserObject(held, obj, 3));
    CHECK(cudaGraphDestroy(held));
    CHECK(cudaGraphDestroy(copy));
    CHECK(cudaUserObjectRelease(obj, 2));                // left: the child node's 3
    EXPECT(q.destroyed.load() == 0);
    cudaGraphExec_t parent_exec;
    CHECK(cudaGraphInstantiate(&parent_exec, parent, 0));
    CHECK(cudaGraphDestroy(parent));                     // the executable's copy's 3
    EXPECT(q.destroyed.load() == 0);
    CHECK(cudaGraphLaunch(parent_exec, s));              // an empty child graph: nothing
    CHECK(cudaGraphExecDestroy(parent_exec));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(destroyed_within(q, 1));
    CHECK(cudaFreeHost(watched));
    printf("graph_lifetimes: user objects destroyed after the last reference and launch\n");
}

// ---------------------------------------------------------------- device graphs

static cudaGraph_t one_kernel_graph(void *func, void **args) {
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &p));
    return graph;
}

static cudaGraphExec_t for_device(cudaGraph_t graph) {
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch |
                                              cudaGraphInstantiateFlagUpload));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

static void expect_log(int *log, const int *want, int count) {
    int got[16];
    CHECK(cudaMemcpy(got, log, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got[0] == count);
    for (int i = 0; i < count; i++) {
        if (got[1 + i] != want[i]) fprintf(stderr, "entry %d: %d, not %d\n", i, got[1 + i], want[i]);
        EXPECT(got[1 + i] == want[i]);
    }
}

static void device_graphs(cudaStream_t s) {
    int *log;
    CHECK(cudaMalloc(&log, 16 * sizeof(int)));
    cudaGraphExec_t none = nullptr;
    int id_x = 11, id_t1 = 10, id_t2 = 20, id_f = 5, id_a = 1, id_b = 2;
    void *x_args[] = {&log, &id_x}, *t2_args[] = {&log, &id_t2}, *f_args[] = {&log, &id_f};
    cudaGraphExec_t x = for_device(one_kernel_graph((void *)stamp, x_args));
    void *t1_args[] = {&log, &id_t1, &x, &none};
    cudaGraphExec_t t1 = for_device(one_kernel_graph((void *)stamp_then_tail, t1_args));
    cudaGraphExec_t t2 = for_device(one_kernel_graph((void *)stamp, t2_args));
    cudaGraphExec_t f = for_device(one_kernel_graph((void *)stamp, f_args));
    // D: A (tail-launches T1, then T2) -> B (launches F fire-and-forget)
    void *a_args[] = {&log, &id_a, &t1, &t2}, *b_args[] = {&log, &id_b, &f};
    cudaGraph_t dg = one_kernel_graph((void *)stamp_then_tail, a_args);
    cudaGraphNode_t a_node, b_node;
    size_t one = 1;
    CHECK(cudaGraphGetNodes(dg, &a_node, &one));
    cudaKernelNodeParams bp = {};
    bp.func = (void *)stamp_then_fire;
    bp.gridDim = bp.blockDim = dim3(1);
    bp.kernelParams = b_args;
    CHECK(cudaGraphAddKernelNode(&b_node, dg, &a_node, 1, &bp));
    cudaGraphExec_t d = for_device(dg);

    // D launched from the host: its tail launches run once A, B and F are done, T1's own
    // tail launch (X) before T2, which was enqueued earlier.
    const int from_host[] = {1, 2, 5, 10, 11, 20};
    CHECK(cudaMemsetAsync(log, 0, 16 * sizeof(int), s));
    CHECK(cudaGraphLaunch(d, s));
    CHECK(cudaStreamSynchronize(s));
    expect_log(log, from_host, 6);

    // D tail-launched by a kernel of a host graph: after that whole graph (a host node,
    // then a kernel that logs 99 first).
    const int from_graph[] = {98, 99, 1, 2, 5, 10, 11, 20};
    cudaGraph_t hg;
    int host_runs = 0;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    stamp_then_tail<<<1, 1, 0, s>>>(log, 98, d, nullptr);
    CHECK(cudaLaunchHostFunc(s, count_run, &host_runs));
    stamp<<<1, 1, 0, s>>>(log, 99);
    CHECK(cudaStreamEndCapture(s, &hg));
    cudaGraphExec_t h;
    CHECK(cudaGraphInstantiate(&h, hg, 0));
    for (int round = 0; round < 2; round++) {  // each launch has its own tail launches
        CHECK(cudaMemsetAsync(log, 0, 16 * sizeof(int), s));
        CHECK(cudaGraphLaunch(h, s));
        CHECK(cudaStreamSynchronize(s));
        expect_log(log, from_graph, 8);
    }
    EXPECT(host_runs == 2);
    CHECK(cudaGraphExecDestroy(h));
    CHECK(cudaGraphDestroy(hg));

    // A host node after the last kernel of a host graph runs before that kernel's tail
    // launch, which waits for the whole graph: it sees the kernel's entry only (the log is
    // mapped pinned memory, which the host reads as kernels write it).
    int *seen_log, *seen_log_dev;
    CHECK(cudaHostAlloc(&seen_log, 16 * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&seen_log_dev, seen_log, 0));
    int id_y = 30;
    void *y_args[] = {&seen_log_dev, &id_y};
    cudaGraphExec_t y = for_device(one_kernel_graph((void *)stamp, y_args));
    LogSeen host_saw = {seen_log, -1};
    cudaGraph_t tg;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    stamp_then_tail<<<1, 1, 0, s>>>(seen_log_dev, 31, y, nullptr);
    CHECK(cudaLaunchHostFunc(s, count_entries, &host_saw));
    CHECK(cudaStreamEndCapture(s, &tg));
    cudaGraphExec_t t;
    CHECK(cudaGraphInstantiate(&t, tg, 0));
    for (int round = 0; round < 2; round++) {
        memset(seen_log, 0, 16 * sizeof(int));
        host_saw.count = -1;
        CHECK(cudaGraphLaunch(t, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(host_saw.count == 1);
        EXPECT(seen_log[0] == 2 && seen_log[1] == 31 && seen_log[2] == 30);
    }
    CHECK(cudaGraphExecDestroy(t));
    CHECK(cudaGraphDestroy(tg));
    CHECK(cudaGraphExecDestroy(y));
    CHECK(cudaFreeHost(seen_log));
    for (cudaGraphExec_t e : {x, t1, t2, f, d}) CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaFree(log));
    printf("graph_lifetimes: tail launches ran after their graph, in CUDA's order\n");

    // A device graph of a memset, a kernel and a copy between device buffers, launched by
    // a kernel of a host graph.
    int *buf;
    CHECK(cudaMalloc(&buf, 8 * sizeof(int)));
    CHECK(cudaMemset(buf, 0, 8 * sizeof(int)));
    cudaGraph_t mg;
    CHECK(cudaGraphCreate(&mg, 0));
    cudaMemsetParams ms = {};
    ms.dst = buf;
    ms.value = 7;
    ms.elementSize = sizeof(int);
    ms.width = 4;
    ms.height = 1;
    cudaGraphNode_t set_node, add_node, copy_node;
    CHECK(cudaGraphAddMemsetNode(&set_node, mg, nullptr, 0, &ms));
    int five = 5;
    void *add_args[] = {&buf, &five};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)add_k;
    kp.gridDim = kp.blockDim = dim3(1);
    kp.kernelParams = add_args;
    CHECK(cudaGraphAddKernelNode(&add_node, mg, &set_node, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&copy_node, mg, &add_node, 1, buf + 4, buf, 4 * sizeof(int),
                                   cudaMemcpyDeviceToDevice));
    cudaGraphExec_t m = for_device(mg);
    int *none_log;
    CHECK(cudaMalloc(&none_log, 16 * sizeof(int)));
    CHECK(cudaMemset(none_log, 0, 16 * sizeof(int)));
    cudaGraph_t lg;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    stamp_then_fire<<<1, 1, 0, s>>>(none_log, 97, m);
    CHECK(cudaStreamEndCapture(s, &lg));
    cudaGraphExec_t l;
    CHECK(cudaGraphInstantiate(&l, lg, 0));
    CHECK(cudaGraphLaunch(l, s));
    CHECK(cudaStreamSynchronize(s));
    const int launcher_only[] = {97};
    expect_log(none_log, launcher_only, 1);  // the launch succeeded
    int got_buf[8];
    CHECK(cudaMemcpy(got_buf, buf, sizeof got_buf, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 8; i++) EXPECT(got_buf[i] == (i % 4 == 0 ? 12 : 7));
    CHECK(cudaGraphExecDestroy(l));
    CHECK(cudaGraphDestroy(lg));
    CHECK(cudaGraphExecDestroy(m));
    CHECK(cudaFree(buf));
    CHECK(cudaFree(none_log));
    printf("graph_lifetimes: a device graph's memset, kernel and copy ran from the device\n");

    // cudaGetCurrentGraphExec: the running device graph, which relaunches itself; 0 in a
    // kernel that is no node of a device graph.
    unsigned long long *seen;
    int *runs;
    CHECK(cudaMallocManaged(&seen, 4 * sizeof(unsigned long long)));
    CHECK(cudaMallocManaged(&runs, sizeof(int)));
    *runs = 0;
    void *r_args[] = {&seen, &runs};
    cudaGraphExec_t r = for_device(one_kernel_graph((void *)relaunch_self, r_args));
    CHECK(cudaGraphLaunch(r, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(*runs == 3);
    for (int i = 0; i < 3; i++) EXPECT(seen[i] == (unsigned long long)r);
    unsigned long long flags = 0;
    CHECK(cudaGraphExecGetFlags((cudaGraphExec_t)seen[0], &flags));
    EXPECT(flags == cudaGraphInstantiateFlagDeviceLaunch);
    *runs = 2;
    seen[2] = 1;
    relaunch_self<<<1, 1, 0, s>>>(seen, runs);  // a plain launch: no current graph
    CHECK(cudaStreamSynchronize(s));
    EXPECT(seen[2] == 0 && *runs == 3);
    CHECK(cudaGraphExecDestroy(r));
    CHECK(cudaFree(seen));
    CHECK(cudaFree(runs));
    printf("graph_lifetimes: a device graph found itself and relaunched itself\n");
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    user_objects(s);
    device_graphs(s);
    CHECK(cudaStreamDestroy(s));
    printf("graph_lifetimes: all checks passed\n");
    return 0;
}
