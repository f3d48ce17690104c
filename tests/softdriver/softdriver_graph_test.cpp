// Unit tests of the software test driver's stream capture and graphs (soft_graph.cpp): work on a capturing stream
// is recorded, not run; instantiated graphs replay it; the real driver's capture rules that programs meet hold.
// The library is dlopened, as vcuda-server does.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "soft_kernel.hpp"

namespace {

#define VCUDA_SOFT_GRAPH_FUNCTIONS(X)                                                                              \
    X(cuInit) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) X(cuMemAlloc_v2)      \
    X(cuMemFree_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD32Async) X(cuMemsetD32_v2) X(cuStreamCreate)  \
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord) X(cuEventDestroy_v2)            \
    X(cuStreamWaitEvent) X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuKernelGetFunction)      \
    X(cuLaunchKernel) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing)                      \
    X(cuStreamGetCaptureInfo_v3) X(cuThreadExchangeStreamCaptureMode) X(cuGraphCreate) X(cuGraphDestroy)           \
    X(cuGraphGetNodes) X(cuGraphGetRootNodes) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams)       \
    X(cuGraphExecDestroy) X(cuGraphLaunch) X(cuGraphUpload)

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
#define VCUDA_SOFT_GRAPH_LOAD(name)                                                \
    s->name = reinterpret_cast<decltype(&::name)>(dlsym(s->lib, #name));           \
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
        REQUIRE(d.cuLibraryLoadData(&lib, fake_image, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS);
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
    // Launches add_one on `s` with parameters that are gone when the call returns, as a captured launch's are.
    CUresult launch(CUstream s) {
        CUdeviceptr p = buf;
        int count = n;
        void* params[] = {&p, &count};
        return d.cuLaunchKernel(add_one, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
    }
    std::vector<unsigned> read() {
        std::vector<unsigned> out(n);
        REQUIRE(d.cuMemcpyDtoH_v2(out.data(), buf, n * sizeof(unsigned)) == CUDA_SUCCESS);
        return out;
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
    REQUIRE(d.cuStreamGetCaptureInfo_v3(f.stream, &st, &id, &during, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
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
    CHECK(d.cuGraphInstantiateWithFlags(&exec, g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) == CUDA_ERROR_INVALID_VALUE);
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
