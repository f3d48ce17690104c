// graph_host_copies: CUDA graphs whose copies read or write host memory, and their host nodes (the calls of
// NVIDIA's simpleCudaGraphs, jacobiCudaGraphs and conjugateGradientCudaGraphs samples). A graph built node by
// node copies from pageable and from pinned memory to the GPU, runs kernels, copies results back into
// pageable and pinned memory (1D, a 2D box of a pitched buffer, through a CUDA array) and ends in a host node
// that reads one of them; a stream capture records the same kind of work, with a copy on a second stream that
// joined the capture; an executable graph is updated from a new capture whose copy writes elsewhere. Every
// launch runs on new host inputs and is checked against a CPU reference, and the host nodes must see the
// bytes of their own launch: host memory is read and written when the graph runs, in the graph's order. The
// copy nodes' parameters read back (cudaGraphMemcpyNodeGetParams) are those they were given, on the graph and
// on its clone.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

// y[i] = a * x[i] + b
extern "C" __global__ void ghc_affine(const float* x, float* y, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

// *out = y[0] + y[1] + ... (one thread, in order: the same double on every device)
extern "C" __global__ void ghc_sum(const float* y, double* out, int n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double s = 0;
    for (int i = 0; i < n; ++i) s += y[i];
    *out = s;
}

namespace {

constexpr int cols = 64, rows = 32, n = cols * rows;         // the device buffers are rows x cols floats
constexpr int box_x = 5, box_y = 3, box_w = 17, box_h = 11;  // a 2D box of them
constexpr int host_pitch = 96;                               // floats per row of the host's pitched buffer
constexpr int threads = 128, blocks = (n + threads - 1) / threads;

void fill(float* p, int count, uint32_t seed) {
    for (int i = 0; i < count; ++i)
        p[i] = static_cast<float>(static_cast<int>((seed + 31u * i) % 1000u)) / 8.0f;
}

std::vector<float> affine(const float* x, float a, float b) {
    std::vector<float> y(n);
    for (int i = 0; i < n; ++i) y[i] = a * x[i] + b;
    return y;
}

double sum(const std::vector<float>& y) {
    double s = 0;
    for (float v : y) s += v;
    return s;
}

void expect_floats(const char* what, const float* got, const float* want, int count) {
    for (int i = 0; i < count; ++i)
        EXPECT(got[i] == want[i], "%s: element %d is %g, want %g", what, i, got[i], want[i]);
}

// The box of a rows x cols matrix, as placed in a host buffer `host_pitch` floats wide (the rest untouched).
void expect_box(const char* what, const float* host, const std::vector<float>& y, float untouched) {
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < host_pitch; ++c) {
            bool inside = r >= box_y && r < box_y + box_h && c >= box_x && c < box_x + box_w;
            float want = inside ? y[r * cols + c] : untouched;
            EXPECT(host[r * host_pitch + c] == want, "%s: row %d column %d is %g, want %g", what, r, c,
                   host[r * host_pitch + c], want);
        }
}

cudaMemcpy3DParms linear(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), bytes, bytes, 1);
    p.dstPtr = make_cudaPitchedPtr(dst, bytes, bytes, 1);
    p.extent = make_cudaExtent(bytes, 1, 1);
    p.kind = kind;
    return p;
}

// The box of a device matrix (y: rows x cols floats) into the same place of a host buffer host_pitch wide.
cudaMemcpy3DParms box_to_host(float* host, const float* y) {
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(const_cast<float*>(y), cols * sizeof(float), cols, rows);
    p.srcPos = make_cudaPos(box_x * sizeof(float), box_y, 0);
    p.dstPtr = make_cudaPitchedPtr(host, host_pitch * sizeof(float), host_pitch, rows);
    p.dstPos = make_cudaPos(box_x * sizeof(float), box_y, 0);
    p.extent = make_cudaExtent(box_w * sizeof(float), box_h, 1);
    p.kind = cudaMemcpyDeviceToHost;
    return p;
}

