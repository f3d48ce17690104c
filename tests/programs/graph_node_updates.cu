// graph_node_updates: the graph calls JAX's tests met through vcuda (issue 15), as XLA and cuDNN make them.
// New parameters for memset, memcpy, host and event record nodes, on an executable graph
// (cuGraphExec*NodeSetParams, cuGraphExecNodeSetParams) and on the graph itself (cuGraph*NodeSetParams,
// cuGraphNodeSetParams); a child graph moved into its node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) whose kernel
// node is then updated through the parent's executable graph; a kernel node of a conditional node's body
// updated the same way; and a memset captured at a placeholder address (cuDNN records its graphs so) that
// gets its real address before the graph runs. Also what nodes hold (an event record node's event, a child
// graph node's graph, a kernel node's parameters), an executable graph's flags, and a node of it switched off
// and on (cuGraphNodeSetEnabled), a graph's edges and its DOT description. Every launch is checked against
// the values it must produce. Calls the driver must refuse print the error they got (the native run is the
// reference).
#include <cuda.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"

// x[i] = base + i
extern "C" __global__ void gu_fill(unsigned* x, int n, unsigned base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + i;
}

// x[i] *= k
extern "C" __global__ void gu_scale(unsigned* x, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= k;
}

namespace {

const int n = 4096, threads = 256, blocks = n / threads;
const size_t bytes = n * sizeof(unsigned);

void* entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12030, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn)
        fail("%s: no driver entry point (%d)", name, static_cast<int>(q));
    return fn;
}
#define DRIVER(name) reinterpret_cast<decltype(&::name)>(entry(#name))

struct driver {
    decltype(&::cuGetErrorName) error_name = DRIVER(cuGetErrorName);
    decltype(&::cuGraphCreate) create = DRIVER(cuGraphCreate);
    decltype(&::cuGraphDestroy) destroy = DRIVER(cuGraphDestroy);
    decltype(&::cuGraphAddNode_v2) add =
        reinterpret_cast<decltype(&::cuGraphAddNode_v2)>(entry("cuGraphAddNode"));
    decltype(&::cuGraphInstantiateWithFlags) instantiate = DRIVER(cuGraphInstantiateWithFlags);
    decltype(&::cuGraphLaunch) launch = DRIVER(cuGraphLaunch);
    decltype(&::cuGraphExecDestroy) exec_destroy = DRIVER(cuGraphExecDestroy);
    decltype(&::cuGraphExecMemsetNodeSetParams) exec_memset = DRIVER(cuGraphExecMemsetNodeSetParams);
    decltype(&::cuGraphExecMemcpyNodeSetParams) exec_memcpy = DRIVER(cuGraphExecMemcpyNodeSetParams);
    decltype(&::cuGraphExecHostNodeSetParams) exec_host = DRIVER(cuGraphExecHostNodeSetParams);
    decltype(&::cuGraphExecEventRecordNodeSetEvent) exec_record = DRIVER(cuGraphExecEventRecordNodeSetEvent);
    decltype(&::cuGraphExecNodeSetParams) exec_node = DRIVER(cuGraphExecNodeSetParams);
    decltype(&::cuGraphExecKernelNodeSetParams) exec_kernel = DRIVER(cuGraphExecKernelNodeSetParams);
    decltype(&::cuGraphMemsetNodeSetParams) memset = DRIVER(cuGraphMemsetNodeSetParams);
    decltype(&::cuGraphMemcpyNodeSetParams) memcpy = DRIVER(cuGraphMemcpyNodeSetParams);
    decltype(&::cuGraphNodeSetParams) node = DRIVER(cuGraphNodeSetParams);
    decltype(&::cuGraphNodeGetType) node_type = DRIVER(cuGraphNodeGetType);
    decltype(&::cuGraphGetNodes) nodes = DRIVER(cuGraphGetNodes);
    decltype(&::cuGraphConditionalHandleCreate) cond_handle = DRIVER(cuGraphConditionalHandleCreate);
    decltype(&::cuStreamBeginCapture) begin_capture = DRIVER(cuStreamBeginCapture);
    decltype(&::cuStreamEndCapture) end_capture = DRIVER(cuStreamEndCapture);
    decltype(&::cuMemsetD8Async) memset_async = DRIVER(cuMemsetD8Async);
    decltype(&::cuCtxGetCurrent) current = DRIVER(cuCtxGetCurrent);
    decltype(&::cuGraphEventRecordNodeGetEvent) record_event = DRIVER(cuGraphEventRecordNodeGetEvent);
    decltype(&::cuGraphChildGraphNodeGetGraph) child_graph = DRIVER(cuGraphChildGraphNodeGetGraph);
    decltype(&::cuGraphNodeSetEnabled) set_enabled = DRIVER(cuGraphNodeSetEnabled);
    decltype(&::cuGraphNodeGetEnabled) get_enabled = DRIVER(cuGraphNodeGetEnabled);
    decltype(&::cuGraphExecGetFlags) exec_flags = DRIVER(cuGraphExecGetFlags);
    decltype(&::cuGraphMemsetNodeGetParams) memset_params = DRIVER(cuGraphMemsetNodeGetParams);
    decltype(&::cuGraphClone) clone = DRIVER(cuGraphClone);
    decltype(&::cuGraphNodeFindInClone) find_in_clone = DRIVER(cuGraphNodeFindInClone);
    decltype(&::cuGraphKernelNodeGetParams_v2) kernel_params =
        reinterpret_cast<decltype(&::cuGraphKernelNodeGetParams_v2)>(entry("cuGraphKernelNodeGetParams"));
};

