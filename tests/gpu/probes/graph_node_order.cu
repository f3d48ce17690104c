// A probe of the real driver, run natively (no vcuda): in what order does cuGraphGetNodes list a graph's
// nodes? A suspend reads a graph with it and makes the graph again by adding the nodes in that order, and the
// driver pairs the nodes of two graphs by their insertion order (cuGraphExecChildGraphNodeSetParams,
// cuGraphExecUpdate): if the listing is not the insertion order, a graph made again pairs its nodes with the
// wrong ones of the application's next child graph. Each node is a kernel writing its insertion index; the
// probe prints the indices in listing order for a graph built node by node (with edges that make its
// topological order differ), its clone, a graph captured on two streams, and a graph made again from a
// listing. On the H200 (driver 580.159, session 29) every listing was the insertion order (0 1 2 3 4 5;
// captured 0 1 2 3 4), so a graph made again in listing order pairs as the application's did.
//   nvcc -arch=sm_90 -o graph_node_order graph_node_order.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "probe_check.h"

__global__ void mark(int* out, int slot, int value) { out[slot] = value; }

namespace {

CUfunction fn;
int* out;

CUgraphNode add_mark(CUgraph g, int slot, const CUgraphNode* deps, size_t ndeps) {
    int value = slot + 1;
    void* args[] = {&out, &slot, &value};
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = fn;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = args;
    CUgraphNode n = nullptr;
    CHECK(cuGraphAddKernelNode(&n, g, deps, ndeps, &p));
    return n;
}

// The slot each listed node writes, in listing order.
std::vector<int> listing(CUgraph g, std::vector<CUgraphNode>* nodes = nullptr) {
    size_t n = 0;
    CHECK(cuGraphGetNodes(g, nullptr, &n));
    std::vector<CUgraphNode> v(n);
    CHECK(cuGraphGetNodes(g, v.data(), &n));
    std::vector<int> slots;
    for (CUgraphNode node : v) {
        CUDA_KERNEL_NODE_PARAMS p{};
        CHECK(cuGraphKernelNodeGetParams(node, &p));
        slots.push_back(*static_cast<int*>(p.kernelParams[1]));
    }
    if (nodes) *nodes = v;
    return slots;
}

void print(const char* what, const std::vector<int>& slots) {
    std::printf("%-44s", what);
    for (int s : slots) std::printf(" %d", s);
    std::printf("\n");
}

}  // namespace

int main() {
    CHECK(cuInit(0));
    cudaFree(nullptr);
    cudaMalloc(&out, 64 * sizeof(int));
    cudaFunction_t f = nullptr;
    cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(mark));
    fn = reinterpret_cast<CUfunction>(f);

    // Built node by node: 0; 1 after 0; 2; 3 after 2; 4; 5; then an edge 5 -> 0 and 4 -> 2.
    CUgraph g = nullptr;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphNode n0 = add_mark(g, 0, nullptr, 0);
    add_mark(g, 1, &n0, 1);
    CUgraphNode n2 = add_mark(g, 2, nullptr, 0);
    add_mark(g, 3, &n2, 1);
    CUgraphNode n4 = add_mark(g, 4, nullptr, 0);
    CUgraphNode n5 = add_mark(g, 5, nullptr, 0);
    CHECK(cuGraphAddDependencies(g, &n5, &n0, nullptr, 1));
    CHECK(cuGraphAddDependencies(g, &n4, &n2, nullptr, 1));
    std::vector<CUgraphNode> listed;
    print("built 0..5 (edges 0>1 2>3 5>0 4>2):", listing(g, &listed));
    CUgraph clone = nullptr;
    CHECK(cuGraphClone(&clone, g));
    print("its clone:", listing(clone));

    // Made again as a suspend makes it: the nodes in listing order, then the edges.
    CUgraph again = nullptr;
    CHECK(cuGraphCreate(&again, 0));
    for (int slot : listing(g)) add_mark(again, slot, nullptr, 0);
    print("made again from the listing:", listing(again));

    // Captured: 0 on s0; fork: 1 on s1; 2 on s0; 3 on s1; join; 4 on s0.
    cudaStream_t s0, s1;
    cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaEvent_t fork, join;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal);
    mark<<<1, 1, 0, s0>>>(out, 0, 1);
    cudaEventRecord(fork, s0);
    cudaStreamWaitEvent(s1, fork, 0);
    mark<<<1, 1, 0, s1>>>(out, 1, 2);
    mark<<<1, 1, 0, s0>>>(out, 2, 3);
    mark<<<1, 1, 0, s1>>>(out, 3, 4);
    cudaEventRecord(join, s1);
    cudaStreamWaitEvent(s0, join, 0);
    mark<<<1, 1, 0, s0>>>(out, 4, 5);
    cudaGraph_t captured = nullptr;
    if (cudaStreamEndCapture(s0, &captured) != cudaSuccess) std::printf("capture failed\n");
    print("captured 0 | 1 2 3 (two streams) | 4:", listing(reinterpret_cast<CUgraph>(captured)));
    CUgraph captured_clone = nullptr;
    CHECK(cuGraphClone(&captured_clone, reinterpret_cast<CUgraph>(captured)));
    print("its clone:", listing(captured_clone));
    std::printf("done\n");
    return 0;
}
