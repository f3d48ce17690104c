// graph_conditional_nodes: conditional graph nodes (the calls of NVIDIA's graphConditionalNodes sample): IF
// (with and without an else body), WHILE and SWITCH nodes whose bodies the driver makes, filled node by node
// or by capturing into them, with kernels setting the condition (cudaGraphSetConditional); and a conditional
// node added to a capture under way after the capture's dependencies, which then become the node. Each graph
// runs with several conditions and its results are checked against what the condition says should have run.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// The condition comes from memory: cudaGraphSetConditional(h, *flag).
extern "C" __global__ void gcn_set(const unsigned* flag, cudaGraphConditionalHandle h) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(h, *flag);
}

// A loop's body: one step down, and the loop goes on while steps are left.
extern "C" __global__ void gcn_count_down(unsigned* left, cudaGraphConditionalHandle h) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        *left -= 1;
        cudaGraphSetConditional(h, *left > 0 ? 1u : 0u);
    }
}

// *out += v
extern "C" __global__ void gcn_add(unsigned* out, unsigned v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *out += v;
}

namespace {

// Device words the graphs use: the condition they read, a loop counter, and the sum their bodies add to.
struct words {
    unsigned* d = nullptr;  // [0] condition, [1] loop counter, [2] sum
    words() { CHECK(cudaMalloc(&d, 3 * sizeof(unsigned))); }
    ~words() { cudaFree(d); }
    unsigned* condition() const { return d; }
    unsigned* counter() const { return d + 1; }
    unsigned* sum() const { return d + 2; }
    void set(unsigned condition, unsigned counter) const {
        unsigned host[3] = {condition, counter, 0};
        CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
    }
    unsigned read_sum() const {
        unsigned v = 0;
        CHECK(cudaMemcpy(&v, sum(), sizeof v, cudaMemcpyDeviceToHost));
        return v;
    }
};

cudaGraphNode_t add_kernel(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, void* fn, void** args) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = fn;
    p.kernel.gridDim = dim3(1);
    p.kernel.blockDim = dim3(32);
    p.kernel.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, deps.data(), nullptr, deps.size(), &p));
    return node;
}

void add_to(cudaGraph_t g, unsigned* sum, unsigned v) {
    void* args[] = {&sum, &v};
    add_kernel(g, {}, reinterpret_cast<void*>(gcn_add), args);
}

cudaGraphNode_t add_conditional(cudaGraph_t g, std::vector<cudaGraphNode_t> deps,
                                cudaGraphConditionalHandle h, cudaGraphConditionalNodeType type,
                                unsigned size, std::vector<cudaGraph_t>& bodies) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, deps.data(), nullptr, deps.size(), &p));
    bodies.assign(p.conditional.phGraph_out, p.conditional.phGraph_out + size);
    for (cudaGraph_t b : bodies) EXPECT(b != nullptr, "the driver gave no body graph");
    return node;
}

unsigned run(cudaGraphExec_t e, cudaStream_t s, const words& w, unsigned condition, unsigned counter) {
    w.set(condition, counter);
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    return w.read_sum();
}