driver* d;

void ok(CUresult rc, const char* what) {
    if (rc != CUDA_SUCCESS) {
        const char* name = "?";
        d->error_name(rc, &name);
        fail("%s: %s", what, name);
    }
}

// A call that must fail: what it answered (the native run says which error is right).
void refused(CUresult rc, const char* what) {
    const char* name = "?";
    d->error_name(rc, &name);
    printf("%s -> %s\n", what, rc == CUDA_SUCCESS ? "accepted" : name);
}

int host_marker = 0;
void CUDA_CB mark_one(void*) { host_marker = 1; }
void CUDA_CB mark_two(void* p) { host_marker = *static_cast<int*>(p); }

std::vector<unsigned> read(CUdeviceptr p) {
    std::vector<unsigned> h(n);
    CHECK(cudaMemcpy(h.data(), reinterpret_cast<void*>(p), bytes, cudaMemcpyDeviceToHost));
    return h;
}

void expect_all(CUdeviceptr p, unsigned v, const char* what) {
    auto h = read(p);
    for (int i = 0; i < n; ++i)
        if (h[i] != v) fail("%s: element %d is %u, not %u", what, i, h[i], v);
    printf("%s: all %u\n", what, v);
}

void expect_ramp(CUdeviceptr p, unsigned base, unsigned k, const char* what) {
    auto h = read(p);
    for (int i = 0; i < n; ++i)
        if (h[i] != (base + i) * k) fail("%s: element %d is %u, not %u", what, i, h[i], (base + i) * k);
    printf("%s: (base %u + i) * %u\n", what, base, k);
}

CUDA_MEMSET_NODE_PARAMS memset_of(CUdeviceptr dst, unsigned value) {
    CUDA_MEMSET_NODE_PARAMS m{};
    m.dst = dst;
    m.value = value;
    m.elementSize = 4;
    m.width = n;
    m.height = 1;
    m.pitch = 0;
    return m;
}

// The same as cuGraphAddNode's union takes it (CUDA_MEMSET_NODE_PARAMS_v2, with its context).
CUgraphNodeParams memset_node(CUdeviceptr dst, unsigned value, CUcontext ctx) {
    const auto m = memset_of(dst, value);
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = m.dst;
    p.memset.value = m.value;
    p.memset.elementSize = m.elementSize;
    p.memset.width = m.width;
    p.memset.height = m.height;
    p.memset.pitch = m.pitch;
    p.memset.ctx = ctx;
    return p;
}

CUDA_MEMCPY3D copy_of(CUdeviceptr dst, CUdeviceptr src) {
    CUDA_MEMCPY3D c{};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.WidthInBytes = bytes;
    c.Height = 1;
    c.Depth = 1;
    return c;
}

struct kernel_args {
    CUdeviceptr x;
    int count = n;
    unsigned v;
    void* params[3] = {&x, &count, &v};
};

CUDA_KERNEL_NODE_PARAMS kernel_of(CUfunction f, kernel_args& a) {
    CUDA_KERNEL_NODE_PARAMS k{};
    k.func = f;
    k.gridDimX = blocks;
    k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = threads;
    k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = a.params;
    return k;
}

