// streams_events: streams (plain, non-blocking, with priority), events (timing and DisableTiming), a
// cross-stream dependency through cudaStreamWaitEvent, event timing (printed as info:, checked > 0),
// event and stream queries after completion, and the error of timing a DisableTiming event.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// Iterates a 32-bit LCG `iters` times on each element: enough work to be measurable, exactly reproducible.
extern "C" __global__ void se_lcg(unsigned* data, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned x = data[i];
        for (int k = 0; k < iters; ++k) x = x * 1664525u + 1013904223u;
        data[i] = x;
    }
}

static unsigned lcg(unsigned x, int iters) {
    for (int k = 0; k < iters; ++k) x = x * 1664525u + 1013904223u;
    return x;
}

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(unsigned);

    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    printf("stream priority range: least %d, greatest %d\n", least, greatest);

    cudaStream_t s1, s2, s3;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithPriority(&s3, cudaStreamNonBlocking, greatest));
    unsigned flags = 99;
    int prio = 99;
    CHECK(cudaStreamGetFlags(s2, &flags));
    CHECK(cudaStreamGetPriority(s3, &prio));
    printf("s2 flags %u, s3 priority %d\n", flags, prio);
    EXPECT(flags == cudaStreamNonBlocking, "s2 flags %u", flags);
    EXPECT(prio == greatest, "s3 priority %d", prio);

    cudaEvent_t start, stop, dep, notiming;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&dep, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&notiming, cudaEventDisableTiming));

    std::vector<unsigned> h(n), out(n), out3(n);
    for (int i = 0; i < n; ++i) h[i] = static_cast<unsigned>(i) * 2654435761u;
    unsigned *d, *d3;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMalloc(&d3, bytes));

    // s1: copy in, kernel (timed), record dep. s2 waits for dep, runs a second kernel on the same data.
    // s3: independent work at high priority.
    CHECK(cudaMemcpyAsync(d, h.data(), bytes, cudaMemcpyHostToDevice, s1));
    CHECK(cudaMemcpyAsync(d3, h.data(), bytes, cudaMemcpyHostToDevice, s3));
    CHECK(cudaEventRecord(start, s1));
    se_lcg<<<n / 256, 256, 0, s1>>>(d, n, 200);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop, s1));
    CHECK(cudaEventRecord(dep, s1));
    CHECK(cudaStreamWaitEvent(s2, dep, 0));
    se_lcg<<<n / 256, 256, 0, s2>>>(d, n, 3);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(notiming, s2));
    se_lcg<<<n / 128, 128, 0, s3>>>(d3, n, 17);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(out3.data(), d3, bytes, cudaMemcpyDeviceToHost, s3));

    CHECK(cudaEventSynchronize(stop));
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("info: kernel time %.3f ms\n", ms);
    EXPECT(ms > 0.0f, "elapsed time %.6f ms is not positive", ms);
    printf("elapsed time positive: yes\n");

    CHECK(cudaEventSynchronize(notiming));
    CHECK(cudaMemcpy(out.data(), d, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        unsigned want = lcg(lcg(h[i], 200), 3);
        if (out[i] != want) fail("dependent kernels: out[%d] = %u, expected %u", i, out[i], want);
    }
    printf("s2 ran after s1 (waited on the event): ok\n");

    CHECK(cudaStreamSynchronize(s3));
    for (int i = 0; i < n; ++i) {
        unsigned want = lcg(h[i], 17);
        if (out3[i] != want) fail("s3: out3[%d] = %u, expected %u", i, out3[i], want);
    }
    printf("s3 result after cudaStreamSynchronize: ok\n");

    // Queries after completion are deterministic.
    printf("cudaEventQuery(stop) = %s\n", cudaGetErrorName(cudaEventQuery(stop)));
    printf("cudaEventQuery(notiming) = %s\n", cudaGetErrorName(cudaEventQuery(notiming)));
    printf("cudaStreamQuery(s1) = %s\n", cudaGetErrorName(cudaStreamQuery(s1)));
    printf("cudaStreamQuery(s2) = %s\n", cudaGetErrorName(cudaStreamQuery(s2)));
    EXPECT(cudaEventQuery(stop) == cudaSuccess, "cudaEventQuery(stop) after synchronize");
    EXPECT(cudaStreamQuery(s1) == cudaSuccess, "cudaStreamQuery(s1) after synchronize");

    // Timing a DisableTiming event is an error (and not a sticky one).
    float bad = 0;
    cudaError_t e = cudaEventElapsedTime(&bad, start, notiming);
    printf("cudaEventElapsedTime with a DisableTiming event = %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess, "timing a DisableTiming event succeeded");
    (void)cudaGetLastError();

    // Many events recorded back to back on one stream: the last one completes after all the work.
    std::vector<cudaEvent_t> evs(32);
    for (auto& ev : evs) CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    for (int k = 0; k < 32; ++k) {
        se_lcg<<<n / 256, 256, 0, s2>>>(d, n, 1);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(evs[k], s2));
    }
    CHECK(cudaEventSynchronize(evs.back()));
    for (auto& ev : evs) EXPECT(cudaEventQuery(ev) == cudaSuccess, "an earlier event is not complete");
    CHECK(cudaMemcpy(out.data(), d, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i += 997) {
        unsigned want = lcg(lcg(lcg(h[i], 200), 3), 32);
        EXPECT(out[i] == want, "after 32 recorded launches: out[%d] = %u, expected %u", i, out[i], want);
    }
    printf("32 events in order: ok\n");

    // Default stream: a blocking stream's work is ordered with the legacy default stream.
    se_lcg<<<n / 256, 256, 0, s1>>>(d, n, 5);
    CHECK_LAUNCH();
    se_lcg<<<n / 256, 256>>>(d, n, 7);  // legacy default stream: waits for s1
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), d, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i += 991) {
        unsigned want = lcg(lcg(lcg(lcg(lcg(h[i], 200), 3), 32), 5), 7);
        EXPECT(out[i] == want, "default stream ordering: out[%d] = %u, expected %u", i, out[i], want);
    }
    printf("legacy default stream ordering: ok\n");

    for (auto& ev : evs) CHECK(cudaEventDestroy(ev));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(dep));
    CHECK(cudaEventDestroy(notiming));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaStreamDestroy(s3));
    CHECK(cudaFree(d));
    CHECK(cudaFree(d3));
    return pass();
}
