// Unit tests of the software test driver's stream capture and graphs (soft_graph.cpp): work on a capturing
// stream is recorded, not run; instantiated graphs replay it; the real driver's capture rules that programs
// meet hold; graphs built node by node run in dependency order, and executable graphs take kernel and child
// graph updates. The library is dlopened, as vcuda-server does.
#define CATCH_CONFIG_MAIN
#include <cuda.h>
#include <dlfcn.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "soft_kernel.hpp"

namespace {

// clang-format 14 reflows this list differently on each run: left as written.
// clang-format off
#define VCUDA_SOFT_GRAPH_FUNCTIONS(X)                                                                              \
    X(cuInit) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) X(cuMemAlloc_v2)      \
    X(cuMemFree_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD32Async) X(cuMemsetD32_v2) X(cuStreamCreate)  \
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord) X(cuEventDestroy_v2)            \
    X(cuStreamWaitEvent) X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuKernelGetFunction)      \
    X(cuLaunchKernel) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing)                      \
    X(cuStreamGetCaptureInfo_v3) X(cuThreadExchangeStreamCaptureMode) X(cuGraphCreate) X(cuGraphDestroy)           \
    X(cuGraphGetNodes) X(cuGraphGetRootNodes) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams)       \
    X(cuGraphExecDestroy) X(cuGraphLaunch) X(cuGraphUpload) X(cuStreamBeginCaptureToGraph) X(cuGraphAddNode_v2)     \
    X(cuGraphNodeGetType) X(cuGraphNodeGetDependencies_v2) X(cuGraphNodeGetDependentNodes_v2)                      \
    X(cuGraphAddDependencies_v2) X(cuGraphRemoveDependencies_v2) X(cuGraphDestroyNode)                             \
    X(cuGraphKernelNodeSetParams_v2) X(cuGraphExecKernelNodeSetParams_v2) X(cuGraphExecChildGraphNodeSetParams)   \
    X(cuGraphClone) X(cuGraphHostNodeGetParams) X(cuGraphChildGraphNodeGetGraph) X(cuGraphExecUpdate_v2)           \
    X(cuUserObjectCreate) X(cuUserObjectRelease) X(cuGraphRetainUserObject) X(cuGraphReleaseUserObject)            \
    X(cuStreamUpdateCaptureDependencies_v2) X(cuLaunchHostFunc)
// clang-format on

struct soft_driver {
    void* lib = nullptr;
    void (*register_kernel)(vcuda::soft::kernel_entry) = nullptr;
#define VCUDA_SOFT_GRAPH_MEMBER(name) decltype(&::name) name = nullptr;
    VCUDA_SOFT_GRAPH_FUNCTIONS(VCUDA_SOFT_GRAPH_MEMBER)
#undef VCUDA_SOFT_GRAPH_MEMBER
};

