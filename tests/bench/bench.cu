// vcuda's micro-benchmark: the same measurements natively and through vcuda; tools/bench.sh runs both and
// prints them side by side. Each line: "metric <name> <value> <unit>".
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            std::printf("FAIL %s: %s at line %d\n", #x, cudaGetErrorName(e_), __LINE__); \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

__global__ void empty_kernel() {}

using clk = std::chrono::steady_clock;

// Median of `reps` timings of `n` iterations of f, in microseconds per iteration.
template <class F>
double per_call_us(int n, int reps, F&& f) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) f();
        t.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

void metric(const char* name, double v, const char* unit) {
    std::printf("metric %s %.3f %s\n", name, v, unit);
}

int main() {
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(nullptr));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    empty_kernel<<<1, 1, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));

    metric("sync_call_stream_query", per_call_us(2000, 5, [&] { CHECK(cudaStreamQuery(s)); }), "us");
    metric("sync_call_device_sync_idle", per_call_us(2000, 5, [&] { CHECK(cudaDeviceSynchronize()); }), "us");
    metric("launch_plus_sync",
           per_call_us(2000, 5,
                       [&] {
                           empty_kernel<<<1, 1, 0, s>>>();
                           CHECK(cudaStreamSynchronize(s));
                       }),
           "us");
    // 100,000 launches and the synchronize that waits for them, 5 times: launch times drift by 10-20% from
    // one such run to the next even natively, so one run says little.
    metric("async_launch",
           per_call_us(1, 5,
                       [&] {
                           const int n = 100000;
                           for (int i = 0; i < n; ++i) empty_kernel<<<1, 1, 0, s>>>();
                           CHECK(cudaStreamSynchronize(s));
                       }) /
               100000,
           "us");
    void* dev;
    CHECK(cudaMalloc(&dev, 256u << 20));
    std::vector<char> small(4096, 1);
    metric("htod_4KiB",
           per_call_us(2000, 5, [&] { CHECK(cudaMemcpy(dev, small.data(), 4096, cudaMemcpyHostToDevice)); }),
           "us");
    metric("dtoh_4KiB",
           per_call_us(2000, 5, [&] { CHECK(cudaMemcpy(small.data(), dev, 4096, cudaMemcpyDeviceToHost)); }),
           "us");
    metric("alloc_free_1MiB",
           per_call_us(500, 5,
                       [&] {
                           void* p;
                           CHECK(cudaMalloc(&p, 1u << 20));
                           CHECK(cudaFree(p));
                       }),
           "us");
    // Stream-ordered allocations of the default pool, each freed behind the work queued before it: 1 MiB
    // shares mappings, 64 MiB gets one of its own.
    for (auto [name, size] : {std::pair{"async_alloc_free_1MiB", size_t{1} << 20},
                              std::pair{"async_alloc_free_64MiB", size_t{64} << 20}})
        metric(name,
               per_call_us(1, 5,
                           [&, size = size] {
                               for (int i = 0; i < 200; ++i) {
                                   void* p;
                                   CHECK(cudaMallocAsync(&p, size, s));
                                   empty_kernel<<<1, 1, 0, s>>>();
                                   CHECK(cudaFreeAsync(p, s));
                               }
                               CHECK(cudaStreamSynchronize(s));
                           }) /
                   200,
               "us");
    const size_t big = 256u << 20;
    void* pinned;
    CHECK(cudaMallocHost(&pinned, big));
    std::memset(pinned, 3, big);
    std::vector<char> pageable(big, 4);
    auto gbps = [&](void* dst, const void* src, cudaMemcpyKind k) {
        CHECK(cudaMemcpy(dst, src, big, k));  // warm-up
        double us = per_call_us(3, 3, [&] { CHECK(cudaMemcpy(dst, src, big, k)); });
        return big / us / 1e3;
    };
    metric("htod_256MiB_pinned", gbps(dev, pinned, cudaMemcpyHostToDevice), "GB/s");
    metric("dtoh_256MiB_pinned", gbps(pinned, dev, cudaMemcpyDeviceToHost), "GB/s");
    metric("htod_256MiB_pageable", gbps(dev, pageable.data(), cudaMemcpyHostToDevice), "GB/s");
    metric("dtoh_256MiB_pageable", gbps(pageable.data(), dev, cudaMemcpyDeviceToHost), "GB/s");
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
    std::printf("PASS bench\n");
    return 0;
}
