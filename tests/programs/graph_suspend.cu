// graph_suspend: CUDA graphs kept through a pause (argv[1] ms, default 0) in which a server that suspends
// idle sessions (vcuda-server --test-suspend-every) destroys and makes them again (server/graph_image.cpp).
// Before the pause: a graph of kernel (one with a priority attribute, two writing a module global through its
// address, alone and in a struct), memset, memcpy, event record and child graph nodes, with edges,
// instantiated and launched; the executable graph's kernel node updated and launched again. After it, through
// the same handles: the executable graph launched (its update kept), a node of the graph read (its priority
// too) and changed, the graph instantiated again, the old executable graph updated through a node handle,
// then from the graph (cuGraphExecUpdate) and through the node handle again; then a launch and a tensor map
// with the global's address learnt before the pause. Natively and through vcuda (suspended or not) it must
// print the same. argv[2], if given: a file created when the pause begins (graphs made), for a test that
// moves the session then (tests/integration/move_session.sh).
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "common.cuh"

extern "C" __global__ void gs_set(unsigned* x, int n, unsigned base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + i;
}

// y[i] += a * x[i]
extern "C" __global__ void gs_add(unsigned* y, const unsigned* x, int n, unsigned a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

// A module global the graph writes through its address, as XLA's kernels reach their constants: a suspend
// loads the module again, maybe with the global elsewhere.
__device__ __align__(16) unsigned gs_marks[4];
extern "C" __global__ void gs_mark(unsigned* where, unsigned v) { *where = v; }
// The same through a pointer inside a struct passed by value (as CUTLASS's Params carry XLA's constants).
struct gs_mark_params {
    unsigned pad;
    unsigned* where;
    unsigned v;
};
extern "C" __global__ void gs_mark_in(gs_mark_params p) { *p.where = p.v; }

namespace {

constexpr int n = 4096;

cudaKernelNodeParams add_params(void** args) {
    cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(gs_add);
    p.gridDim = dim3(n / 256);
    p.blockDim = dim3(256);
    p.kernelParams = args;
    return p;
}

// z after a launch: the graph computes z = (b + 1) * x with x[i] = 1 + i, where b is the add node's factor
// and the child graph adds x once more.
void check_z(const unsigned* z, unsigned b, const char* when) {
    std::vector<unsigned> h(n);
    CHECK(cudaMemcpy(h.data(), z, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (h[i] != (b + 1) * (1u + i))
            fail("%s: z[%d] = %u, expected %u", when, i, h[i], (b + 1) * (1u + i));
    printf("%s: z = %u * x: ok\n", when, b + 1);
}

}  // namespace

int main(int argc, char** argv) {
    const int idle_ms = argc > 1 ? atoi(argv[1]) : 0;
    unsigned *x, *y, *z;
    CHECK(cudaMalloc(&x, n * sizeof(unsigned)));
    CHECK(cudaMalloc(&y, n * sizeof(unsigned)));
    CHECK(cudaMalloc(&z, n * sizeof(unsigned)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    gs_set<<<n / 256, 256, 0, s>>>(x, n, 0);  // the module loaded before its kernels become nodes
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));

    int count = n;
    unsigned base = 1, two = 2, one = 1;
    void* set_args[] = {&x, &count, &base};
    void* add_args[] = {&y, &x, &count, &two};
    void* child_args[] = {&z, &x, &count, &one};

    // The child graph: z += x.
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t child_add;
    cudaKernelNodeParams cp = add_params(child_args);
    CHECK(cudaGraphAddKernelNode(&child_add, child, nullptr, 0, &cp));

    // set x; memset y = 0; y += b * x; z = y; record ev; child (z += x).
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t set, clear, add, copy, record, sub;
    cudaKernelNodeParams sp{};
    sp.func = reinterpret_cast<void*>(gs_set);
    sp.gridDim = dim3(n / 256);
    sp.blockDim = dim3(256);
    sp.kernelParams = set_args;
    CHECK(cudaGraphAddKernelNode(&set, g, nullptr, 0, &sp));
    cudaMemsetParams mp{};
    mp.dst = y;
    mp.value = 0;
    mp.elementSize = sizeof(unsigned);
    mp.width = n;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&clear, g, nullptr, 0, &mp));
    cudaGraphNode_t before_add[] = {set, clear};
    cudaKernelNodeParams ap = add_params(add_args);
    CHECK(cudaGraphAddKernelNode(&add, g, before_add, 2, &ap));
    // The add node runs at the device's highest stream priority (a node attribute a suspend must keep).
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaLaunchAttributeValue prio{};
    prio.priority = greatest;
    CHECK(cudaGraphKernelNodeSetAttribute(add, cudaLaunchAttributePriority, &prio));
    cudaLaunchAttributeValue prio_set{};
    CHECK(cudaGraphKernelNodeGetAttribute(add, cudaLaunchAttributePriority, &prio_set));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &add, 1, z, y, n * sizeof(unsigned), cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddEventRecordNode(&record, g, &copy, 1, ev));
    CHECK(cudaGraphAddChildGraphNode(&sub, g, &record, 1, child));
    // gs_marks[1] = 42, through the global's address.
    unsigned* marks = nullptr;
    CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&marks), gs_marks));
    unsigned* mark_at = marks + 1;
    unsigned answer = 42;
    void* mark_args[] = {&mark_at, &answer};
    cudaKernelNodeParams mk{};
    mk.func = reinterpret_cast<void*>(gs_mark);
    mk.gridDim = dim3(1);
    mk.blockDim = dim3(1);
    mk.kernelParams = mark_args;
    cudaGraphNode_t mark;
    CHECK(cudaGraphAddKernelNode(&mark, g, &set, 1, &mk));
    // gs_marks[2] = 43, through a struct parameter.
    gs_mark_params in_struct{0, marks + 2, 43};
    void* mark_in_args[] = {&in_struct};
    mk.func = reinterpret_cast<void*>(gs_mark_in);
    mk.kernelParams = mark_in_args;
    cudaGraphNode_t mark_in;
    CHECK(cudaGraphAddKernelNode(&mark_in, g, &set, 1, &mk));
    size_t nodes = 0, edges = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
    printf("graph: %zu nodes, %zu edges\n", nodes, edges);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 2, "first launch");
    unsigned five = 5;
    void* add5[] = {&y, &x, &count, &five};
    cudaKernelNodeParams ap5 = add_params(add5);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, add, &ap5));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 5, "executable graph updated");
    printf("phase 1 done\n");
    fflush(stdout);
    if (argc > 2 && !std::ofstream(argv[2])) fail("cannot create %s", argv[2]);
    if (idle_ms > 0) usleep(static_cast<useconds_t>(idle_ms) * 1000);

    // After the pause: the same handles.
    CHECK(cudaMemset(z, 0, n * sizeof(unsigned)));
    const unsigned zeros[4] = {};
    CHECK(cudaMemcpyToSymbol(gs_marks, zeros, sizeof zeros));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 5, "after the pause, the executable graph");
    unsigned marks_now[4] = {};
    CHECK(cudaMemcpyFromSymbol(marks_now, gs_marks, sizeof marks_now));
    EXPECT(marks_now[1] == 42, "the graph's write through the global's address: gs_marks[1] = %u",
           marks_now[1]);
    EXPECT(marks_now[2] == 43, "the graph's write through a struct parameter: gs_marks[2] = %u",
           marks_now[2]);
    printf("the graph wrote the module global through its address, alone and in a struct: yes\n");
    // A launch with the address learnt before the pause, in a struct.
    gs_mark_params late{0, marks + 3, 44};
    gs_mark_in<<<1, 1, 0, s>>>(late);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpyFromSymbol(marks_now, gs_marks, sizeof marks_now));
    EXPECT(marks_now[3] == 44, "a launch's write through a struct parameter: gs_marks[3] = %u", marks_now[3]);
    printf("a launch wrote the module global through a struct parameter: yes\n");
    // A tensor map over the global, encoded with the address learnt before the pause (XLA encodes its
    // constants' maps before each run).
    void* encode = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode, 12000, cudaEnableDefault,
                                           &found));
    CUtensorMap map{};
    // Two rows of 16 bytes (the H200's driver refused a rank-1 map over it, natively).
    cuuint64_t dims[] = {4, 1}, strides[] = {16};
    cuuint32_t box[] = {4, 1}, element_strides[] = {1, 1};
    CUresult rc = reinterpret_cast<decltype(&::cuTensorMapEncodeTiled)>(encode)(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, marks, dims, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    EXPECT(rc == CUDA_SUCCESS, "a tensor map over the global: CUresult %d", static_cast<int>(rc));
    printf("a tensor map over the module global encoded: yes\n");
    EXPECT(cudaEventQuery(ev) == cudaSuccess, "the graph's event record node did not record");
    printf("event recorded by the graph: yes\n");
    cudaKernelNodeParams got{};
    CHECK(cudaGraphKernelNodeGetParams(add, &got));
    EXPECT(got.func == reinterpret_cast<void*>(gs_add) && *static_cast<unsigned*>(got.kernelParams[3]) == 2,
           "the add node reads back factor %u", *static_cast<unsigned*>(got.kernelParams[3]));
    printf("the graph's add node: gs_add, factor 2\n");
    cudaGraphNodeType type{};
    CHECK(cudaGraphNodeGetType(add, &type));
    EXPECT(type == cudaGraphNodeTypeKernel, "the add node's type is %d", static_cast<int>(type));
    CHECK(cudaGraphNodeGetType(sub, &type));
    EXPECT(type == cudaGraphNodeTypeGraph, "the child graph node's type is %d", static_cast<int>(type));
    printf("node handles kept: yes\n");
    cudaLaunchAttributeValue prio_now{};
    CHECK(cudaGraphKernelNodeGetAttribute(add, cudaLaunchAttributePriority, &prio_now));
    EXPECT(prio_now.priority == prio_set.priority, "the add node's priority is %d, was %d", prio_now.priority,
           prio_set.priority);
    printf("the add node's priority attribute kept: yes\n");
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
    printf("graph after the pause: %zu nodes, %zu edges\n", nodes, edges);
    unsigned three = 3;
    void* add3[] = {&y, &x, &count, &three};
    cudaKernelNodeParams ap3 = add_params(add3);
    CHECK(cudaGraphKernelNodeSetParams(add, &ap3));
    cudaGraphExec_t again;
    CHECK(cudaGraphInstantiate(&again, g, 0));
    CHECK(cudaGraphLaunch(again, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 3, "the graph changed and instantiated again");
    unsigned seven = 7;
    void* add7[] = {&y, &x, &count, &seven};
    cudaKernelNodeParams ap7 = add_params(add7);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, add, &ap7));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 7, "the first executable graph updated again");
    // Updated from its graph as a whole (cuGraphExecUpdate: the add node's factor 3 again), then through a
    // node handle: a suspending server made the executable graph again from a clone during the pause.
    cudaGraphExecUpdateResultInfo info{};
    CHECK(cudaGraphExecUpdate(exec, g, &info));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 3, "the first executable graph updated from the graph");
    CHECK(cudaGraphExecKernelNodeSetParams(exec, add, &ap7));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_z(z, 7, "then updated through its node");

    CHECK(cudaGraphExecDestroy(again));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(z));
    return pass();
}