// What a host node saw: the result its launch copied back, read when the node ran.
struct seen {
    const double* result = nullptr;
    std::vector<double> values;
};
void CUDART_CB look(void* p) {
    auto* s = static_cast<seen*>(p);
    s->values.push_back(*s->result);
}

cudaGraphNode_t add_kernel(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, void* fn, void** args,
                           int grid) {
    cudaKernelNodeParams k = {};
    k.func = fn;
    k.gridDim = dim3(grid);
    k.blockDim = dim3(threads);
    k.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps.data(), deps.size(), &k));
    return node;
}

// The copy nodes made by add_copy, with the parameters they were given.
std::vector<std::pair<cudaGraphNode_t, cudaMemcpy3DParms>> copies_made;

cudaGraphNode_t add_copy(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, const cudaMemcpy3DParms& p) {
    cudaGraphNode_t node;
    CHECK(cudaGraphAddMemcpyNode(&node, g, deps.data(), deps.size(), &p));
    copies_made.emplace_back(node, p);
    return node;
}

// A copy node's parameters read back (in `g`, or its copy in `clone`) against those it was given: the same
// pointers, arrays, positions and extent; the figures the runtime derives (pitched sizes, kind) printed.
void read_back_copies(cudaGraph_t clone) {
    int i = 0;
    for (auto& [node, given] : copies_made) {
        cudaGraphNode_t at = node;
        if (clone) CHECK(cudaGraphNodeFindInClone(&at, node, clone));
        cudaMemcpy3DParms got = {};
        CHECK(cudaGraphMemcpyNodeGetParams(at, &got));
        const char* where = clone ? "clone" : "graph";
        EXPECT(got.srcPtr.ptr == given.srcPtr.ptr && got.dstPtr.ptr == given.dstPtr.ptr,
               "%s copy %d: pointers %p -> %p, given %p -> %p", where, i, got.srcPtr.ptr, got.dstPtr.ptr,
               given.srcPtr.ptr, given.dstPtr.ptr);
        EXPECT(got.srcArray == given.srcArray && got.dstArray == given.dstArray, "%s copy %d: other arrays",
               where, i);
        EXPECT(got.extent.width == given.extent.width && got.extent.height == given.extent.height &&
                   got.extent.depth == given.extent.depth,
               "%s copy %d: extent %zu x %zu x %zu", where, i, got.extent.width, got.extent.height,
               got.extent.depth);
        EXPECT(got.srcPos.x == given.srcPos.x && got.srcPos.y == given.srcPos.y &&
                   got.dstPos.x == given.dstPos.x && got.dstPos.y == given.dstPos.y,
               "%s copy %d: other positions", where, i);
        printf("%s copy %d read back: src pitch %zu, %zu x %zu; dst pitch %zu, %zu x %zu; kind %d\n", where,
               i, got.srcPtr.pitch, got.srcPtr.xsize, got.srcPtr.ysize, got.dstPtr.pitch, got.dstPtr.xsize,
               got.dstPtr.ysize, static_cast<int>(got.kind));
        ++i;
    }
}

const char* type_name(cudaGraphNode_t node) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(node, &t));
    switch (t) {
        case cudaGraphNodeTypeKernel:
            return "kernel";
        case cudaGraphNodeTypeMemcpy:
            return "memcpy";
        case cudaGraphNodeTypeMemset:
            return "memset";
        case cudaGraphNodeTypeHost:
            return "host";
        default:
            return "other";
    }
}

size_t node_count(cudaGraph_t g) {
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    return count;
}

