// graph_memory_nodes: graph allocations (the calls of NVIDIA's graphMemoryNodes and graphMemoryFootprint
// samples). A graph built node by node allocates its buffers, copies pageable input in, runs a kernel, copies
// the result out and frees them; a capture of stream-ordered allocations and frees (with a copy on a second
// stream that joined it) records the same as memory nodes; an allocation a graph leaves live is read and
// freed outside it (cudaFree, cudaFreeAsync) or by another graph's free node. Each launch runs on new inputs
// and is checked against a CPU reference; the graph memory figures must hold what the graphs allocated.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// y[i] = a * x[i] + b
extern "C" __global__ void gmn_affine(const float* x, float* y, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

namespace {

constexpr int n = 1 << 16, threads = 256, blocks = n / threads;
constexpr size_t bytes = n * sizeof(float);

void fill(std::vector<float>& v, uint32_t seed) {
    for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(static_cast<int>((seed + 13u * i) % 997u)) / 4.0f;
}

void expect_affine(const char* what, const std::vector<float>& got, const std::vector<float>& x, float a,
                   float b) {
    for (int i = 0; i < n; ++i)
        EXPECT(got[i] == a * x[i] + b, "%s: element %d is %g, want %g", what, i, got[i], a * x[i] + b);
}

cudaMemAllocNodeParams alloc_params(int device) {
    cudaMemAllocNodeParams p = {};
    p.bytesize = bytes;
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = device;
    return p;
}

const char* type_name(cudaGraphNode_t node) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(node, &t));
    return t == cudaGraphNodeTypeMemAlloc  ? "alloc"
           : t == cudaGraphNodeTypeMemFree ? "free"
           : t == cudaGraphNodeTypeMemcpy  ? "memcpy"
           : t == cudaGraphNodeTypeKernel  ? "kernel"
                                           : "other";
}

uint64_t graph_mem(int device, cudaGraphMemAttributeType attr) {
    uint64_t v = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(device, attr, &v));
    return v;
}