// gcn_set -> IF (body: +1, else body: +100)
void if_else(cudaStream_t s, const words& w) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    unsigned* flag = w.condition();
    void* set_args[] = {&flag, &h};
    cudaGraphNode_t set = add_kernel(g, {}, reinterpret_cast<void*>(gcn_set), set_args);
    std::vector<cudaGraph_t> bodies;
    add_conditional(g, {set}, h, cudaGraphCondTypeIf, 2, bodies);
    add_to(bodies[0], w.sum(), 1);
    add_to(bodies[1], w.sum(), 100);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (unsigned condition : {0u, 1u, 7u, 0u}) {
        unsigned got = run(e, s, w, condition, 0);
        unsigned want = condition ? 1 : 100;
        EXPECT(got == want, "IF node, condition %u: sum %u, want %u", condition, got, want);
        printf("IF node, condition %u: %s body ran\n", condition, condition ? "the" : "the else");
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// WHILE (default 1, set at each launch; body captured: count down, +1) -> the loop runs `counter` times.
void loop(cudaStream_t s, const words& w) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    std::vector<cudaGraph_t> bodies;
    add_conditional(g, {}, h, cudaGraphCondTypeWhile, 1, bodies);
    cudaStream_t cs;
    CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCaptureToGraph(cs, bodies[0], nullptr, nullptr, 0, cudaStreamCaptureModeGlobal));
    gcn_add<<<1, 32, 0, cs>>>(w.sum(), 1);
    CHECK_LAUNCH();
    gcn_count_down<<<1, 32, 0, cs>>>(w.counter(), h);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(cs, nullptr));
    CHECK(cudaStreamDestroy(cs));
    size_t inside = 0;
    CHECK(cudaGraphGetNodes(bodies[0], nullptr, &inside));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (unsigned counter : {5u, 1u, 12u}) {
        unsigned got = run(e, s, w, 0, counter);
        EXPECT(got == counter, "WHILE node, counter %u: the body ran %u times", counter, got);
        printf("WHILE node (%zu nodes in its body), counter %u: the body ran %u times\n", inside, counter,
               got);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// gcn_set -> SWITCH (bodies: +10, +20, +30)
void switch_node(cudaStream_t s, const words& w) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    unsigned* flag = w.condition();
    void* set_args[] = {&flag, &h};
    cudaGraphNode_t set = add_kernel(g, {}, reinterpret_cast<void*>(gcn_set), set_args);
    std::vector<cudaGraph_t> bodies;
    add_conditional(g, {set}, h, cudaGraphCondTypeSwitch, 3, bodies);
    for (unsigned i = 0; i < 3; ++i) add_to(bodies[i], w.sum(), 10 * (i + 1));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (unsigned condition : {1u, 0u, 2u, 5u}) {
        unsigned got = run(e, s, w, condition, 0);
        unsigned want = condition < 3 ? 10 * (condition + 1) : 0;
        EXPECT(got == want, "SWITCH node, value %u: sum %u, want %u", condition, got, want);
        printf("SWITCH node, value %u: sum %u\n", condition, got);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
}

// Captured: gcn_set, then an IF node added after the capture's dependencies (body: +1), then +1000 after it.
void in_capture(cudaStream_t s, const words& w) {
    cudaStream_t cs;
    CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    cudaGraph_t g = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    size_t count = 0;
    CHECK(cudaStreamGetCaptureInfo(cs, &status, nullptr, &g, &deps, nullptr, &count));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    gcn_set<<<1, 32, 0, cs>>>(w.condition(), h);
    CHECK_LAUNCH();
    CHECK(cudaStreamGetCaptureInfo(cs, &status, nullptr, &g, &deps, nullptr, &count));
    EXPECT(status == cudaStreamCaptureStatusActive && count == 1, "capture: status %d, %zu dependencies",
           static_cast<int>(status), count);
    std::vector<cudaGraphNode_t> after(deps, deps + count);
    std::vector<cudaGraph_t> bodies;
    cudaGraphNode_t node = add_conditional(g, after, h, cudaGraphCondTypeIf, 1, bodies);
    CHECK(cudaStreamUpdateCaptureDependencies(cs, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    gcn_add<<<1, 32, 0, cs>>>(w.sum(), 1000);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(cs, &g));
    add_to(bodies[0], w.sum(), 1);
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    cudaGraphNode_t before[2];
    size_t n_before = 2;
    CHECK(cudaGraphNodeGetDependencies(node, before, nullptr, &n_before));
    EXPECT(n_before == 1, "the conditional node follows %zu nodes", n_before);
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(before[0], &type));
    EXPECT(type == cudaGraphNodeTypeKernel, "the conditional node follows a node of type %d",
           static_cast<int>(type));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (unsigned condition : {1u, 0u}) {
        unsigned got = run(e, s, w, condition, 0);
        unsigned want = condition ? 1001 : 1000;
        EXPECT(got == want, "captured IF node, condition %u: sum %u, want %u", condition, got, want);
        printf("captured graph (%zu nodes), condition %u: sum %u\n", nodes, condition, got);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(cs));
}

}  // namespace

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    words w;
    if_else(s, w);
    loop(s, w);
    switch_node(s, w);
    in_capture(s, w);
    CHECK(cudaStreamDestroy(s));
    return pass();
}
