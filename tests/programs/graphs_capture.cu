// graphs_capture: stream capture into a graph and its replay. A capture on a non-blocking stream records
// kernel launches, a memset and a device-to-device copy, forks to a second stream and joins back through
// events, and allocates memory in RELAXED capture mode meanwhile (as PyTorch's allocator does). Capture
// status and id are checked before, during (on the capturing, the joined and an unrelated stream) and after;
// the graph's node counts are checked; nothing may run during the capture. The graph is then instantiated
// twice (plain and with parameters, uploading), launched four times, and the results are compared with a CPU
// reference.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// x[i] = x[i] * mul + add
extern "C" __global__ void gc_step(unsigned* x, int n, unsigned mul, unsigned add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * mul + add;
}

// acc[i] += x[i]
extern "C" __global__ void gc_accumulate(unsigned* acc, const unsigned* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

namespace {

const char* status_name(cudaStreamCaptureStatus s) {
    switch (s) {
        case cudaStreamCaptureStatusNone:
            return "none";
        case cudaStreamCaptureStatusActive:
            return "active";
        case cudaStreamCaptureStatusInvalidated:
            return "invalidated";
    }
    return "unknown";
}

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusInvalidated;
    CHECK(cudaStreamIsCapturing(s, &st));
    return st;
}

// What one replay of the graph does, on the host.
struct reference {
    std::vector<unsigned> x, side, acc, copy;
    void replay() {
        for (size_t i = 0; i < x.size(); ++i) {
            x[i] = x[i] * 3u + 7u;
            unsigned tmp = x[i];
            side[i] = side[i] * 5u + 1u;
            acc[i] += tmp;
            copy[i] = acc[i] + side[i];
        }
    }
};

void expect_equal(const char* what, const std::vector<unsigned>& got, const std::vector<unsigned>& want) {
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i]) fail("%s[%zu] = %u, expected %u", what, i, got[i], want[i]);
}

}  // namespace