// alloc x -> alloc y -> copy in -> affine(3, 2) -> copy out -> free x, free y
void explicit_nodes(int device, cudaStream_t s) {
    std::vector<float> in(n), out(n);
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params(device);
    cudaGraphNode_t ax, ay, cin, k, cout, fx, fy;
    CHECK(cudaGraphAddMemAllocNode(&ax, g, nullptr, 0, &ap));
    float* x = static_cast<float*>(ap.dptr);
    CHECK(cudaGraphAddMemAllocNode(&ay, g, &ax, 1, &ap));
    float* y = static_cast<float*>(ap.dptr);
    EXPECT(x && y && x != y, "alloc nodes gave %p and %p", static_cast<void*>(x), static_cast<void*>(y));
    CHECK(cudaGraphAddMemcpyNode1D(&cin, g, &ay, 1, x, in.data(), bytes, cudaMemcpyHostToDevice));
    int count = n;
    float a = 3.0f, b = 2.0f;
    void* args[] = {&x, &y, &count, &a, &b};
    cudaKernelNodeParams kp = {};
    kp.func = reinterpret_cast<void*>(gmn_affine);
    kp.gridDim = dim3(blocks);
    kp.blockDim = dim3(threads);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&k, g, &cin, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&cout, g, &k, 1, out.data(), y, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&fx, g, &k, 1, x));
    CHECK(cudaGraphAddMemFreeNode(&fy, g, &cout, 1, y));
    printf("graph with memory nodes: %s %s %s %s %s %s %s\n", type_name(ax), type_name(ay), type_name(cin),
           type_name(k), type_name(cout), type_name(fx), type_name(fy));
    // The nodes' parameters read back: y's allocation with an access descriptor for the device, and its free.
    cudaMemAccessDesc rw = {};
    rw.location = ap.poolProps.location;
    rw.flags = cudaMemAccessFlagsProtReadWrite;
    ap.accessDescs = &rw;
    ap.accessDescCount = 1;
    cudaGraphNode_t az;
    CHECK(cudaGraphAddMemAllocNode(&az, g, &ay, 1, &ap));
    CHECK(cudaGraphAddMemFreeNode(&fx, g, &az, 1, ap.dptr));
    for (cudaGraphNode_t node : {ay, az}) {
        cudaMemAllocNodeParams got = {};
        CHECK(cudaGraphMemAllocNodeGetParams(node, &got));
        EXPECT(got.bytesize == bytes && got.poolProps.location.type == cudaMemLocationTypeDevice &&
                   got.poolProps.location.id == device && (node != ay || got.dptr == y),
               "alloc node parameters: %zu bytes at %p, location %d/%d", got.bytesize, got.dptr,
               int(got.poolProps.location.type), got.poolProps.location.id);
        printf("alloc node: %zu bytes, type %d, location %d/%d, %zu access descriptors", got.bytesize,
               int(got.poolProps.allocType), int(got.poolProps.location.type), got.poolProps.location.id,
               got.accessDescCount);
        for (size_t i = 0; i < got.accessDescCount; ++i)
            printf(" [%d/%d flags %d]", int(got.accessDescs[i].location.type), got.accessDescs[i].location.id,
                   int(got.accessDescs[i].flags));
        printf("\n");
    }
    void* freed = nullptr;
    CHECK(cudaGraphMemFreeNodeGetParams(fy, &freed));
    EXPECT(freed == y, "free node frees %p, not y %p", freed, static_cast<void*>(y));
    cudaMemAllocNodeParams wrong = {};
    cudaError_t e_wrong = cudaGraphMemAllocNodeGetParams(fy, &wrong);
    printf("free node frees y; a free node asked for alloc parameters: %s\n", cudaGetErrorName(e_wrong));
    cudaGetLastError();
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphDestroy(g));
    for (int launch = 1; launch <= 2; ++launch) {
        fill(in, 50u * launch);
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
        expect_affine("explicit memory nodes", out, in, 3.0f, 2.0f);
        printf("graph with memory nodes, launch %d: ok\n", launch);
    }
    uint64_t used = graph_mem(device, cudaGraphMemAttrUsedMemCurrent);
    uint64_t reserved = graph_mem(device, cudaGraphMemAttrReservedMemCurrent);
    uint64_t high = graph_mem(device, cudaGraphMemAttrReservedMemHigh);
    EXPECT(reserved >= used && high >= 2 * bytes, "graph memory: used %llu, reserved %llu, high %llu",
           static_cast<unsigned long long>(used), static_cast<unsigned long long>(reserved),
           static_cast<unsigned long long>(high));
    printf("graph memory figures: reserved covers used, the high mark both buffers\n");
    CHECK(cudaGraphExecDestroy(e));
}

// The allocation a graph leaves live: used after the launch, then freed by cudaFree, by cudaFreeAsync and by
// another graph's free node.
void live_allocation(int device, cudaStream_t s) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params(device);
    cudaGraphNode_t alloc, set;
    CHECK(cudaGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
    auto* p = static_cast<unsigned*>(ap.dptr);
    cudaMemsetParams ms = {};
    ms.dst = p;
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    ms.value = 0x5eed;
    CHECK(cudaGraphAddMemsetNode(&set, g, &alloc, 1, &ms));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphDestroy(g));
    std::vector<unsigned> host(n);
    for (int round = 0; round < 3; ++round) {
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i)
            EXPECT(host[i] == 0x5eed, "live allocation: element %d is %#x", i, host[i]);
        if (round == 0) {
            CHECK(cudaFree(p));
        } else if (round == 1) {
            CHECK(cudaFreeAsync(p, s));
            CHECK(cudaStreamSynchronize(s));
        } else {
            cudaGraph_t fg;
            CHECK(cudaGraphCreate(&fg, 0));
            cudaGraphNode_t free_node;
            CHECK(cudaGraphAddMemFreeNode(&free_node, fg, nullptr, 0, p));
            cudaGraphExec_t fe;
            CHECK(cudaGraphInstantiate(&fe, fg, 0));
            CHECK(cudaGraphDestroy(fg));
            CHECK(cudaGraphLaunch(fe, s));
            CHECK(cudaStreamSynchronize(s));
            CHECK(cudaGraphExecDestroy(fe));
        }
    }
    printf("allocation left live by a graph: read, then freed by cudaFree, cudaFreeAsync and a free node\n");
    CHECK(cudaGraphExecDestroy(e));
}

