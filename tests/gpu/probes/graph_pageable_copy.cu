// A probe of the real driver, run natively (no vcuda), that decided how the server stages graph copies with
// the client's memory (server/handlers_hostfn.cpp): does a graph memcpy node from host memory see what a host
// node just before it wrote, from pageable and from pinned memory? And may a thread that captures in GLOBAL
// mode register or allocate pinned memory? On the H200 (driver 580, session 11): pageable 0 of 4096 bytes
// arrived, pinned 4096 of 4096; both calls answered 900 (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and
// invalidated the capture, and RELAXED mode allowed them. (What ran there was this probe before a tidy-up
// that reworded its output lines.)
//   nvcc -arch=sm_90 -o graph_pageable_copy graph_pageable_copy.cu -lcuda
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "probe_check.h"

namespace {

constexpr size_t bytes = 4096;

void CUDA_CB fill(void* p) { std::memset(p, 0x5a, bytes); }

// Launches host node (fill) -> memcpy node (host to device) twice and counts the bytes that arrived.
void probe(bool pinned) {
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemsetD8(d, 0, bytes));
    unsigned char* h = nullptr;
    if (pinned)
        CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&h), bytes, 0));
    else
        h = static_cast<unsigned char*>(std::calloc(1, bytes));
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphNodeParams host{};
    host.type = CU_GRAPH_NODE_TYPE_HOST;
    host.host.fn = fill;
    host.host.userData = h;
    CUgraphNode a, b;
    CHECK(cuGraphAddNode_v2(&a, g, nullptr, nullptr, 0, &host));
    CUgraphNodeParams cp{};
    cp.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    CUDA_MEMCPY3D& c = cp.memcpy.copyParams;
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = h;
    c.srcPitch = bytes;
    c.srcHeight = 1;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = d;
    c.dstPitch = bytes;
    c.dstHeight = 1;
    c.WidthInBytes = bytes;
    c.Height = 1;
    c.Depth = 1;
    CHECK(cuCtxGetCurrent(&cp.memcpy.copyCtx));
    CHECK(cuGraphAddNode_v2(&b, g, &a, nullptr, 1, &cp));
    CUgraphExec e;
    CHECK(cuGraphInstantiate(&e, g, 0));
    for (int launch = 1; launch <= 2; ++launch) {
        if (launch == 2) std::memset(h, 0, bytes);  // the host node fills it again
        CHECK(cuGraphLaunch(e, nullptr));
        CHECK(cuStreamSynchronize(nullptr));
        unsigned char back[bytes];
        CHECK(cuMemcpyDtoH(back, d, bytes));
        size_t ok = 0;
        for (unsigned char v : back) ok += v == 0x5a;
        std::printf("%s source, launch %d: %zu of %zu bytes arrived\n", pinned ? "pinned" : "pageable",
                    launch, ok, bytes);
    }
}

}  // namespace

int main() {
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    probe(false);
    probe(true);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void* p = std::malloc(1 << 20);
    std::printf("cuMemHostRegister while capturing (GLOBAL): %d\n", cuMemHostRegister(p, 1 << 20, 0));
    void* q = nullptr;
    std::printf("cuMemHostAlloc while capturing (GLOBAL): %d\n", cuMemHostAlloc(&q, bytes, 0));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    std::printf("cuMemHostAlloc, RELAXED: %d\n", cuMemHostAlloc(&q, bytes, 0));
    std::printf("cuMemFreeHost, RELAXED: %d\n", cuMemFreeHost(q));
    CHECK(cuThreadExchangeStreamCaptureMode(&m));
    CUgraph g;
    std::printf("cuStreamEndCapture: %d\n", cuStreamEndCapture(s, &g));
    return 0;
}