// Host buffers, pageable and pinned, and the device buffers the graphs use.
struct buffers {
    float* in_pageable = static_cast<float*>(malloc(n * sizeof(float)));
    float* in_pinned = nullptr;
    float* out_pageable = static_cast<float*>(malloc(n * sizeof(float)));
    float* out_pinned = nullptr;
    float* box = static_cast<float*>(malloc(rows * host_pitch * sizeof(float)));
    float* from_array = static_cast<float*>(malloc(n * sizeof(float)));
    double* result = new double(0);
    float *d_x = nullptr, *d_y = nullptr, *d_z = nullptr;
    double* d_sum = nullptr;
    cudaArray_t array = nullptr;
    buffers() {
        CHECK(cudaMallocHost(&in_pinned, n * sizeof(float)));
        CHECK(cudaMallocHost(&out_pinned, n * sizeof(float)));
        CHECK(cudaMalloc(&d_x, n * sizeof(float)));
        CHECK(cudaMalloc(&d_y, n * sizeof(float)));
        CHECK(cudaMalloc(&d_z, n * sizeof(float)));
        CHECK(cudaMalloc(&d_sum, sizeof(double)));
        cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
        CHECK(cudaMallocArray(&array, &f, cols, rows));
    }
    // New inputs; outputs set to a value no launch writes.
    void next(uint32_t seed) {
        fill(in_pageable, n, seed);
        fill(in_pinned, n, seed * 7u + 3u);
        for (int i = 0; i < n; ++i) out_pageable[i] = out_pinned[i] = from_array[i] = -1.0f;
        for (int i = 0; i < rows * host_pitch; ++i) box[i] = -1.0f;
        *result = -1.0;
    }
    ~buffers() {
        cudaFreeArray(array);
        cudaFree(d_sum);
        cudaFree(d_z);
        cudaFree(d_y);
        cudaFree(d_x);
        cudaFreeHost(out_pinned);
        cudaFreeHost(in_pinned);
        free(in_pageable);
        free(out_pageable);
        free(box);
        free(from_array);
        delete result;
    }
};

