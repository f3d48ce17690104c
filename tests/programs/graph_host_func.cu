// graph_host_func: host functions captured into a CUDA graph run at every launch of the graph, in order with
// the graph's other work, and a host function on a plain stream still runs once. (Through vcuda the server's
// callback state for a captured host function used to be freed after the graph's first launch, and the next
// launch read freed memory: a tenant could take the server down.)
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

namespace {
struct trace {
    std::vector<int> order;
};
void CUDART_CB note(void* data) {
    auto* t = static_cast<trace*>(data);
    t->order.push_back(static_cast<int>(t->order.size()));
}
void CUDART_CB note_twice(void* data) {
    auto* t = static_cast<trace*>(data);
    t->order.push_back(-1);
}
}  // namespace

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int* d = nullptr;
    CHECK(cudaMalloc(&d, 4096));
    trace t;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaLaunchHostFunc(s, note, &t));
    CHECK(cudaMemsetAsync(d, 1, 4096, s));
    CHECK(cudaLaunchHostFunc(s, note_twice, &t));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    printf("captured nodes: %zu\n", nodes);
    // Each captured host node gives back its function and data (cudaGraphHostNodeGetParams).
    std::vector<cudaGraphNode_t> listed(nodes);
    CHECK(cudaGraphGetNodes(g, listed.data(), &nodes));
    int host_nodes = 0;
    for (cudaGraphNode_t n : listed) {
        cudaGraphNodeType type;
        CHECK(cudaGraphNodeGetType(n, &type));
        if (type != cudaGraphNodeTypeHost) continue;
        cudaHostNodeParams hp{};
        CHECK(cudaGraphHostNodeGetParams(n, &hp));
        EXPECT((hp.fn == note || hp.fn == note_twice) && hp.userData == &t, "host node %d: another function",
               host_nodes);
        ++host_nodes;
    }
    printf("captured host nodes with their function and data: %d\n", host_nodes);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 3; ++i) {
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
    }
    printf("host functions ran per launch, in order:");
    for (int v : t.order) printf(" %d", v);
    printf("\n");
    EXPECT(t.order.size() == 6, "%zu host function runs for 3 launches of 2", t.order.size());
    CHECK(cudaLaunchHostFunc(s, note, &t));  // on the stream, no capture: runs once
    CHECK(cudaStreamSynchronize(s));
    EXPECT(t.order.size() == 7, "the plain host function ran %zu times", t.order.size() - 6);
    printf("plain host function after the graph: ran once\n");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    return pass();
}
