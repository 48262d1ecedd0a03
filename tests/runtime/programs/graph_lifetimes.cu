// What graphs hold and what they launch: user objects (a destructor run when the last
// reference goes, never before the launches of a graph holding it have finished; references
// moved, cloned, held by child graph nodes and executable graphs), and device graphs: the
// order of tail launches (after the whole launching graph and its fire-and-forget work, one
// at a time, a tail graph's own tail launches first) and cudaGetCurrentGraphExec, which a
// kernel of a device graph uses to launch its graph again. Results are checked against
// orders and values worked out on the host.
#include <atomic>
#include <unistd.h>
#include "check.cuh"

__global__ void add_k(int *v, int k) { *v += k; }

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

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    user_objects(s);
    CHECK(cudaStreamDestroy(s));
    printf("graph_lifetimes: all checks passed\n");
    return 0;
}
