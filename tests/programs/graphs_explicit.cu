// graphs_explicit: graphs built the way XLA's command buffers build them (JAX), through the driver entry
// points cudart hands out (cudaGetDriverEntryPointByVersion, at the versions XLA asks for). Work is captured
// into an existing graph (cuStreamBeginCaptureToGraph, thread-local mode), which becomes a child graph node
// of an outer graph; kernel nodes (a CUfunction with kernelParams, a CUkernel with an `extra` buffer), a
// memset, a device to device memcpy, an empty node and an event record node are added with cuGraphAddNode
// (edge data given). Node types, root and full node arrays and dependencies are checked; the graph is
// instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY and launched; the executable graph's kernel
// nodes and child graph are updated between launches (cuGraphExecKernelNodeSetParams,
// cuGraphExecChildGraphNodeSetParams) and a node of the graph itself is changed for a second executable
// graph. After a pause (argv[1] ms) both executable graphs run again. Every launch is compared with a CPU
// reference. Calls the driver must refuse print the error they got
// (the native run is the reference).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

// x[i] = base + i
extern "C" __global__ void ge_set(unsigned* x, int n, unsigned base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + i;
}

// y[i] = y[i] * a + x[i]
extern "C" __global__ void ge_axpy(unsigned* y, const unsigned* x, int n, unsigned a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * a + x[i];
}

// x[i] += v
extern "C" __global__ void ge_add(unsigned* x, int n, unsigned v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}

namespace {

const int n = 1 << 14, threads = 256, blocks = n / threads;
const size_t bytes = n * sizeof(unsigned);
const unsigned memset_value = 0xA5A5A5A5u;

// The driver functions, as cudart hands them out.
struct driver {
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuGraphCreate_v10000 graph_create;
    PFN_cuGraphDestroy_v10000 graph_destroy;
    PFN_cuStreamBeginCaptureToGraph_v12030 begin_capture_to_graph;
    PFN_cuStreamEndCapture_v10000 end_capture;
    PFN_cuStreamIsCapturing_v10000 is_capturing;
    PFN_cuStreamGetCaptureInfo_v12030 capture_info;
    PFN_cuGraphGetNodes_v10000 get_nodes;
    PFN_cuGraphGetRootNodes_v10000 get_root_nodes;
    PFN_cuGraphNodeGetDependencies_v12030 get_dependencies;
    PFN_cuGraphNodeGetType_v10000 node_type;
    PFN_cuGraphAddChildGraphNode_v10000 add_child;
    PFN_cuGraphAddNode_v12030 add_node;
    PFN_cuGraphKernelNodeSetParams_v12000 kernel_node_set;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 launch;
    PFN_cuGraphExecKernelNodeSetParams_v12000 exec_kernel_set;
    PFN_cuGraphExecChildGraphNodeSetParams_v11010 exec_child_set;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
};

template <class F>
void entry(F& f, const char* name, int version) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q));
    EXPECT(q == cudaDriverEntryPointSuccess && p, "no driver entry point %s at version %d", name, version);
    f = reinterpret_cast<F>(p);
}

driver load_driver() {
    driver d{};
    entry(d.get_error_name, "cuGetErrorName", 6000);
    entry(d.ctx_get_current, "cuCtxGetCurrent", 4000);
    entry(d.graph_create, "cuGraphCreate", 10000);
    entry(d.graph_destroy, "cuGraphDestroy", 10000);
    entry(d.begin_capture_to_graph, "cuStreamBeginCaptureToGraph", 12030);
    entry(d.end_capture, "cuStreamEndCapture", 10000);
    entry(d.is_capturing, "cuStreamIsCapturing", 10000);
    entry(d.capture_info, "cuStreamGetCaptureInfo", 12030);
    entry(d.get_nodes, "cuGraphGetNodes", 10000);
    entry(d.get_root_nodes, "cuGraphGetRootNodes", 10000);
    entry(d.get_dependencies, "cuGraphNodeGetDependencies", 12030);
    entry(d.node_type, "cuGraphNodeGetType", 10000);
    entry(d.add_child, "cuGraphAddChildGraphNode", 10000);
    entry(d.add_node, "cuGraphAddNode", 12030);
    entry(d.kernel_node_set, "cuGraphKernelNodeSetParams", 12000);
    entry(d.instantiate, "cuGraphInstantiateWithFlags", 11040);
    entry(d.launch, "cuGraphLaunch", 10000);
    entry(d.exec_kernel_set, "cuGraphExecKernelNodeSetParams", 12000);
    entry(d.exec_child_set, "cuGraphExecChildGraphNodeSetParams", 11010);
    entry(d.exec_destroy, "cuGraphExecDestroy", 10000);
    return d;
}

