// user_objects: CUDA user objects (cudaUserObjectCreate, cudaGraphRetainUserObject), whose destructors CUDA
// runs once the last reference is gone: the application's own, a graph's, an executable graph's. The
// destructor must run exactly once, in this process, and not while a reference remains: not after the graph
// is destroyed while its executable graph lives, not while the application still holds one. Destructors run
// asynchronously, so each wait for one polls (up to 10 s). Calls that CUDA refuses (flags, counts) too.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common.cuh"

extern "C" __global__ void uo_add(int* p, int v) { *p += v; }

namespace {

// One object's destructor runs: how often, and on which thread (this process's, never the caller's own call).
struct watched {
    std::atomic<int> runs{0};
};
void CUDART_CB destroy(void* p) { static_cast<watched*>(p)->runs.fetch_add(1); }

// Waits up to 10 s for `w`'s destructor, then says whether it ran exactly once.
bool ran_once(const watched& w) {
    for (int i = 0; i < 1000 && w.runs.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a second run would come now
    return w.runs.load() == 1;
}

// Still not run after a short while (a destructor due would have come).
bool not_run(const watched& w) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return w.runs.load() == 0;
}

cudaGraph_t adding_graph(int* d, int v) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    static int value;
    static void* args[2];
    static int* target;
    target = d;
    value = v;
    args[0] = &target;
    args[1] = &value;
    cudaKernelNodeParams k = {};
    k.func = reinterpret_cast<void*>(uo_add);
    k.gridDim = dim3(1);
    k.blockDim = dim3(1);
    k.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &k));
    return g;
}

}  // namespace

int main() {
    int* d = nullptr;
    CHECK(cudaMalloc(&d, sizeof(int)));
    CHECK(cudaMemset(d, 0, sizeof(int)));

    // 1. The application's references only.
    watched a;
    cudaUserObject_t obj;
    CHECK(cudaUserObjectCreate(&obj, &a, destroy, 1, cudaUserObjectNoDestructorSync));
    CHECK(cudaUserObjectRetain(obj, 2));
    CHECK(cudaUserObjectRelease(obj, 2));
    EXPECT(not_run(a), "the destructor ran while the application held a reference");
    CHECK(cudaUserObjectRelease(obj, 1));
    EXPECT(ran_once(a), "after the last release the destructor ran %d times", a.runs.load());
    printf("application's references: destructor ran once, after the last release\n");

    // 2. Moved to a graph; the executable graph keeps it after the graph is gone, until it is destroyed.
    watched b;
    CHECK(cudaUserObjectCreate(&obj, &b, destroy, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t g = adding_graph(d, 5);
    CHECK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(not_run(b), "the destructor ran while an executable graph held the object");
    CHECK(cudaGraphExecDestroy(exec));
    EXPECT(ran_once(b), "after the executable graph went the destructor ran %d times", b.runs.load());
    int h = 0;
    CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h == 15, "three launches added %d, want 15", h);
    printf("moved to a graph: kept by its executable graph, destructor ran once after it (sum %d)\n", h);

    // 3. A graph's own references (retained, not moved), released again; a clone holds its own.
    watched c;
    CHECK(cudaUserObjectCreate(&obj, &c, destroy, 1, cudaUserObjectNoDestructorSync));
    g = adding_graph(d, 1);
    CHECK(cudaGraphRetainUserObject(g, obj, 2, 0));
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, g));
    CHECK(cudaGraphReleaseUserObject(g, obj, 2));
    CHECK(cudaUserObjectRelease(obj, 1));
    EXPECT(not_run(c), "the destructor ran while a clone of the graph held the object");
    CHECK(cudaGraphDestroy(clone));
    EXPECT(ran_once(c), "after the clone went the destructor ran %d times", c.runs.load());
    CHECK(cudaGraphDestroy(g));
    printf("a graph's references, and its clone's: destructor ran once, after the clone went\n");

    // 4. What CUDA refuses.
    watched unused;
    cudaError_t e = cudaUserObjectCreate(&obj, &unused, destroy, 1, 0);
    printf("create without cudaUserObjectNoDestructorSync: %s\n", cudaGetErrorName(e));
    (void)cudaGetLastError();
    e = cudaUserObjectCreate(&obj, &unused, destroy, 0, cudaUserObjectNoDestructorSync);
    printf("create with no reference: %s\n", cudaGetErrorName(e));
    (void)cudaGetLastError();
    EXPECT(unused.runs.load() == 0, "a refused object's destructor ran");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return pass();
}