soft_driver& drv() {
    static soft_driver* d = [] {
        auto* s = new soft_driver;
        s->lib = dlopen(VCUDA_SOFTDRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
        if (s->lib == nullptr) FAIL("dlopen " VCUDA_SOFTDRIVER_PATH ": " << dlerror());
#define VCUDA_SOFT_GRAPH_LOAD(name)                                      \
    s->name = reinterpret_cast<decltype(&::name)>(dlsym(s->lib, #name)); \
    if (s->name == nullptr) FAIL("the software driver does not export " #name);
        VCUDA_SOFT_GRAPH_FUNCTIONS(VCUDA_SOFT_GRAPH_LOAD)
#undef VCUDA_SOFT_GRAPH_LOAD
        s->register_kernel = reinterpret_cast<void (*)(vcuda::soft::kernel_entry)>(
            dlsym(s->lib, "_ZN5vcuda4soft15register_kernelENS0_12kernel_entryE"));
        if (s->register_kernel == nullptr) FAIL("the software driver does not export its kernel registry");
        // add_one(unsigned* x, int n): x[i] += 1
        s->register_kernel({"soft_graph_test_add_one", {8, 4}, [](const vcuda::soft::launch& l) {
                                auto x = l.param<unsigned*>(0);
                                auto n = l.param<int>(1);
                                for (int i = 0; i < n; ++i) x[i] += 1;
                            }});
        if (s->cuInit(0) != CUDA_SUCCESS) FAIL("cuInit failed");
        return s;
    }();
    return *d;
}

const unsigned char fake_image[16] = {0x50, 0xed, 0x55, 0xba};  // never parsed

// The primary context of device 0, a library with the test kernel, a non-blocking stream (so that synchronous
// calls may read results while it captures) and a small buffer.
struct fixture {
    soft_driver& d = drv();
    CUcontext ctx = nullptr;
    CUlibrary lib = nullptr;
    CUfunction add_one = nullptr;
    CUstream stream = nullptr;
    CUdeviceptr buf = 0;
    static constexpr int n = 64;

    fixture() {
        REQUIRE(d.cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
        REQUIRE(d.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
        REQUIRE(d.cuLibraryLoadData(&lib, fake_image, nullptr, nullptr, 0, nullptr, nullptr, 0) ==
                CUDA_SUCCESS);
        CUkernel k = nullptr;
        REQUIRE(d.cuLibraryGetKernel(&k, lib, "soft_graph_test_add_one") == CUDA_SUCCESS);
        REQUIRE(d.cuKernelGetFunction(&add_one, k) == CUDA_SUCCESS);
        REQUIRE(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        REQUIRE(d.cuMemAlloc_v2(&buf, n * sizeof(unsigned)) == CUDA_SUCCESS);
        REQUIRE(d.cuMemsetD32_v2(buf, 0, n) == CUDA_SUCCESS);
    }
    ~fixture() {
        d.cuMemFree_v2(buf);
        d.cuStreamDestroy_v2(stream);
        d.cuLibraryUnload(lib);
        d.cuCtxSetCurrent(nullptr);
        d.cuDevicePrimaryCtxRelease_v2(0);
    }
    // Launches add_one on `s` with parameters that are gone when the call returns, as a captured launch's
    // are.
    CUresult launch(CUstream s) {
        CUdeviceptr p = buf;
        int count = n;
        void* params[] = {&p, &count};
        return d.cuLaunchKernel(add_one, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
    }
    std::vector<unsigned> read(CUdeviceptr from = 0) {
        std::vector<unsigned> out(n);
        REQUIRE(d.cuMemcpyDtoH_v2(out.data(), from ? from : buf, n * sizeof(unsigned)) == CUDA_SUCCESS);
        return out;
    }
    // add_one on buffer `p` as a kernel node's parameters (kernelParams pointing into this object).
    struct add_one_node {
        CUdeviceptr p;
        int count = n;
        void* params[2] = {&p, &count};
        CUgraphNodeParams node{};
        add_one_node(CUfunction f, CUdeviceptr buffer) : p(buffer) {
            node.type = CU_GRAPH_NODE_TYPE_KERNEL;
            node.kernel.func = f;
            node.kernel.gridDimX = node.kernel.gridDimY = node.kernel.gridDimZ = 1;
            node.kernel.blockDimX = 32;
            node.kernel.blockDimY = node.kernel.blockDimZ = 1;
            node.kernel.kernelParams = params;
        }
        CUDA_KERNEL_NODE_PARAMS update() const {
            CUDA_KERNEL_NODE_PARAMS u{};
            std::memcpy(&u, &node.kernel, sizeof u);
            return u;
        }
    };
    CUgraphNode add(CUgraph g, const CUgraphNodeParams& p, std::vector<CUgraphNode> deps = {}) {
        CUgraphNode node = nullptr;
        CUgraphNodeParams copy = p;
        REQUIRE(d.cuGraphAddNode_v2(&node, g, deps.data(), nullptr, deps.size(), &copy) == CUDA_SUCCESS);
        return node;
    }
    CUgraphNode add_kernel(CUgraph g, std::vector<CUgraphNode> deps = {}) {
        return add(g, add_one_node(add_one, buf).node, deps);
    }
    CUgraphNode add_memset(CUgraph g, unsigned value, std::vector<CUgraphNode> deps = {}) {
        CUgraphNodeParams p{};
        p.type = CU_GRAPH_NODE_TYPE_MEMSET;
        p.memset = {buf, 0, value, 4, n, 1, ctx};
        return add(g, p, deps);
    }
    CUgraphNode add_empty(CUgraph g, std::vector<CUgraphNode> deps = {}) {
        CUgraphNodeParams p{};
        p.type = CU_GRAPH_NODE_TYPE_EMPTY;
        return add(g, p, deps);
    }
    CUgraphNodeType type(CUgraphNode node) {
        CUgraphNodeType t{};
        REQUIRE(d.cuGraphNodeGetType(node, &t) == CUDA_SUCCESS);
        return t;
    }
    CUresult run(CUgraph g) {
        CUgraphExec exec = nullptr;
        if (CUresult r =
                d.cuGraphInstantiateWithFlags(&exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
            r != CUDA_SUCCESS)
            return r;
        CUresult r = d.cuGraphLaunch(exec, stream);
        d.cuGraphExecDestroy(exec);
        return r;
    }
    CUstreamCaptureStatus status(CUstream s) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        REQUIRE(d.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
        return st;
    }
};

}  // namespace

TEST_CASE("capture records work, graphs replay it", "[unit]") {
    fixture f;
    auto& d = f.d;
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(f.status(f.stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    CUgraph during = nullptr;
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, &id, &during, nullptr, nullptr, nullptr) ==
            CUDA_SUCCESS);
    CHECK(id != 0);
    REQUIRE(d.cuMemsetD32Async(f.buf, 10, fixture::n, f.stream) == CUDA_SUCCESS);
    REQUIRE(f.launch(f.stream) == CUDA_SUCCESS);
    REQUIRE(f.launch(f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 0);  // nothing ran

    CUgraph g = nullptr;
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    CHECK(g == during);
    CHECK(f.status(f.stream) == CU_STREAM_CAPTURE_STATUS_NONE);
    size_t nodes = 0, roots = 0;
    REQUIRE(d.cuGraphGetNodes(g, nullptr, &nodes) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphGetRootNodes(g, nullptr, &roots) == CUDA_SUCCESS);
    CHECK(nodes == 3);
    CHECK(roots == 1);

    CUgraphExec exec = nullptr;
    REQUIRE(d.cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS);
    CHECK(d.cuGraphInstantiateWithFlags(&exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[fixture::n - 1] == 12);
    REQUIRE(d.cuMemsetD32_v2(f.buf, 0, fixture::n) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphUpload(exec, f.stream) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 12);  // the memset is part of the graph

    CUDA_GRAPH_INSTANTIATE_PARAMS params{};
    params.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    params.hUploadStream = f.stream;
    CUgraphExec exec2 = nullptr;
    REQUIRE(d.cuGraphInstantiateWithParams(&exec2, g, &params) == CUDA_SUCCESS);
    CHECK(params.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS);
    CHECK(d.cuGraphExecDestroy(exec2) == CUDA_SUCCESS);
    CHECK(d.cuGraphExecDestroy(exec) == CUDA_SUCCESS);
    CHECK(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    CHECK(d.cuGraphLaunch(exec, f.stream) == CUDA_ERROR_INVALID_VALUE);

    CUgraph empty = nullptr;
    REQUIRE(d.cuGraphCreate(&empty, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphGetNodes(empty, nullptr, &nodes) == CUDA_SUCCESS);
    CHECK(nodes == 0);
    CHECK(d.cuGraphDestroy(empty) == CUDA_SUCCESS);
}

TEST_CASE("a stream joins a capture by waiting on an event recorded in it", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUstream side = nullptr;
    CUevent fork = nullptr, join = nullptr;
    REQUIRE(d.cuStreamCreate(&side, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    REQUIRE(d.cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    REQUIRE(d.cuEventCreate(&join, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(fork, f.stream) == CUDA_SUCCESS);
    CHECK(f.status(side) == CU_STREAM_CAPTURE_STATUS_NONE);
    REQUIRE(d.cuStreamWaitEvent(side, fork, 0) == CUDA_SUCCESS);
    CHECK(f.status(side) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    REQUIRE(f.launch(side) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(join, side) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamWaitEvent(f.stream, join, 0) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 0);
    CUgraph g = nullptr;
    CHECK(d.cuStreamEndCapture(side, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);  // it began on f.stream
    CHECK(d.cuStreamEndCapture(f.stream, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == nullptr);
    CHECK(f.status(side) == CU_STREAM_CAPTURE_STATUS_NONE);

    // Again, ended properly: the side stream's launch is in the graph.
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(fork, f.stream) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamWaitEvent(side, fork, 0) == CUDA_SUCCESS);
    REQUIRE(f.launch(side) == CUDA_SUCCESS);
    REQUIRE(d.cuEventRecord(join, side) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamWaitEvent(f.stream, join, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    REQUIRE(d.cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 1);
    d.cuGraphExecDestroy(exec);
    d.cuGraphDestroy(g);
    d.cuEventDestroy_v2(fork);
    d.cuEventDestroy_v2(join);
    d.cuStreamDestroy_v2(side);
}

TEST_CASE("capture rules: legacy stream, synchronization, capture mode, thread", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph g = nullptr;
    // The legacy stream cannot capture, and is off limits while a blocking stream captures.
    CHECK(d.cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUstream blocking = nullptr;
    REQUIRE(d.cuStreamCreate(&blocking, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamBeginCapture_v2(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CHECK(d.cuStreamIsCapturing(CU_STREAM_LEGACY, &st) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(f.launch(CU_STREAM_LEGACY) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(f.status(blocking) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(d.cuStreamEndCapture(blocking, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(d.cuStreamDestroy_v2(blocking) == CUDA_SUCCESS);
    // A non-blocking stream's capture leaves the legacy stream alone.
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamIsCapturing(CU_STREAM_LEGACY, &st) == CUDA_SUCCESS);
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    CHECK(d.cuGraphDestroy(g) == CUDA_SUCCESS);

    // Synchronizing with a capturing stream invalidates the capture.
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(d.cuStreamSynchronize(f.stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(f.launch(f.stream) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(d.cuStreamEndCapture(f.stream, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // Allocations follow the thread's capture mode; ending belongs to the thread that began.
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK(d.cuMemAlloc_v2(&p, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    REQUIRE(d.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
    REQUIRE(d.cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
    REQUIRE(d.cuMemFree_v2(p) == CUDA_SUCCESS);
    REQUIRE(d.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CUresult end_elsewhere = CUDA_SUCCESS, alloc_elsewhere = CUDA_SUCCESS;
    std::thread([&] {
        d.cuCtxSetCurrent(f.ctx);
        CUgraph other = nullptr;
        end_elsewhere = d.cuStreamEndCapture(f.stream, &other);
        alloc_elsewhere = d.cuMemAlloc_v2(&p, 4096);  // refused: a GLOBAL capture in another thread
    }).join();
    CHECK(end_elsewhere == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    CHECK(alloc_elsewhere == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    CHECK(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}

TEST_CASE("nodes added one by one run after their dependencies, whatever order they were added in",
          "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph g = nullptr;
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNode late = f.add_kernel(g);  // added first, made to depend on the memset below
    CUgraphNode set = f.add_memset(g, 5);
    CUgraphNode k = f.add_kernel(g, {set});
    CUgraphNode join = f.add_empty(g, {k, late});
    REQUIRE(d.cuGraphAddDependencies_v2(g, &set, &late, nullptr, 1) == CUDA_SUCCESS);
    CHECK(d.cuGraphAddDependencies_v2(g, &set, &late, nullptr, 1) ==
          CUDA_ERROR_INVALID_VALUE);  // already there
    CHECK(f.type(late) == CU_GRAPH_NODE_TYPE_KERNEL);
    CHECK(f.type(set) == CU_GRAPH_NODE_TYPE_MEMSET);
    CHECK(f.type(join) == CU_GRAPH_NODE_TYPE_EMPTY);

    CUgraphNode nodes[6];
    size_t count = 6;
    REQUIRE(d.cuGraphGetNodes(g, nodes, &count) == CUDA_SUCCESS);
    CHECK(count == 4);
    CHECK(std::vector<CUgraphNode>(nodes, nodes + 4) == std::vector<CUgraphNode>{late, set, k, join});
    CHECK(nodes[4] == nullptr);
    CHECK(nodes[5] == nullptr);
    count = 2;
    REQUIRE(d.cuGraphGetNodes(g, nodes, &count) == CUDA_SUCCESS);
    CHECK(count == 2);
    count = 3;
    REQUIRE(d.cuGraphGetRootNodes(g, nodes, &count) == CUDA_SUCCESS);
    CHECK(count == 1);
    CHECK(nodes[0] == set);
    CUgraphEdgeData edges[3];
    count = 3;
    REQUIRE(d.cuGraphNodeGetDependentNodes_v2(set, nodes, edges, &count) == CUDA_SUCCESS);
    CHECK(count == 2);
    CHECK(std::vector<CUgraphNode>(nodes, nodes + 2) == std::vector<CUgraphNode>{late, k});
    count = 0;
    REQUIRE(d.cuGraphNodeGetDependencies_v2(join, nullptr, nullptr, &count) == CUDA_SUCCESS);
    CHECK(count == 2);

    // In insertion order the first kernel's +1 would be overwritten by the memset.
    REQUIRE(f.run(g) == CUDA_SUCCESS);
    CHECK(f.read()[fixture::n - 1] == 7);

    // A cycle cannot be instantiated; the instantiation names a node.
    REQUIRE(d.cuGraphAddDependencies_v2(g, &join, &set, nullptr, 1) == CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    CUDA_GRAPH_INSTANTIATE_PARAMS params{};
    CHECK(d.cuGraphInstantiateWithParams(&exec, g, &params) == CUDA_ERROR_INVALID_VALUE);
    CHECK(params.result_out == CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE);
    CHECK(params.hErrNode_out != nullptr);
    REQUIRE(d.cuGraphRemoveDependencies_v2(g, &join, &set, nullptr, 1) == CUDA_SUCCESS);
    CHECK(d.cuGraphRemoveDependencies_v2(g, &join, &set, nullptr, 1) == CUDA_ERROR_INVALID_VALUE);

    // A destroyed node takes its edges with it; the graph takes its nodes.
    REQUIRE(d.cuGraphDestroyNode(set) == CUDA_SUCCESS);
    count = 3;
    REQUIRE(d.cuGraphGetRootNodes(g, nodes, &count) == CUDA_SUCCESS);
    CHECK(count == 2);
    CUgraphNodeType t;
    CHECK(d.cuGraphNodeGetType(set, &t) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    CHECK(d.cuGraphNodeGetType(k, &t) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("dependencies and edge data are checked", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph g = nullptr, other = nullptr;
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphCreate(&other, 0) == CUDA_SUCCESS);
    CUgraphNode k = f.add_kernel(g), set = f.add_memset(g, 1), stranger = f.add_empty(other);
    fixture::add_one_node kp(f.add_one, f.buf);
    CUgraphNode node = nullptr;
    CUgraphNode twice[] = {k, k};
    CHECK(d.cuGraphAddNode_v2(&node, g, twice, nullptr, 2, &kp.node) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuGraphAddNode_v2(&node, g, &stranger, nullptr, 1, &kp.node) == CUDA_ERROR_INVALID_VALUE);
    CUgraphEdgeData programmatic{};
    programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    programmatic.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    CHECK(d.cuGraphAddNode_v2(&node, g, &set, &programmatic, 1, &kp.node) ==
          CUDA_ERROR_INVALID_VALUE);  // kernels only
    REQUIRE(d.cuGraphAddNode_v2(&node, g, &k, &programmatic, 1, &kp.node) == CUDA_SUCCESS);
    size_t count = 1;
    CUgraphNode dep = nullptr;
    CHECK(d.cuGraphNodeGetDependencies_v2(node, &dep, nullptr, &count) == CUDA_ERROR_LOSSY_QUERY);
    CUgraphEdgeData got{};
    REQUIRE(d.cuGraphNodeGetDependencies_v2(node, &dep, &got, &count) == CUDA_SUCCESS);
    CHECK(dep == k);
    CHECK(got.type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
    CUgraphNodeParams host{};
    host.type = CU_GRAPH_NODE_TYPE_HOST;
    CHECK(d.cuGraphAddNode_v2(&node, g, nullptr, nullptr, 0, &host) ==
          CUDA_ERROR_INVALID_VALUE);  // no function
    CUgraphNodeParams semaphores{};
    semaphores.type = CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL;
    CHECK(d.cuGraphAddNode_v2(&node, g, nullptr, nullptr, 0, &semaphores) == CUDA_ERROR_NOT_SUPPORTED);
    d.cuGraphDestroy(g);
    d.cuGraphDestroy(other);
}

TEST_CASE("capture into an existing graph adds typed nodes after the given dependencies", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph g = nullptr;
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNode first = f.add_memset(g, 20);
    REQUIRE(d.cuStreamBeginCaptureToGraph(f.stream, g, &first, nullptr, 1,
                                          CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
    CUgraph during = nullptr;
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, &id, &during, nullptr, nullptr, nullptr) ==
            CUDA_SUCCESS);
    CHECK(during == g);
    REQUIRE(f.launch(f.stream) == CUDA_SUCCESS);
    REQUIRE(d.cuMemsetD32Async(f.buf + 4, 30, 1, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 0);  // nothing ran
    CUgraph ended = nullptr;
    REQUIRE(d.cuStreamEndCapture(f.stream, &ended) == CUDA_SUCCESS);
    CHECK(ended == g);
    CUgraphNode nodes[3];
    size_t count = 3;
    REQUIRE(d.cuGraphGetNodes(g, nodes, &count) == CUDA_SUCCESS);
    REQUIRE(count == 3);
    CHECK(nodes[0] == first);
    CHECK(f.type(nodes[1]) == CU_GRAPH_NODE_TYPE_KERNEL);
    CHECK(f.type(nodes[2]) == CU_GRAPH_NODE_TYPE_MEMSET);
    CUgraphNode dep = nullptr;
    count = 1;
    REQUIRE(d.cuGraphNodeGetDependencies_v2(nodes[1], &dep, nullptr, &count) == CUDA_SUCCESS);
    CHECK(dep == first);
    REQUIRE(d.cuGraphNodeGetDependencies_v2(nodes[2], &dep, nullptr, &count) == CUDA_SUCCESS);
    CHECK(dep == nodes[1]);
    REQUIRE(f.run(g) == CUDA_SUCCESS);
    auto got = f.read();
    CHECK(got[0] == 21);
    CHECK(got[1] == 30);

    // A failed capture leaves the application's graph to the application.
    REQUIRE(d.cuStreamBeginCaptureToGraph(f.stream, g, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
            CUDA_SUCCESS);
    CHECK(d.cuStreamSynchronize(f.stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(d.cuStreamEndCapture(f.stream, &ended) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    REQUIRE(d.cuGraphGetNodes(g, nullptr, &count) == CUDA_SUCCESS);
    CHECK(count == 3);
    CHECK(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}

TEST_CASE("child graphs are copies, and executable graphs take kernel and child graph updates", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUdeviceptr other = 0;
    REQUIRE(d.cuMemAlloc_v2(&other, fixture::n * sizeof(unsigned)) == CUDA_SUCCESS);
    REQUIRE(d.cuMemsetD32_v2(other, 0, fixture::n) == CUDA_SUCCESS);
    auto read_other = [&] { return f.read(other)[0]; };
    CUgraph child = nullptr, child2 = nullptr, empty = nullptr, outer = nullptr;
    for (CUgraph* g : {&child, &child2, &empty, &outer}) REQUIRE(d.cuGraphCreate(g, 0) == CUDA_SUCCESS);
    f.add_kernel(child);
    f.add(child2, fixture::add_one_node(f.add_one, other).node);
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    CUgraphNode in_outer = f.add(outer, p);
    CUgraphNode k = f.add_kernel(outer, {in_outer});
    CUgraphNode set = f.add_memset(outer, 0, {});
    CHECK(f.type(in_outer) == CU_GRAPH_NODE_TYPE_GRAPH);
    REQUIRE(d.cuGraphDestroy(child) == CUDA_SUCCESS);  // the node has its own copy
    REQUIRE(d.cuGraphDestroyNode(set) == CUDA_SUCCESS);

    CUgraphExec exec = nullptr;
    REQUIRE(d.cuGraphInstantiateWithFlags(&exec, outer, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 2);

    // The kernel node now works on the other buffer, in this executable graph only.
    fixture::add_one_node moved(f.add_one, other);
    CUDA_KERNEL_NODE_PARAMS u = moved.update();
    REQUIRE(d.cuGraphExecKernelNodeSetParams_v2(exec, k, &u) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 3);
    CHECK(read_other() == 1);
    REQUIRE(f.run(outer) == CUDA_SUCCESS);  // a new executable graph has the graph's own parameters
    CHECK(f.read()[0] == 5);
    CHECK(read_other() == 1);

    // The child graph is swapped for one of the same shape; one of another shape is refused.
    REQUIRE(d.cuGraphExecChildGraphNodeSetParams(exec, in_outer, child2) == CUDA_SUCCESS);
    CHECK(d.cuGraphExecChildGraphNodeSetParams(exec, in_outer, empty) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 5);
    CHECK(read_other() == 3);

    // Nodes that are not the executable graph's kernel nodes are refused.
    CUgraphNode stray = f.add_kernel(child2);
    CHECK(d.cuGraphExecKernelNodeSetParams_v2(exec, stray, &u) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuGraphExecKernelNodeSetParams_v2(exec, in_outer, &u) == CUDA_ERROR_INVALID_VALUE);
    CHECK(d.cuGraphExecChildGraphNodeSetParams(exec, k, child2) == CUDA_ERROR_INVALID_VALUE);

    // Changing the graph's own node changes later executable graphs, not this one.
    REQUIRE(d.cuGraphKernelNodeSetParams_v2(k, &u) == CUDA_SUCCESS);
    REQUIRE(f.run(outer) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 6);
    CHECK(read_other() == 4);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(read_other() == 6);

    d.cuGraphExecDestroy(exec);
    for (CUgraph g : {child2, empty, outer}) CHECK(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    d.cuMemFree_v2(other);
}

namespace {
// A host node that appends `value` to `log`.
struct note {
    std::vector<int>* log;
    int value;
};
void CUDA_CB note_host(void* p) {
    auto* n = static_cast<note*>(p);
    n->log->push_back(n->value);
}
CUgraphNodeParams host_node(note& n) {
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_HOST;
    p.host = {&note_host, &n};
    return p;
}

// A user object whose destructor counts its runs (on the driver's thread).
struct watched {
    std::atomic<int> destroyed{0};
    static void CUDA_CB destroy(void* p) { ++static_cast<watched*>(p)->destroyed; }
    // Waits up to a second for the destructor to have run `n` times in all.
    bool destroyed_within_1s(int n) const {
        for (int i = 0; i < 100 && destroyed.load() != n; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return destroyed.load() == n;
    }
};
}  // namespace

TEST_CASE("host nodes run in order with copies, in clones too, and keep their parameters", "[unit]") {
    fixture f;
    auto& d = f.d;
    std::vector<int> log;
    note first{&log, 1}, second{&log, 2};
    CUgraph g = nullptr;
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNode a = f.add(g, host_node(first));
    CUgraphNode k = f.add_kernel(g, {a});
    CUgraphNode b = f.add(g, host_node(second), {k});
    CHECK(f.type(b) == CU_GRAPH_NODE_TYPE_HOST);
    CUDA_HOST_NODE_PARAMS hp{};
    REQUIRE(d.cuGraphHostNodeGetParams(b, &hp) == CUDA_SUCCESS);
    CHECK(hp.fn == &note_host);
    CHECK(hp.userData == &second);
    CHECK(d.cuGraphHostNodeGetParams(k, &hp) == CUDA_ERROR_INVALID_VALUE);
    CUgraph clone = nullptr;
    REQUIRE(d.cuGraphClone(&clone, g) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    REQUIRE(f.run(clone) == CUDA_SUCCESS);
    CHECK(log == std::vector<int>{1, 2});
    CHECK(f.read()[0] == 1);
    size_t nodes = 0;
    REQUIRE(d.cuGraphGetNodes(clone, nullptr, &nodes) == CUDA_SUCCESS);
    CHECK(nodes == 3);
    REQUIRE(d.cuGraphDestroy(clone) == CUDA_SUCCESS);

    // A captured host function is a host node with its function and data.
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    REQUIRE(d.cuLaunchHostFunc(f.stream, &note_host, &first) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    CUgraphNode captured = nullptr;
    nodes = 1;
    REQUIRE(d.cuGraphGetNodes(g, &captured, &nodes) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphHostNodeGetParams(captured, &hp) == CUDA_SUCCESS);
    CHECK(hp.userData == &first);
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}

TEST_CASE("a child graph node's graph is the node's own copy", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph child = nullptr, g = nullptr;
    REQUIRE(d.cuGraphCreate(&child, 0) == CUDA_SUCCESS);
    f.add_kernel(child);
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    CUgraphNode node = f.add(g, p);
    CUgraph inside = nullptr;
    REQUIRE(d.cuGraphChildGraphNodeGetGraph(node, &inside) == CUDA_SUCCESS);
    CHECK(inside != child);
    size_t nodes = 0;
    REQUIRE(d.cuGraphGetNodes(inside, nullptr, &nodes) == CUDA_SUCCESS);
    CHECK(nodes == 1);
    CHECK(d.cuGraphDestroy(inside) == CUDA_ERROR_INVALID_VALUE);  // the node's
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphDestroy(child) == CUDA_SUCCESS);
}

TEST_CASE("user objects live while a graph, a clone, a child copy or an executable graph holds them",
          "[unit]") {
    fixture f;
    auto& d = f.d;
    watched w;
    CUuserObject obj = nullptr;
    REQUIRE(d.cuUserObjectCreate(&obj, &w, &watched::destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) ==
            CUDA_SUCCESS);
    CUgraph child = nullptr, g = nullptr, clone = nullptr;
    REQUIRE(d.cuGraphCreate(&child, 0) == CUDA_SUCCESS);
    f.add_kernel(child);
    REQUIRE(d.cuGraphRetainUserObject(child, obj, 1, CU_GRAPH_USER_OBJECT_MOVE) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    f.add(g, p);
    REQUIRE(d.cuGraphDestroy(child) == CUDA_SUCCESS);  // the node's copy still holds it
    REQUIRE(d.cuGraphClone(&clone, g) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    REQUIRE(d.cuGraphInstantiateWithFlags(&exec, clone, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphDestroy(clone) == CUDA_SUCCESS);
    CHECK_FALSE(w.destroyed_within_1s(1));
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 1);
    REQUIRE(d.cuGraphExecDestroy(exec) == CUDA_SUCCESS);
    CHECK(w.destroyed_within_1s(1));

    // Released by the graph itself; a graph cannot release what it does not hold.
    watched w2;
    REQUIRE(d.cuUserObjectCreate(&obj, &w2, &watched::destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) ==
            CUDA_SUCCESS);
    REQUIRE(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphRetainUserObject(g, obj, 2, 0) == CUDA_SUCCESS);
    CHECK(d.cuGraphReleaseUserObject(g, obj, 3) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuGraphReleaseUserObject(g, obj, 2) == CUDA_SUCCESS);
    CHECK_FALSE(w2.destroyed_within_1s(1));  // the caller's reference remains
    REQUIRE(d.cuUserObjectRelease(obj, 1) == CUDA_SUCCESS);
    CHECK(w2.destroyed_within_1s(1));
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}

TEST_CASE("executable graph update: same topology takes the new work, another is refused", "[unit]") {
    fixture f;
    auto& d = f.d;
    CUgraph a = nullptr, b = nullptr, c = nullptr;
    for (CUgraph* g : {&a, &b, &c}) REQUIRE(d.cuGraphCreate(g, 0) == CUDA_SUCCESS);
    CUgraphNode set_a = f.add_memset(a, 5);
    f.add_kernel(a, {set_a});
    CUgraphNode set_b = f.add_memset(b, 40);
    f.add_kernel(b, {set_b});
    f.add_memset(c, 7);
    CUgraphExec exec = nullptr;
    REQUIRE(d.cuGraphInstantiateWithFlags(&exec, a, 0) == CUDA_SUCCESS);
    CUgraphExecUpdateResultInfo info{};
    CHECK(d.cuGraphExecUpdate_v2(exec, c, &info) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    CHECK(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    REQUIRE(d.cuGraphExecUpdate_v2(exec, b, &info) == CUDA_SUCCESS);
    CHECK(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS);
    REQUIRE(d.cuGraphLaunch(exec, f.stream) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 41);
    // The executable graph's nodes still answer to its own graph's.
    fixture::add_one_node twice(f.add_one, f.buf);
    CUgraphNode k_a = nullptr;
    size_t count = 1;
    REQUIRE(d.cuGraphNodeGetDependentNodes_v2(set_a, &k_a, nullptr, &count) == CUDA_SUCCESS);
    auto u = twice.update();
    REQUIRE(d.cuGraphExecKernelNodeSetParams_v2(exec, k_a, &u) == CUDA_SUCCESS);
    REQUIRE(d.cuGraphExecDestroy(exec) == CUDA_SUCCESS);
    for (CUgraph g : {a, b, c}) REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}

TEST_CASE("capture dependencies: reported, replaced and added to", "[unit]") {
    fixture f;
    auto& d = f.d;
    REQUIRE(d.cuStreamBeginCapture_v2(f.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    REQUIRE(d.cuMemsetD32Async(f.buf, 3, fixture::n, f.stream) == CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CUgraph g = nullptr;
    const CUgraphNode* deps = nullptr;
    size_t count = 0;
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, nullptr, &g, &deps, nullptr, &count) == CUDA_SUCCESS);
    REQUIRE(count == 1);
    CUgraphNode memset_node = deps[0];
    CHECK(f.type(memset_node) == CU_GRAPH_NODE_TYPE_MEMSET);
    // A node added to the capture's graph by hand, then made what the next work depends on.
    CUgraphNode k = f.add_kernel(g, {memset_node});
    REQUIRE(d.cuStreamUpdateCaptureDependencies_v2(f.stream, &k, nullptr, 1,
                                                   CU_STREAM_SET_CAPTURE_DEPENDENCIES) == CUDA_SUCCESS);
    REQUIRE(f.launch(f.stream) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, nullptr, nullptr, &deps, nullptr, &count) ==
            CUDA_SUCCESS);
    REQUIRE(count == 1);
    CUgraphNode last = deps[0];
    CUgraphNode before = nullptr;
    size_t n_before = 1;
    REQUIRE(d.cuGraphNodeGetDependencies_v2(last, &before, nullptr, &n_before) == CUDA_SUCCESS);
    CHECK(n_before == 1);
    CHECK(before == k);
    CHECK(d.cuStreamUpdateCaptureDependencies_v2(f.stream, &k, nullptr, 1, 7) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(d.cuStreamUpdateCaptureDependencies_v2(f.stream, &memset_node, nullptr, 1,
                                                   CU_STREAM_ADD_CAPTURE_DEPENDENCIES) == CUDA_SUCCESS);
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, nullptr, nullptr, &deps, nullptr, &count) ==
            CUDA_SUCCESS);
    CHECK(count == 2);
    REQUIRE(d.cuStreamEndCapture(f.stream, &g) == CUDA_SUCCESS);
    REQUIRE(f.run(g) == CUDA_SUCCESS);
    CHECK(f.read()[0] == 5);  // 3, +1 (the added kernel), +1 (the captured launch)
    REQUIRE(d.cuGraphDestroy(g) == CUDA_SUCCESS);
}