int main() {
    const int n = 1 << 16;
    const size_t bytes = n * sizeof(unsigned);
    const int threads = 256, blocks = n / threads;
    // Larger than vcuda's shared small-allocation mappings, so the server maps new memory during the capture.
    const size_t tmp_bytes = size_t{32} << 20;

    reference ref;
    ref.x.resize(n);
    ref.side.resize(n);
    ref.acc.assign(n, 0);
    ref.copy.assign(n, 0);
    rng r(7);
    for (int i = 0; i < n; ++i) {
        ref.x[i] = r.u32();
        ref.side[i] = r.u32();
    }

    unsigned *x, *side, *acc, *copy;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&side, bytes));
    CHECK(cudaMalloc(&acc, bytes));
    CHECK(cudaMalloc(&copy, bytes));
    CHECK(cudaMemcpy(x, ref.x.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(side, ref.side.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(acc, 0, bytes));
    CHECK(cudaMemset(copy, 0, bytes));

    // Load both kernels before capturing (n = 0: they touch nothing).
    gc_step<<<1, threads>>>(x, 0, 1, 0);
    CHECK_LAUNCH();
    gc_accumulate<<<1, threads>>>(acc, x, 0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    cudaStream_t s, s2, other;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    printf("before capture: %s\n", status_name(capture_status(s)));
    EXPECT(capture_status(s) == cudaStreamCaptureStatusNone,
           "a stream captures before cudaStreamBeginCapture");

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("during capture: %s\n", status_name(capture_status(s)));
    EXPECT(capture_status(s) == cudaStreamCaptureStatusActive, "the capturing stream is not capturing");
    cudaStreamCaptureStatus st;
    unsigned long long id = 0, id_again = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id));
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id_again));
    printf("capture id nonzero and stable: %s\n", id != 0 && id == id_again ? "yes" : "no");
    EXPECT(st == cudaStreamCaptureStatusActive && id != 0 && id == id_again,
           "capture info: status %d, id %llu then %llu", static_cast<int>(st), id, id_again);

    // An allocation during the capture, allowed by the RELAXED mode of this thread.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("previous capture mode was global: %s\n", mode == cudaStreamCaptureModeGlobal ? "yes" : "no");
    unsigned* tmp = nullptr;
    CHECK(cudaMalloc(&tmp, tmp_bytes));
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == cudaStreamCaptureModeRelaxed, "the exchanged capture mode is %d", static_cast<int>(mode));
    printf("allocation during capture in relaxed mode: ok\n");

    gc_step<<<blocks, threads, 0, s>>>(x, n, 3u, 7u);
    CHECK_LAUNCH();
    CHECK(cudaMemsetAsync(tmp, 0, bytes, s));
    gc_accumulate<<<blocks, threads, 0, s>>>(tmp, x, n);
    CHECK_LAUNCH();
    // Fork: s2 joins the capture by waiting on an event recorded in it.
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    printf("joined stream: %s, unrelated stream: %s\n", status_name(capture_status(s2)),
           status_name(capture_status(other)));
    EXPECT(capture_status(s2) == cudaStreamCaptureStatusActive, "the joined stream is not capturing");
    EXPECT(capture_status(other) == cudaStreamCaptureStatusNone, "an unrelated stream is capturing");
    unsigned long long id2 = 0;
    CHECK(cudaStreamGetCaptureInfo(s2, &st, &id2));
    EXPECT(id2 == id, "the joined stream's capture id %llu differs from %llu", id2, id);
    gc_step<<<blocks, threads, 0, s2>>>(side, n, 5u, 1u);
    CHECK_LAUNCH();
    gc_accumulate<<<blocks, threads, 0, s>>>(acc, tmp, n);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    CHECK(cudaMemcpyAsync(copy, acc, bytes, cudaMemcpyDeviceToDevice, s));
    gc_accumulate<<<blocks, threads, 0, s>>>(copy, side, n);
    CHECK_LAUNCH();

    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph));
    EXPECT(graph != nullptr, "cudaStreamEndCapture gave no graph");
    printf("after capture: %s, joined stream: %s\n", status_name(capture_status(s)),
           status_name(capture_status(s2)));
    EXPECT(capture_status(s) == cudaStreamCaptureStatusNone, "still capturing after cudaStreamEndCapture");
    EXPECT(capture_status(s2) == cudaStreamCaptureStatusNone, "the joined stream still captures");

    size_t nodes = 0, roots = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    CHECK(cudaGraphGetRootNodes(graph, nullptr, &roots));
    printf("graph: %zu nodes, %zu root\n", nodes, roots);
    EXPECT(nodes == 7 && roots == 1, "graph has %zu nodes and %zu roots, expected 7 and 1", nodes, roots);

    // Nothing ran while capturing.
    std::vector<unsigned> got(n);
    CHECK(cudaMemcpy(got.data(), x, bytes, cudaMemcpyDeviceToHost));
    expect_equal("x after capture", got, ref.x);
    CHECK(cudaMemcpy(got.data(), copy, bytes, cudaMemcpyDeviceToHost));
    expect_equal("copy after capture", got, ref.copy);
    printf("nothing ran during capture: ok\n");

    cudaGraphExec_t exec = nullptr, exec2 = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int k = 0; k < 2; ++k) {
        CHECK(cudaGraphLaunch(exec, s));
        ref.replay();
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(got.data(), copy, bytes, cudaMemcpyDeviceToHost));
    expect_equal("copy after two launches", got, ref.copy);
    CHECK(cudaMemcpy(got.data(), x, bytes, cudaMemcpyDeviceToHost));
    expect_equal("x after two launches", got, ref.x);
    printf("two launches: ok\n");

    cudaGraphInstantiateParams params = {};
    params.flags = cudaGraphInstantiateFlagUpload;
    params.uploadStream = s;
    CHECK(cudaGraphInstantiateWithParams(&exec2, graph, &params));
    EXPECT(params.result_out == cudaGraphInstantiateSuccess, "instantiate result %d",
           static_cast<int>(params.result_out));
    CHECK(cudaGraphLaunch(exec2, s));
    ref.replay();
    CHECK(cudaGraphUpload(exec, s));
    CHECK(cudaGraphLaunch(exec, s));
    ref.replay();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(got.data(), copy, bytes, cudaMemcpyDeviceToHost));
    expect_equal("copy after four launches", got, ref.copy);
    CHECK(cudaMemcpy(got.data(), acc, bytes, cudaMemcpyDeviceToHost));
    expect_equal("acc after four launches", got, ref.acc);
    CHECK(cudaMemcpy(got.data(), side, bytes, cudaMemcpyDeviceToHost));
    expect_equal("side after four launches", got, ref.side);
    printf("four launches of two executable graphs: ok (digest %016llx)\n",
           static_cast<unsigned long long>(fnv1a(got.data(), bytes)));

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(exec2));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaStreamDestroy(other));
    for (unsigned* p : {x, side, acc, copy, tmp}) CHECK(cudaFree(p));
    return pass();
}