driver drv;

const char* error_name(CUresult r) {
    const char* s = "?";
    drv.get_error_name(r, &s);
    return s;
}

#define DRV(call)                                                                                   \
    do {                                                                                            \
        CUresult r_ = (call);                                                                       \
        if (r_ != CUDA_SUCCESS) fail("%s returned %s at line %d", #call, error_name(r_), __LINE__); \
    } while (0)

const char* type_name(CUgraphNodeType t) {
    switch (t) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            return "kernel";
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            return "memcpy";
        case CU_GRAPH_NODE_TYPE_MEMSET:
            return "memset";
        case CU_GRAPH_NODE_TYPE_GRAPH:
            return "graph";
        case CU_GRAPH_NODE_TYPE_EMPTY:
            return "empty";
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return "event_record";
        default:
            return "other";
    }
}

CUgraphNodeType type_of(CUgraphNode node) {
    CUgraphNodeType t{};
    DRV(drv.node_type(node, &t));
    return t;
}

// What one launch of the outer graph does, on the host: the child graph (x = base + i; y = y * a_child + x),
// then z = z * a1 + y and z += v2, a memset of w and a copy of z into w2.
struct reference {
    std::vector<unsigned> x, y, z, w, w2;
    void launch(unsigned base, unsigned a_child, unsigned a1, unsigned v2) {
        for (int i = 0; i < n; ++i) {
            x[i] = base + i;
            y[i] = y[i] * a_child + x[i];
            z[i] = z[i] * a1 + y[i] + v2;
            w[i] = memset_value;
            w2[i] = z[i];
        }
    }
};

struct buffers {
    unsigned *x, *y, *z, *w, *w2;
};

void expect_results(const char* when, const buffers& b, const reference& ref) {
    std::vector<unsigned> got(n);
    const std::pair<const char*, std::pair<unsigned*, const std::vector<unsigned>*>> all[] = {
        {"x", {b.x, &ref.x}},
        {"y", {b.y, &ref.y}},
        {"z", {b.z, &ref.z}},
        {"w", {b.w, &ref.w}},
        {"w2", {b.w2, &ref.w2}}};
    uint64_t digest = 0xcbf29ce484222325ull;
    for (auto& [name, bufs] : all) {
        CHECK(cudaMemcpy(got.data(), bufs.first, bytes, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i)
            if (got[i] != (*bufs.second)[i])
                fail("%s: %s[%d] = %u, expected %u", when, name, i, got[i], (*bufs.second)[i]);
        digest = fnv1a(got.data(), bytes, digest);
    }
    printf("%s: ok (digest %016llx)\n", when, static_cast<unsigned long long>(digest));
}

// Captures ge_set(x, base) and ge_axpy(y, x, a) on `s` into the existing graph `g`, as XLA does.
void capture_child(CUgraph g, cudaStream_t s, const buffers& b, unsigned base, unsigned a) {
    DRV(drv.begin_capture_to_graph(s, g, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CUstreamCaptureStatus st{};
    DRV(drv.is_capturing(s, &st));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "the stream is not capturing into the graph (status %d)",
           int(st));
    cuuint64_t id = 0;
    CUgraph into = nullptr;
    DRV(drv.capture_info(s, &st, &id, &into, nullptr, nullptr, nullptr));
    EXPECT(into == g && id != 0, "capture info names graph %p (id %llu), not the graph captured into",
           static_cast<void*>(into), static_cast<unsigned long long>(id));
    ge_set<<<blocks, threads, 0, s>>>(b.x, n, base);
    CHECK_LAUNCH();
    ge_axpy<<<blocks, threads, 0, s>>>(b.y, b.x, n, a);
    CHECK_LAUNCH();
    CUgraph ended = nullptr;
    DRV(drv.end_capture(s, &ended));
    EXPECT(ended == g, "cuStreamEndCapture gave another graph than the one captured into");
    DRV(drv.is_capturing(s, &st));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE, "still capturing after cuStreamEndCapture");
}

CUgraphNodeParams kernel_node(CUfunction f, CUkernel k, void** params, void** extra) {
    CUgraphNodeParams p;
    std::memset(&p, 0, sizeof p);  // unused bytes must be zero
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    p.kernel.func = f;
    p.kernel.kern = k;
    p.kernel.gridDimX = blocks;
    p.kernel.gridDimY = p.kernel.gridDimZ = 1;
    p.kernel.blockDimX = threads;
    p.kernel.blockDimY = p.kernel.blockDimZ = 1;
    p.kernel.kernelParams = params;
    p.kernel.extra = extra;
    return p;
}

CUDA_KERNEL_NODE_PARAMS kernel_update(CUfunction f, CUkernel k, void** params, void** extra) {
    CUgraphNodeParams p = kernel_node(f, k, params, extra);
    CUDA_KERNEL_NODE_PARAMS u;
    static_assert(sizeof u == sizeof p.kernel, "v2 and v3 kernel node parameters share their layout");
    std::memcpy(&u, &p.kernel, sizeof u);
    return u;
}

// ge_add's parameters as one buffer (the `extra` form): the layout the compiler gives them.
struct add_args {
    unsigned* x;
    int n;
    unsigned v;
};

}  // namespace