// Stream-ordered allocations and frees captured as memory nodes, with a copy on a joined stream.
void captured(cudaStream_t s) {
    cudaStream_t side;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t done, side_done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming));
    std::vector<float> in(n), mid(n), out(n);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    float *x, *y, *z;
    CHECK(cudaMallocAsync(&x, bytes, s));
    CHECK(cudaMallocAsync(&y, bytes, s));
    CHECK(cudaMemcpyAsync(x, in.data(), bytes, cudaMemcpyHostToDevice, s));
    gmn_affine<<<blocks, threads, 0, s>>>(x, y, n, 2.0f, 0.0f);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaStreamWaitEvent(side, done, 0));
    CHECK(cudaMemcpyAsync(mid.data(), y, bytes, cudaMemcpyDeviceToHost, side));
    CHECK(cudaFreeAsync(x, s));
    CHECK(cudaMallocAsync(&z, bytes, s));
    gmn_affine<<<blocks, threads, 0, s>>>(y, z, n, -1.0f, 0.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(out.data(), z, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(z, s));
    CHECK(cudaEventRecord(side_done, side));
    CHECK(cudaStreamWaitEvent(s, side_done, 0));
    CHECK(cudaFreeAsync(y, s));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    printf("captured stream-ordered allocations: %zu nodes\n", nodes);
    std::vector<cudaGraphNode_t> list(nodes);
    CHECK(cudaGraphGetNodes(g, list.data(), &nodes));
    int allocs = 0, frees = 0;
    for (cudaGraphNode_t node : list) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(node, &t));
        if (t == cudaGraphNodeTypeMemAlloc) {
            cudaMemAllocNodeParams got = {};
            CHECK(cudaGraphMemAllocNodeGetParams(node, &got));
            EXPECT(got.bytesize == bytes && (got.dptr == x || got.dptr == y || got.dptr == z),
                   "captured alloc node: %zu bytes at %p", got.bytesize, got.dptr);
            ++allocs;
        } else if (t == cudaGraphNodeTypeMemFree) {
            void* p = nullptr;
            CHECK(cudaGraphMemFreeNodeGetParams(node, &p));
            EXPECT(p == x || p == y || p == z, "captured free node frees %p", p);
            ++frees;
        }
    }
    printf("captured: %d alloc nodes and %d free nodes, each on one of the three buffers\n", allocs, frees);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphDestroy(g));
    for (int launch = 1; launch <= 2; ++launch) {
        fill(in, 700u + launch);
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
        expect_affine("captured, first kernel", mid, in, 2.0f, 0.0f);
        std::vector<float> twice(n);
        for (int i = 0; i < n; ++i) twice[i] = 2.0f * in[i];
        expect_affine("captured, second kernel", out, twice, -1.0f, 0.0f);
        printf("captured graph, launch %d: ok\n", launch);
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaEventDestroy(side_done));
    CHECK(cudaStreamDestroy(side));
}

}  // namespace

int main() {
    int device = 0;
    CHECK(cudaGetDevice(&device));
    int pools = 0;
    CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    EXPECT(pools, "the device does not support memory pools");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    explicit_nodes(device, s);
    live_allocation(device, s);
    captured(s);
    CHECK(cudaDeviceGraphMemTrim(device));
    uint64_t zero = 0;
    CHECK(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
    printf("graph memory trimmed, high mark reset\n");
    CHECK(cudaStreamDestroy(s));
    return pass();
}