// A graph made node by node:
//   in_pageable -> d_x -> affine(2, 1) -> d_y -> sum -> d_sum -> *result -> host node (reads *result)
//   memset d_sum ----------------------------------^       d_y -> out_pinned, box, array -> from_array
//   in_pinned -> d_z -> out_pageable
cudaGraph_t build_graph(buffers& b, seen& host_saw, std::vector<cudaGraphNode_t>& named) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    static int count = n;
    static float a = 2.0f, bias = 1.0f;
    static void* affine_args[5];
    static void* sum_args[3];
    affine_args[0] = &b.d_x;
    affine_args[1] = &b.d_y;
    affine_args[2] = &count;
    affine_args[3] = &a;
    affine_args[4] = &bias;
    sum_args[0] = &b.d_y;
    sum_args[1] = &b.d_sum;
    sum_args[2] = &count;
    cudaGraphNode_t in =
        add_copy(g, {}, linear(b.d_x, b.in_pageable, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaMemsetParams ms = {};
    ms.dst = b.d_sum;
    ms.elementSize = 4;
    ms.width = 2;
    ms.height = 1;
    cudaGraphNode_t zero;
    CHECK(cudaGraphAddMemsetNode(&zero, g, nullptr, 0, &ms));
    cudaGraphNode_t k1 = add_kernel(g, {in}, reinterpret_cast<void*>(ghc_affine), affine_args, blocks);
    cudaGraphNode_t k2 = add_kernel(g, {k1, zero}, reinterpret_cast<void*>(ghc_sum), sum_args, 1);
    cudaGraphNode_t back =
        add_copy(g, {k2}, linear(b.result, b.d_sum, sizeof(double), cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp = {look, &host_saw};
    cudaGraphNode_t host;
    CHECK(cudaGraphAddHostNode(&host, g, &back, 1, &hp));
    cudaHostNodeParams hp_back{};
    CHECK(cudaGraphHostNodeGetParams(host, &hp_back));
    EXPECT(hp_back.fn == look && hp_back.userData == &host_saw,
           "cudaGraphHostNodeGetParams: another function");
    add_copy(g, {k1}, linear(b.out_pinned, b.d_y, n * sizeof(float), cudaMemcpyDeviceToHost));
    add_copy(g, {k1}, box_to_host(b.box, b.d_y));
    cudaMemcpy3DParms to_array = {};
    to_array.srcPtr = make_cudaPitchedPtr(b.d_y, cols * sizeof(float), cols, rows);
    to_array.dstArray = b.array;
    to_array.extent = make_cudaExtent(cols, rows, 1);  // elements: one side is an array
    to_array.kind = cudaMemcpyDeviceToDevice;
    cudaGraphNode_t into_array = add_copy(g, {k1}, to_array);
    cudaMemcpy3DParms from_array = {};
    from_array.srcArray = b.array;
    from_array.dstPtr = make_cudaPitchedPtr(b.from_array, cols * sizeof(float), cols, rows);
    from_array.extent = make_cudaExtent(cols, rows, 1);
    from_array.kind = cudaMemcpyDeviceToHost;
    add_copy(g, {into_array}, from_array);
    cudaGraphNode_t pinned_in =
        add_copy(g, {}, linear(b.d_z, b.in_pinned, n * sizeof(float), cudaMemcpyHostToDevice));
    add_copy(g, {pinned_in}, linear(b.out_pageable, b.d_z, n * sizeof(float), cudaMemcpyDeviceToHost));
    named = {in, k1, back, host, pinned_in};
    return g;
}

// One launch's results against the CPU reference: affine(2, 1) of in_pageable through every path, in_pinned
// back unchanged, and the host node's view of the sum.
void check_launch(const char* what, buffers& b, const float* in, const float* pinned_in, const seen& host_saw,
                  size_t launches) {
    std::vector<float> y = affine(in, 2.0f, 1.0f);
    expect_floats("pinned copy of d_y", b.out_pinned, y.data(), n);
    expect_floats("copy through the array", b.from_array, y.data(), n);
    expect_floats("pageable copy of d_z", b.out_pageable, pinned_in, n);
    expect_box("2D box of d_y", b.box, y, -1.0f);
    EXPECT(*b.result == sum(y), "%s: result %.3f, want %.3f", what, *b.result, sum(y));
    EXPECT(host_saw.values.size() == launches, "%s: the host node ran %zu times in %zu launches", what,
           host_saw.values.size(), launches);
    EXPECT(host_saw.values.back() == sum(y), "%s: the host node saw %.3f, its launch copied %.3f", what,
           host_saw.values.back(), sum(y));
    printf("%s: sum %.3f, copies and host node ok\n", what, *b.result);
}

void explicit_graph(buffers& b) {
    seen host_saw;
    host_saw.result = b.result;
    std::vector<cudaGraphNode_t> named;
    cudaGraph_t g = build_graph(b, host_saw, named);
    printf("graph built node by node: %zu nodes;", node_count(g));
    for (cudaGraphNode_t node : named) printf(" %s", type_name(node));
    printf("\n");
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, g));
    read_back_copies(nullptr);
    read_back_copies(clone);
    CHECK(cudaGraphDestroy(g));  // the executable graph and the clone keep what they need
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<float> in(n), pinned_in(n);
    for (int launch = 1; launch <= 3; ++launch) {
        b.next(100u * launch);
        std::memcpy(in.data(), b.in_pageable, n * sizeof(float));
        std::memcpy(pinned_in.data(), b.in_pinned, n * sizeof(float));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        char what[64];
        snprintf(what, sizeof what, "explicit graph, launch %d", launch);
        check_launch(what, b, in.data(), pinned_in.data(), host_saw, launch);
    }
    CHECK(cudaGraphExecDestroy(exec));
    cudaGraphExec_t clone_exec;
    CHECK(cudaGraphInstantiate(&clone_exec, clone, 0));
    CHECK(cudaGraphDestroy(clone));
    b.next(977u);
    std::memcpy(in.data(), b.in_pageable, n * sizeof(float));
    std::memcpy(pinned_in.data(), b.in_pinned, n * sizeof(float));
    CHECK(cudaGraphLaunch(clone_exec, s));
    CHECK(cudaStreamSynchronize(s));
    check_launch("clone of the graph, destroyed before its launch", b, in.data(), pinned_in.data(), host_saw,
                 4);
    CHECK(cudaGraphExecDestroy(clone_exec));
    CHECK(cudaStreamDestroy(s));
}

// Captured on `s`: in_pageable -> d_x, affine(a, 1), sum, the sum into `*result`, a host function reading it,
// a 2D box of d_y into b.box; and on `side` (joined through events) d_y into out_pageable.
cudaGraph_t capture(buffers& b, cudaStream_t s, cudaStream_t side, float a, double* result, seen& host_saw) {
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(b.d_x, b.in_pageable, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CHECK(cudaMemsetAsync(b.d_sum, 0, sizeof(double), s));
    ghc_affine<<<blocks, threads, 0, s>>>(b.d_x, b.d_y, n, a, 1.0f);
    CHECK_LAUNCH();
    ghc_sum<<<1, threads, 0, s>>>(b.d_y, b.d_sum, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(result, b.d_sum, sizeof(double), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, look, &host_saw));
    CHECK(cudaMemcpy2DAsync(b.box + box_y * host_pitch + box_x, host_pitch * sizeof(float),
                            b.d_y + box_y * cols + box_x, cols * sizeof(float), box_w * sizeof(float), box_h,
                            cudaMemcpyDeviceToHost, s));
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(side, fork, 0));
    CHECK(cudaMemcpyAsync(b.out_pageable, b.d_y, n * sizeof(float), cudaMemcpyDeviceToHost, side));
    CHECK(cudaEventRecord(join, side));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    return g;
}

void captured_graph(buffers& b) {
    cudaStream_t s, side;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    seen host_saw;
    host_saw.result = b.result;
    cudaGraph_t g = capture(b, s, side, 2.0f, b.result, host_saw);
    printf("captured graph: %zu nodes\n", node_count(g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    std::vector<float> in(n);
    for (int launch = 1; launch <= 3; ++launch) {
        b.next(300u + launch);
        std::memcpy(in.data(), b.in_pageable, n * sizeof(float));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        std::vector<float> y = affine(in.data(), 2.0f, 1.0f);
        expect_floats("captured copy on the joined stream", b.out_pageable, y.data(), n);
        expect_box("captured 2D copy", b.box, y, -1.0f);
        EXPECT(*b.result == sum(y), "captured launch %d: result %.3f, want %.3f", launch, *b.result, sum(y));
        EXPECT(host_saw.values.size() == static_cast<size_t>(launch) && host_saw.values.back() == sum(y),
               "captured launch %d: the host function saw %.3f", launch, host_saw.values.back());
        printf("captured graph, launch %d: sum %.3f, copies and host function ok\n", launch, *b.result);
    }

    // As jacobiCudaGraphs does: the same work captured again, its result copied elsewhere and the kernel's
    // factor changed, and the executable graph updated from it.
    double elsewhere = -1.0;
    seen second_saw;
    second_saw.result = &elsewhere;
    cudaGraph_t g2 = capture(b, s, side, 3.0f, &elsewhere, second_saw);
    cudaGraphExecUpdateResultInfo info;
    if (cudaError_t rc = cudaGraphExecUpdate(exec, g2, &info); rc != cudaSuccess) {
        cudaGraphNodeType type = cudaGraphNodeTypeCount;
        if (info.errorNode) cudaGraphNodeGetType(info.errorNode, &type);
        fail("cudaGraphExecUpdate returned %s: update result %d, error node type %d", cudaGetErrorName(rc),
             static_cast<int>(info.result), static_cast<int>(type));
    }
    EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result %d", static_cast<int>(info.result));
    b.next(4242u);
    std::memcpy(in.data(), b.in_pageable, n * sizeof(float));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<float> y = affine(in.data(), 3.0f, 1.0f);
    EXPECT(elsewhere == sum(y), "updated graph: result %.3f, want %.3f", elsewhere, sum(y));
    EXPECT(*b.result == -1.0, "updated graph still wrote the old result (%.3f)", *b.result);
    EXPECT(second_saw.values.size() == 1 && second_saw.values[0] == sum(y) && host_saw.values.size() == 3,
           "updated graph: host functions ran %zu (new) and %zu (old) times", second_saw.values.size(),
           host_saw.values.size());
    expect_floats("updated graph's copy on the joined stream", b.out_pageable, y.data(), n);
    printf("executable graph updated from a new capture: sum %.3f written to the new place\n", elsewhere);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaStreamDestroy(side));
    CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
    buffers b;
    explicit_graph(b);
    captured_graph(b);
    return pass();
}
