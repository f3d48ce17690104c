// A probe of the real driver, run natively (no vcuda): which changes of a graph copy with host memory may
// cuGraphExecUpdate make? The server stages a copy with the client's memory as a child graph (a host node and
// a memcpy node from or to a registered buffer of its own, which a user object owns); an update from a new
// capture then changes the buffer. Each case instantiates a graph of one node, builds a second one that
// differs only in the host buffer, updates and prints the result (0 success, 5 parameters changed, ...).
// On the H200 (driver 580, session 12) every 1D case answered rc 0, result 0 (registered, allocated,
// pageable, alone or in a child graph with a host node and a user object); every 2D case, pageable and
// registered alike, answered rc 910 (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE), result 5 (parameters changed).
//   nvcc -arch=sm_90 -o graph_update_host_copy graph_update_host_copy.cu -lcuda
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "probe_check.h"

namespace {

constexpr size_t bytes = 4096;
CUdeviceptr dev;
CUcontext ctx;

void CUDA_CB nothing(void*) {}
void CUDA_CB drop(void*) {}

enum class host { pageable, registered, registered_portable, allocated };

void* host_buffer(host kind) {
    void* p = nullptr;
    switch (kind) {
        case host::pageable:
            return std::aligned_alloc(4096, bytes);
        case host::registered:
        case host::registered_portable:
            p = std::aligned_alloc(4096, bytes);
            CHECK(cuMemHostRegister(p, bytes, kind == host::registered ? 0 : CU_MEMHOSTREGISTER_PORTABLE));
            return p;
        case host::allocated:
            CHECK(cuMemHostAlloc(&p, bytes, 0));
            return p;
    }
    return nullptr;
}

// A graph copying `h` to the device: the memcpy node alone, or in a child graph (with a host node before it,
// and a user object retained by the child, as the server makes it).
CUgraph copy_graph(void* h, bool child, bool host_node, bool user_object, bool two_d = false) {
    CUDA_MEMCPY3D c{};
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = h;
    c.srcPitch = bytes;
    c.srcHeight = 1;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dev;
    c.dstPitch = bytes;
    c.dstHeight = 1;
    c.WidthInBytes = bytes;
    c.Height = 1;
    c.Depth = 1;
    if (two_d) {  // 16 rows of 256 bytes out of a device buffer of 16 rows of 256 bytes
        c.WidthInBytes = c.srcPitch = c.dstPitch = 256;
        c.Height = c.srcHeight = c.dstHeight = 16;
    }
    CUgraphNodeParams copy{};
    copy.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    copy.memcpy.copyParams = c;
    copy.memcpy.copyCtx = ctx;
    CUgraph inner;
    CHECK(cuGraphCreate(&inner, 0));
    CUgraphNode first = nullptr, second;
    if (host_node) {
        CUgraphNodeParams hp{};
        hp.type = CU_GRAPH_NODE_TYPE_HOST;
        hp.host = {&nothing, h};
        CHECK(cuGraphAddNode_v2(&first, inner, nullptr, nullptr, 0, &hp));
    }
    CHECK(cuGraphAddNode_v2(&second, inner, first ? &first : nullptr, nullptr, first ? 1 : 0, &copy));
    if (user_object) {
        CUuserObject o;
        CHECK(cuUserObjectCreate(&o, h, &drop, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
        CHECK(cuGraphRetainUserObject(inner, o, 1, CU_GRAPH_USER_OBJECT_MOVE));
    }
    if (!child) return inner;
    CUgraph outer;
    CHECK(cuGraphCreate(&outer, 0));
    CUgraphNodeParams cp{};
    cp.type = CU_GRAPH_NODE_TYPE_GRAPH;
    cp.graph = {inner, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE};
    CUgraphNode n;
    CHECK(cuGraphAddNode_v2(&n, outer, nullptr, nullptr, 0, &cp));
    CHECK(cuGraphDestroy(inner));
    return outer;
}

void update(const char* what, host from, host to, bool child, bool host_node, bool user_object,
            bool two_d = false) {
    CUgraph g1 = copy_graph(host_buffer(from), child, host_node, user_object, two_d);
    CUgraphExec exec;
    CHECK(cuGraphInstantiate(&exec, g1, 0));
    CUgraph g2 = copy_graph(host_buffer(to), child, host_node, user_object, two_d);
    CUgraphExecUpdateResultInfo info{};
    CUresult rc = cuGraphExecUpdate(exec, g2, &info);
    std::printf("%-58s update rc %d, result %d\n", what, static_cast<int>(rc), static_cast<int>(info.result));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(g1));
    CHECK(cuGraphDestroy(g2));
}

}  // namespace

int main() {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&dev, bytes));
    update("memcpy node, pageable -> pageable", host::pageable, host::pageable, false, false, false);
    update("memcpy node, registered -> registered", host::registered, host::registered, false, false, false);
    update("memcpy node, registered portable -> portable", host::registered_portable,
           host::registered_portable, false, false, false);
    update("memcpy node, allocated -> allocated", host::allocated, host::allocated, false, false, false);
    update("memcpy node, pageable -> registered", host::pageable, host::registered, false, false, false);
    update("child [memcpy], pageable -> pageable", host::pageable, host::pageable, true, false, false);
    update("child [memcpy], portable -> portable", host::registered_portable, host::registered_portable, true,
           false, false);
    update("child [host, memcpy], portable -> portable", host::registered_portable, host::registered_portable,
           true, true, false);
    update("child [host, memcpy] + user object, portable -> portable", host::registered_portable,
           host::registered_portable, true, true, true);
    update("child [host, memcpy] + user object, pageable -> pageable", host::pageable, host::pageable, true,
           true, true);
    update("child [host, memcpy] + user object, allocated -> allocated", host::allocated, host::allocated,
           true, true, true);
    update("2D memcpy node, pageable -> pageable", host::pageable, host::pageable, false, false, false, true);
    update("2D memcpy node, portable -> portable", host::registered_portable, host::registered_portable,
           false, false, false, true);
    update("2D child [host, memcpy] + user object, portable -> portable", host::registered_portable,
           host::registered_portable, true, true, true, true);
    return 0;
}