int main(int argc, char** argv) {
    const int idle_ms = argc > 1 ? atoi(argv[1]) : 0;  // a pause before the end (a suspending server's tests)
    drv = load_driver();
    rng r(11);
    reference ref;
    ref.x.assign(n, 0);
    ref.y.resize(n);
    ref.z.assign(n, 0);
    ref.w.assign(n, 0);
    ref.w2.assign(n, 0);
    for (int i = 0; i < n; ++i) ref.y[i] = r.u32();

    buffers b;
    for (unsigned** p : {&b.x, &b.y, &b.z, &b.w, &b.w2}) {
        CHECK(cudaMalloc(p, bytes));
        CHECK(cudaMemset(*p, 0, bytes));
    }
    CHECK(cudaMemcpy(b.y, ref.y.data(), bytes, cudaMemcpyHostToDevice));
    // Load the kernels before capturing (n = 0: they touch nothing).
    ge_set<<<1, threads>>>(b.x, 0, 0);
    ge_axpy<<<1, threads>>>(b.y, b.x, 0, 0);
    ge_add<<<1, threads>>>(b.x, 0, 0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaFunction_t axpy_fn = nullptr;
    cudaKernel_t add_kernel = nullptr;
    CHECK(cudaGetFuncBySymbol(&axpy_fn, reinterpret_cast<const void*>(ge_axpy)));
    CHECK(cudaGetKernel(&add_kernel, reinterpret_cast<const void*>(ge_add)));
    CUcontext ctx = nullptr;
    DRV(drv.ctx_get_current(&ctx));

    cudaStream_t capture_stream, run_stream;
    CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&run_stream, cudaStreamNonBlocking));
    cudaEvent_t start, done;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&done));

    // ---- the child graph: captured into a graph made beforehand
    CUgraph outer = nullptr, inner = nullptr;
    DRV(drv.graph_create(&outer, 0));
    DRV(drv.graph_create(&inner, 0));
    capture_child(inner, capture_stream, b, 100, 2);
    size_t count = 0, roots = 0;
    DRV(drv.get_root_nodes(inner, nullptr, &roots));
    DRV(drv.get_nodes(inner, nullptr, &count));
    printf("captured graph: %zu nodes, %zu root\n", count, roots);
    EXPECT(count == 2 && roots == 1, "the captured graph has %zu nodes and %zu roots, expected 2 and 1",
           count, roots);
    CUgraphNode inner_nodes[4] = {}, inner_root = nullptr;
    count = 4;
    DRV(drv.get_nodes(inner, inner_nodes, &count));
    EXPECT(count == 2 && inner_nodes[2] == nullptr && inner_nodes[3] == nullptr,
           "cuGraphGetNodes with room for 4 gave %zu nodes and did not clear the rest", count);
    roots = 1;
    DRV(drv.get_root_nodes(inner, &inner_root, &roots));
    EXPECT(roots == 1 && (inner_root == inner_nodes[0] || inner_root == inner_nodes[1]),
           "the root is not one of the graph's nodes");
    CUgraphNode second = inner_root == inner_nodes[0] ? inner_nodes[1] : inner_nodes[0];
    CUgraphNode dep = nullptr;
    CUgraphEdgeData dep_edge;
    std::memset(&dep_edge, 0xff, sizeof dep_edge);
    size_t deps = 1;
    DRV(drv.get_dependencies(second, &dep, &dep_edge, &deps));
    const bool default_edge = dep_edge.from_port == 0 && dep_edge.to_port == 0 && dep_edge.type == 0;
    printf("captured nodes: %s, %s; the second depends on the root: %s, default edge: %s\n",
           type_name(type_of(inner_nodes[0])), type_name(type_of(inner_nodes[1])),
           deps == 1 && dep == inner_root ? "yes" : "no", default_edge ? "yes" : "no");
    EXPECT(type_of(inner_nodes[0]) == CU_GRAPH_NODE_TYPE_KERNEL &&
               type_of(inner_nodes[1]) == CU_GRAPH_NODE_TYPE_KERNEL,
           "captured launches are not kernel nodes");
    EXPECT(deps == 1 && dep == inner_root && default_edge,
           "the second captured node does not depend on the first");

    // ---- the outer graph, node by node
    CUgraphNode child = nullptr;
    DRV(drv.add_child(&child, outer, nullptr, 0, inner));
    CUgraphEdgeData edge[2];
    std::memset(edge, 0, sizeof edge);
    CUdeviceptr zp = reinterpret_cast<CUdeviceptr>(b.z);
    unsigned* zv = b.z;
    unsigned* yv = b.y;
    int count_n = n;
    unsigned a1 = 5;
    void* axpy_params[] = {&zv, &yv, &count_n, &a1};
    CUgraphNodeParams p = kernel_node(axpy_fn, nullptr, axpy_params, nullptr);
    CUgraphNode k1 = nullptr, k2 = nullptr, memset_node = nullptr, copy_node = nullptr, join = nullptr,
                record = nullptr;
    DRV(drv.add_node(&k1, outer, &child, edge, 1, &p));
    add_args add{b.z, n, 7};
    size_t add_size = sizeof add;
    void* add_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &add, CU_LAUNCH_PARAM_BUFFER_SIZE, &add_size,
                         CU_LAUNCH_PARAM_END};
    p = kernel_node(nullptr, reinterpret_cast<CUkernel>(add_kernel), nullptr, add_extra);
    DRV(drv.add_node(&k2, outer, &k1, edge, 1, &p));
    std::memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = reinterpret_cast<CUdeviceptr>(b.w);
    p.memset.value = memset_value;
    p.memset.elementSize = 4;
    p.memset.width = n;
    p.memset.height = 1;
    p.memset.ctx = ctx;
    DRV(drv.add_node(&memset_node, outer, nullptr, nullptr, 0, &p));
    std::memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    p.memcpy.copyCtx = ctx;
    p.memcpy.copyParams.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.memcpy.copyParams.srcDevice = zp;
    p.memcpy.copyParams.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.memcpy.copyParams.dstDevice = reinterpret_cast<CUdeviceptr>(b.w2);
    p.memcpy.copyParams.srcPitch = p.memcpy.copyParams.dstPitch = bytes;  // one row of one slice
    p.memcpy.copyParams.srcHeight = p.memcpy.copyParams.dstHeight = 1;
    p.memcpy.copyParams.WidthInBytes = bytes;
    p.memcpy.copyParams.Height = 1;
    p.memcpy.copyParams.Depth = 1;
    DRV(drv.add_node(&copy_node, outer, &k2, edge, 1, &p));
    std::memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_EMPTY;
    CUgraphNode both[] = {memset_node, copy_node};
    DRV(drv.add_node(&join, outer, both, edge, 2, &p));
    std::memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
    p.eventRecord.event = reinterpret_cast<CUevent>(done);
    DRV(drv.add_node(&record, outer, &join, nullptr, 1, &p));

    const CUgraphNode mine[] = {child, k1, k2, memset_node, copy_node, join, record};
    const char* names[] = {"child", "kernel_fn", "kernel_kern", "memset", "memcpy", "join", "record"};
    printf("outer nodes:");
    for (size_t i = 0; i < 7; ++i) printf(" %s=%s", names[i], type_name(type_of(mine[i])));
    printf("\n");
    const CUgraphNodeType want[] = {CU_GRAPH_NODE_TYPE_GRAPH,       CU_GRAPH_NODE_TYPE_KERNEL,
                                    CU_GRAPH_NODE_TYPE_KERNEL,      CU_GRAPH_NODE_TYPE_MEMSET,
                                    CU_GRAPH_NODE_TYPE_MEMCPY,      CU_GRAPH_NODE_TYPE_EMPTY,
                                    CU_GRAPH_NODE_TYPE_EVENT_RECORD};
    for (size_t i = 0; i < 7; ++i)
        EXPECT(type_of(mine[i]) == want[i], "node %s has type %s", names[i], type_name(type_of(mine[i])));
    CUgraphNode listed[8] = {};
    count = 8;
    DRV(drv.get_nodes(outer, listed, &count));
    bool all_listed = count == 7;
    for (const CUgraphNode m : mine) all_listed = all_listed && std::count(listed, listed + 7, m) == 1;
    CUgraphNode root_list[3] = {};
    roots = 3;
    DRV(drv.get_root_nodes(outer, root_list, &roots));
    const bool right_roots = roots == 2 && std::count(root_list, root_list + 2, child) == 1 &&
                             std::count(root_list, root_list + 2, memset_node) == 1 &&
                             root_list[2] == nullptr;
    CUgraphNode join_deps[2] = {};
    CUgraphEdgeData join_edges[2];
    deps = 2;
    DRV(drv.get_dependencies(join, join_deps, join_edges, &deps));
    const bool right_join = deps == 2 && std::count(join_deps, join_deps + 2, memset_node) == 1 &&
                            std::count(join_deps, join_deps + 2, copy_node) == 1;
    printf(
        "outer graph: all 7 nodes listed: %s, roots child and memset: %s, join after memset and memcpy: %s\n",
        all_listed ? "yes" : "no", right_roots ? "yes" : "no", right_join ? "yes" : "no");
    EXPECT(all_listed && right_roots && right_join, "the outer graph's node lists are wrong");

    // ---- instantiate as XLA does, launch
    CUgraphExec exec = nullptr;
    DRV(drv.instantiate(&exec, outer, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
    CHECK(cudaEventRecord(start, run_stream));
    DRV(drv.launch(exec, run_stream));
    ref.launch(100, 2, 5, 7);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("first launch", b, ref);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, done));  // fails unless the event record node ran
    printf("event record node ran: %s\n", ms >= 0 ? "yes" : "no");
    printf("info: first launch took %.3f ms\n", ms);

    // ---- update the executable graph: a new child graph of the same shape, new kernel parameters
    CUgraph inner2 = nullptr;
    DRV(drv.graph_create(&inner2, 0));
    capture_child(inner2, capture_stream, b, 500, 3);
    DRV(drv.exec_child_set(exec, child, inner2));
    a1 = 9;
    CUDA_KERNEL_NODE_PARAMS u1 = kernel_update(axpy_fn, nullptr, axpy_params, nullptr);
    unsigned v2 = 11;
    void* add_params[] = {&zv, &count_n, &v2};
    CUDA_KERNEL_NODE_PARAMS u2 =
        kernel_update(nullptr, reinterpret_cast<CUkernel>(add_kernel), add_params, nullptr);
    // Through vcuda these are answered and queued locally: no round trip (natively there is no counter).
    unsigned long long trips_mid = 0, trips_after = 0;
    const bool counted = vcuda_round_trips(&trips_mid);
    for (int repeat = 0; repeat < 10; ++repeat) {  // XLA sets every kernel node before each launch
        DRV(drv.exec_kernel_set(exec, k1, &u1));
        DRV(drv.exec_kernel_set(exec, k2, &u2));
        CUgraphNodeType t = type_of(k1);
        EXPECT(t == CU_GRAPH_NODE_TYPE_KERNEL, "kernel node type changed");
    }
    if (counted) {
        vcuda_round_trips(&trips_after);
        printf("info: through vcuda: 20 kernel node updates and 10 type queries made %llu round trips\n",
               trips_after - trips_mid);
        EXPECT(trips_after == trips_mid,
               "kernel node updates or type queries waited for the server (%llu round trips)",
               trips_after - trips_mid);
    }
    DRV(drv.launch(exec, run_stream));
    ref.launch(500, 3, 9, 11);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("after updating the child graph and the kernels", b, ref);
    DRV(drv.exec_child_set(exec, child, inner));
    DRV(drv.launch(exec, run_stream));
    ref.launch(100, 2, 9, 11);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("with the first child graph again", b, ref);

    // ---- what the driver refuses
    CUresult rc = drv.exec_kernel_set(exec, memset_node, &u1);
    printf("error: kernel update of a memset node -> %s\n", error_name(rc));
    EXPECT(rc != CUDA_SUCCESS, "a memset node took kernel parameters");
    rc = drv.exec_kernel_set(exec, inner_nodes[0], &u1);
    printf("error: kernel update of a node of another graph -> %s\n", error_name(rc));
    EXPECT(rc != CUDA_SUCCESS, "a node of another graph was updated in the executable graph");
    p = kernel_node(axpy_fn, nullptr, axpy_params, nullptr);
    CUgraphNode stray = nullptr;
    rc = drv.add_node(&stray, outer, &inner_nodes[0], nullptr, 1, &p);
    printf("error: a dependency in another graph -> %s\n", error_name(rc));
    EXPECT(rc != CUDA_SUCCESS, "a node was added after a node of another graph");
    CUgraphNodeType t{};
    rc = drv.node_type(nullptr, &t);
    printf("error: type of a null node -> %s\n", error_name(rc));
    EXPECT(rc != CUDA_SUCCESS, "a null node has a type");
    CUgraph lone = nullptr;
    CUgraphNode lone_node = nullptr;
    DRV(drv.graph_create(&lone, 0));
    std::memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_EMPTY;
    DRV(drv.add_node(&lone_node, lone, nullptr, nullptr, 0, &p));
    rc = drv.exec_child_set(exec, child, lone);
    printf("error: a child graph of another shape -> %s\n", error_name(rc));
    EXPECT(rc != CUDA_SUCCESS, "a child graph of another shape was taken");

    // ---- the child graph node holds its own copy: the captured graphs may go
    DRV(drv.exec_child_set(exec, child, inner2));
    DRV(drv.graph_destroy(inner));
    DRV(drv.launch(exec, run_stream));
    ref.launch(500, 3, 9, 11);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("after destroying the first captured graph", b, ref);

    // ---- a node of the graph itself changes later executable graphs only
    a1 = 13;
    CUDA_KERNEL_NODE_PARAMS g1 = kernel_update(axpy_fn, nullptr, axpy_params, nullptr);
    DRV(drv.kernel_node_set(k1, &g1));
    CUgraphExec exec2 = nullptr;
    DRV(drv.instantiate(&exec2, outer, 0));
    DRV(drv.launch(exec2, run_stream));
    ref.launch(100, 2, 13, 7);
    DRV(drv.launch(exec, run_stream));
    ref.launch(500, 3, 9, 11);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("a second executable graph after changing a node, then the first", b, ref);
    fflush(stdout);
    if (idle_ms > 0) usleep(static_cast<useconds_t>(idle_ms) * 1000);
    // ---- after the pause (in which a suspending server makes both executable graphs again): the same work
    DRV(drv.launch(exec, run_stream));
    ref.launch(500, 3, 9, 11);
    DRV(drv.launch(exec2, run_stream));
    ref.launch(100, 2, 13, 7);
    CHECK(cudaStreamSynchronize(run_stream));
    expect_results("after the pause, both executable graphs", b, ref);

    DRV(drv.exec_destroy(exec));
    DRV(drv.exec_destroy(exec2));
    DRV(drv.graph_destroy(inner2));
    DRV(drv.graph_destroy(lone));
    DRV(drv.graph_destroy(outer));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(capture_stream));
    CHECK(cudaStreamDestroy(run_stream));
    for (unsigned* q : {b.x, b.y, b.z, b.w, b.w2}) CHECK(cudaFree(q));
    return pass();
}