// The same as cuGraphAddNode's union takes it.
CUgraphNodeParams kernel_node(CUfunction f, kernel_args& a) {
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    const auto k = kernel_of(f, a);
    static_assert(sizeof k == sizeof p.kernel, "kernel node layouts");
    memcpy(&p.kernel, &k, sizeof k);
    return p;
}

CUgraphNode add(CUgraph g, CUgraphNode after, CUgraphNodeParams p, const char* what) {
    CUgraphNode out = nullptr;
    ok(d->add(&out, g, after ? &after : nullptr, nullptr, after ? 1 : 0, &p), what);
    return out;
}

void run(CUgraphExec x, CUstream s) {
    ok(d->launch(x, s), "cuGraphLaunch");
    CHECK(cudaStreamSynchronize(s));
}

CUdeviceptr alloc() {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, 0, bytes));
    return reinterpret_cast<CUdeviceptr>(p);
}

}  // namespace

int main() {
    CHECK(cudaFree(nullptr));
    driver drv;
    d = &drv;
    CUcontext ctx = nullptr;
    ok(d->current(&ctx), "cuCtxGetCurrent");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUfunction fill = nullptr, scale = nullptr;
    CHECK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&fill),
                              reinterpret_cast<const void*>(gu_fill)));
    CHECK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&scale),
                              reinterpret_cast<const void*>(gu_scale)));
    CUdeviceptr a = alloc(), b = alloc(), a2 = alloc(), b2 = alloc(), c = alloc();
    cudaEvent_t ev1, ev2;
    CHECK(cudaEventCreate(&ev1));
    CHECK(cudaEventCreate(&ev2));

    // --- memset -> memcpy -> host -> event record, then each changed in the executable graph.
    CUgraph g;
    ok(d->create(&g, 0), "cuGraphCreate");
    CUgraphNodeParams p = memset_node(a, 7, ctx);
    CUgraphNode m = add(g, nullptr, p, "memset node");
    p = {};
    p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    p.memcpy.copyParams = copy_of(b, a);
    p.memcpy.copyCtx = ctx;
    CUgraphNode cp = add(g, m, p, "memcpy node");
    p = {};
    p.type = CU_GRAPH_NODE_TYPE_HOST;
    p.host = {mark_one, nullptr};
    CUgraphNode h = add(g, cp, p, "host node");
    p = {};
    p.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
    p.eventRecord.event = ev1;
    CUgraphNode e = add(g, h, p, "event record node");
    CUgraphExec x;
    ok(d->instantiate(&x, g, 0), "cuGraphInstantiateWithFlags");
    run(x, s);
    expect_all(b, 7, "first launch, b");
    EXPECT(host_marker == 1, "the host node did not run (marker %d)", host_marker);
    CHECK(cudaEventQuery(ev1));

    auto m2 = memset_of(a2, 9);
    ok(d->exec_memset(x, m, &m2, ctx), "cuGraphExecMemsetNodeSetParams");
    auto c2 = copy_of(b2, a2);
    ok(d->exec_memcpy(x, cp, &c2, ctx), "cuGraphExecMemcpyNodeSetParams");
    int two = 2;
    CUDA_HOST_NODE_PARAMS h2{mark_two, &two};
    ok(d->exec_host(x, h, &h2), "cuGraphExecHostNodeSetParams");
    ok(d->exec_record(x, e, ev2), "cuGraphExecEventRecordNodeSetEvent");
    run(x, s);
    expect_all(b2, 9, "updated launch, b2");
    expect_all(b, 7, "updated launch, b (unchanged)");
    EXPECT(host_marker == 2, "the updated host node did not run (marker %d)", host_marker);
    CHECK(cudaEventQuery(ev2));

    // The generic form, on the executable graph.
    p = memset_node(a2, 15, ctx);
    ok(d->exec_node(x, m, &p), "cuGraphExecNodeSetParams (memset)");
    run(x, s);
    expect_all(b2, 15, "generic update, b2");

    // The graph's own nodes, for a new executable graph; the first one keeps what it has.
    auto m3 = memset_of(a, 11);
    ok(d->memset(m, &m3), "cuGraphMemsetNodeSetParams");
    auto c3 = copy_of(c, a);
    ok(d->memcpy(cp, &c3), "cuGraphMemcpyNodeSetParams");
    CUgraphExec x2;
    ok(d->instantiate(&x2, g, 0), "cuGraphInstantiateWithFlags (changed graph)");
    run(x2, s);
    expect_all(c, 11, "changed graph, c");
    p = memset_node(a, 13, ctx);
    ok(d->node(m, &p), "cuGraphNodeSetParams (memset)");
    CUgraphExec x3;
    ok(d->instantiate(&x3, g, 0), "cuGraphInstantiateWithFlags (generic change)");
    run(x3, s);
    expect_all(c, 13, "generic change, c");
    run(x, s);
    expect_all(b2, 15, "first executable graph again, b2");

    // What the graph's nodes hold (the graph's node keeps its event; the update was the executable graph's),
    // the executable graph's flags, and a node of it switched off and on again.
    CUevent held = nullptr;
    ok(d->record_event(e, &held), "cuGraphEventRecordNodeGetEvent");
    EXPECT(held == ev1, "the event record node names another event");
    refused(d->record_event(m, &held), "the event of a memset node");
    CUDA_MEMSET_NODE_PARAMS held_m{};
    ok(d->memset_params(m, &held_m), "cuGraphMemsetNodeGetParams");
    EXPECT(held_m.dst == a && held_m.value == 13 && held_m.elementSize == m3.elementSize &&
               held_m.width == m3.width && held_m.height == m3.height,
           "the memset node holds value %u, %zu x %zu", held_m.value, held_m.width, held_m.height);
    // A clone of the graph: the memset node's copy there, changed, changes only the clone.
    CUgraph g2 = nullptr;
    ok(d->clone(&g2, g), "cuGraphClone");
    CUgraphNode m_copy = nullptr;
    ok(d->find_in_clone(&m_copy, m, g2), "cuGraphNodeFindInClone");
    CUgraphNodeType copy_type{};
    ok(d->node_type(m_copy, &copy_type), "cuGraphNodeGetType (the copy)");
    EXPECT(copy_type == CU_GRAPH_NODE_TYPE_MEMSET, "the copy's type is %d", static_cast<int>(copy_type));
    auto m4 = memset_of(a, 17);
    ok(d->memset(m_copy, &m4), "cuGraphMemsetNodeSetParams (the copy)");
    ok(d->memset_params(m, &held_m), "cuGraphMemsetNodeGetParams (the original, after the copy changed)");
    EXPECT(held_m.value == 13, "changing the copy changed the original (value %u)", held_m.value);
    CUgraphExec x4;
    ok(d->instantiate(&x4, g2, 0), "cuGraphInstantiateWithFlags (clone)");
    run(x4, s);
    expect_all(c, 17, "the clone's changed memset, c");
    ok(d->exec_destroy(x4), "cuGraphExecDestroy (clone)");
    ok(d->destroy(g2), "cuGraphDestroy (clone)");
    cuuint64_t xflags = 1;
    ok(d->exec_flags(x, &xflags), "cuGraphExecGetFlags");
    EXPECT(xflags == 0, "the executable graph's flags are %llu", static_cast<unsigned long long>(xflags));
    unsigned on = 0;
    ok(d->get_enabled(x, m, &on), "cuGraphNodeGetEnabled");
    EXPECT(on == 1, "the memset node is off before it was switched off");
    ok(d->set_enabled(x, m, 0), "cuGraphNodeSetEnabled (off)");
    ok(d->get_enabled(x, m, &on), "cuGraphNodeGetEnabled (off)");
    EXPECT(on == 0, "the memset node is still on");
    CHECK(cudaMemset(reinterpret_cast<void*>(a2), 0, bytes));
    run(x, s);
    expect_all(b2, 0, "memset node switched off, b2");
    ok(d->set_enabled(x, m, 1), "cuGraphNodeSetEnabled (on)");
    run(x, s);
    expect_all(b2, 15, "memset node switched on again, b2");

    // Wrong targets: a memset update of the memcpy node, an update of another graph's node.
    refused(d->exec_memset(x, cp, &m2, ctx), "memset parameters for a memcpy node");
    CUgraph other;
    ok(d->create(&other, 0), "cuGraphCreate (other)");
    p = memset_node(a, 1, ctx);
    CUgraphNode foreign = add(other, nullptr, p, "memset node (other graph)");
    refused(d->exec_memset(x, foreign, &m2, ctx), "an update of another graph's node");

    // --- a child graph moved into its node; its kernel node updated through the parent's executable graph.
    CUgraph child, parent;
    ok(d->create(&child, 0), "cuGraphCreate (child)");
    ok(d->create(&parent, 0), "cuGraphCreate (parent)");
    kernel_args fa{c, n, 100}, sa{c, n, 2};
    CUgraphNode k1 = add(child, nullptr, kernel_node(fill, fa), "kernel node fill (child)");
    CUgraphNode k2 = add(child, k1, kernel_node(scale, sa), "kernel node scale (child)");
    p = {};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    CUgraphNode child_node = add(parent, nullptr, p, "child graph node (moved)");
    CUgraph inside = nullptr;
    ok(d->child_graph(child_node, &inside), "cuGraphChildGraphNodeGetGraph");
    EXPECT(inside == child, "the child graph node holds another graph than the one moved into it");
    CUgraphNodeType t{};
    ok(d->node_type(k2, &t), "cuGraphNodeGetType (moved child's node)");
    printf("moved child's node type %d\n", static_cast<int>(t));
    CUgraphExec xp;
    ok(d->instantiate(&xp, parent, 0), "cuGraphInstantiateWithFlags (parent)");
    run(xp, s);
    expect_ramp(c, 100, 2, "moved child");
    kernel_args sa3{c, n, 3};
    auto ks3 = kernel_of(scale, sa3);
    ok(d->exec_kernel(xp, k2, &ks3), "cuGraphExecKernelNodeSetParams (moved child's node)");
    run(xp, s);
    expect_ramp(c, 100, 3, "moved child, updated");
    // The graph's node still holds what it was made with (the update was the executable graph's).
    CUDA_KERNEL_NODE_PARAMS held_k{};
    ok(d->kernel_params(k2, &held_k), "cuGraphKernelNodeGetParams");
    // Printed, not required: the native run is the reference for which handle the driver gives back.
    printf("the kernel node's function is the one it was made with: %s\n",
           held_k.func == scale ? "yes" : "no");
    EXPECT(held_k.gridDimX == blocks && held_k.blockDimX == threads && held_k.gridDimY == 1 &&
               held_k.sharedMemBytes == 0,
           "the kernel node's shape is %ux%u, %u bytes", held_k.gridDimX, held_k.blockDimX,
           held_k.sharedMemBytes);
    EXPECT(held_k.kernelParams && *static_cast<CUdeviceptr*>(held_k.kernelParams[0]) == c &&
               *static_cast<int*>(held_k.kernelParams[1]) == n &&
               *static_cast<unsigned*>(held_k.kernelParams[2]) == 2,
           "the kernel node's parameters are not the ones it was made with");
    refused(d->kernel_params(child_node, &held_k), "the kernel parameters of a child graph node");

    // --- a kernel node in a conditional node's body, updated through the executable graph.
    CUgraph cg;
    ok(d->create(&cg, 0), "cuGraphCreate (conditional)");
    CUgraphConditionalHandle cond{};
    ok(d->cond_handle(&cond, cg, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT), "cuGraphConditionalHandleCreate");
    p = {};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = cond;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUgraphNodeParams cp2 = p;
    CUgraphNode cn = nullptr;
    ok(d->add(&cn, cg, nullptr, nullptr, 0, &cp2), "conditional node");
    CUgraph body = cp2.conditional.phGraph_out[0];
    kernel_args ba{b, n, 5};
    CUgraphNode kbn = add(body, nullptr, kernel_node(fill, ba), "kernel node (body)");
    CUgraphExec xc;
    ok(d->instantiate(&xc, cg, 0), "cuGraphInstantiateWithFlags (conditional)");
    run(xc, s);
    expect_ramp(b, 5, 1, "conditional body");
    kernel_args ba2{b, n, 50};
    auto kb2 = kernel_of(fill, ba2);
    ok(d->exec_kernel(xc, kbn, &kb2), "cuGraphExecKernelNodeSetParams (body node)");
    run(xc, s);
    expect_ramp(b, 50, 1, "conditional body, updated");

    // --- a memset captured at a placeholder address, given its real one before the graph runs.
    CUstream cs = reinterpret_cast<CUstream>(s);
    ok(d->begin_capture(cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    ok(d->memset_async(0x80, 0, 32, cs), "cuMemsetD8Async at 0x80 while capturing");
    CUgraph captured = nullptr;
    ok(d->end_capture(cs, &captured), "cuStreamEndCapture");
    CUgraphNode found = nullptr;
    size_t count = 1;
    ok(d->nodes(captured, &found, &count), "cuGraphGetNodes");
    EXPECT(count == 1 && found, "the capture holds %zu nodes", count);
    auto real = memset_of(a2, 0x01010101u);
    real.elementSize = 1;
    real.width = bytes;
    real.value = 1;
    ok(d->memset(found, &real), "cuGraphMemsetNodeSetParams (placeholder -> real)");
    CUgraphExec xm;
    ok(d->instantiate(&xm, captured, 0), "cuGraphInstantiateWithFlags (captured)");
    run(xm, s);
    expect_all(a2, 0x01010101u, "placeholder memset, given its address");

    // --- a graph's edges (cudaGraphGetEdges) and its DOT description (cudaGraphDebugDotPrint): one node
    // fanning out to two.
    cudaGraph_t fan;
    CHECK(cudaGraphCreate(&fan, 0));
    int fill_n = n;
    unsigned fill_base = 7;
    void* fill_args[] = {&a, &fill_n, &fill_base};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(gu_fill);
    kp.gridDim = dim3(blocks);
    kp.blockDim = dim3(threads);
    kp.kernelParams = fill_args;
    cudaGraphNode_t head, left, right;
    CHECK(cudaGraphAddKernelNode(&head, fan, nullptr, 0, &kp));
    CHECK(cudaGraphAddKernelNode(&left, fan, &head, 1, &kp));
    CHECK(cudaGraphAddKernelNode(&right, fan, &head, 1, &kp));
    size_t edges = 0;
    CHECK(cudaGraphGetEdges(fan, nullptr, nullptr, nullptr, &edges));
    EXPECT(edges == 2, "cudaGraphGetEdges counts %zu edges", edges);
    cudaGraphNode_t from[3], to[3];
    cudaGraphEdgeData edge_data[3];
    edges = 3;
    CHECK(cudaGraphGetEdges(fan, from, to, edge_data, &edges));
    EXPECT(edges == 2 && from[0] == head && from[1] == head && from[2] == nullptr && to[2] == nullptr &&
               ((to[0] == left && to[1] == right) || (to[0] == right && to[1] == left)) &&
               edge_data[0].type == cudaGraphDependencyTypeDefault,
           "cudaGraphGetEdges listed %zu edges, not head -> left and head -> right", edges);
    printf("cudaGraphGetEdges: head -> left, head -> right\n");
    char dot_path[] = "/tmp/graph_node_updates_XXXXXX";
    int dot_fd = mkstemp(dot_path);
    EXPECT(dot_fd >= 0, "mkstemp");
    close(dot_fd);
    auto dot_text = [&](unsigned flags) {
        CHECK(cudaGraphDebugDotPrint(fan, dot_path, flags));
        std::string text;
        if (FILE* f = fopen(dot_path, "r")) {
            char buf[4096];
            for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
            fclose(f);
        }
        return text;
    };
    const std::string plain = dot_text(0), verbose = dot_text(cudaGraphDebugDotFlagsVerbose);
    unlink(dot_path);
    EXPECT(plain.find("gu_fill") != std::string::npos && plain.find("digraph") != std::string::npos,
           "the DOT description names no gu_fill node:\n%s", plain.c_str());
    EXPECT(verbose.find("gu_fill") != std::string::npos && verbose != plain,
           "the verbose DOT description is not another, naming gu_fill");
    printf("cudaGraphDebugDotPrint: names the kernel; verbose differs\n");
    CHECK(cudaGraphDestroy(fan));

    for (CUgraphExec ex : {x, x2, x3, xp, xc, xm}) ok(d->exec_destroy(ex), "cuGraphExecDestroy");
    for (CUgraph gr : {g, other, parent, cg, captured}) ok(d->destroy(gr), "cuGraphDestroy");
    CHECK(cudaEventDestroy(ev1));
    CHECK(cudaEventDestroy(ev2));
    for (CUdeviceptr ptr : {a, b, a2, b2, c}) CHECK(cudaFree(reinterpret_cast<void*>(ptr)));
    CHECK(cudaStreamDestroy(s));
    return pass();
}
