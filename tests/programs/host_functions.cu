// host_functions: cudaLaunchHostFunc and cudaStreamAddCallback run on the host in stream order: each sees the
// results of the work queued before it (an async copy into pinned memory), callbacks of one stream run in the
// order they were queued, and a synchronize returns only after they have run (one sleeps first).
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void hf_fill(int* d, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = i * 3 + k;
}

struct probe {
    const int* host = nullptr;  // pinned, filled by the copy queued before the function
    int n = 0;
    int k = 0;
    bool saw_results = false;
    std::vector<int>* order = nullptr;
    int tag = 0;
};

static void CUDART_CB check_and_log(void* data) {
    auto* p = static_cast<probe*>(data);
    bool ok = true;
    for (int i = 0; i < p->n; ++i) ok = ok && p->host[i] == i * 3 + p->k;
    p->saw_results = ok;
    p->order->push_back(p->tag);
}

static void CUDART_CB slow_callback(cudaStream_t, cudaError_t status, void* data) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *static_cast<int*>(data) = status == cudaSuccess ? 1 : -1;
}

int main() {
    const int n = 4096, rounds = 5;
    int* d = nullptr;
    int* h = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMallocHost(&h, rounds * n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    std::vector<int> order;
    std::vector<probe> probes(rounds);
    for (int r = 0; r < rounds; ++r) {
        hf_fill<<<(n + 255) / 256, 256, 0, s>>>(d, n, r);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(h + r * n, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        probes[r] = {h + r * n, n, r, false, &order, r};
        CHECK(cudaLaunchHostFunc(s, check_and_log, &probes[r]));
    }
    int slow_done = 0;
    CHECK(cudaStreamAddCallback(s, slow_callback, &slow_done, 0));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(slow_done == 1, "cudaStreamSynchronize returned before the callback ran (flag %d)", slow_done);
    std::printf("stream callback ran before the synchronize returned: yes\n");
    EXPECT(static_cast<int>(order.size()) == rounds, "%zu host functions ran, want %d", order.size(), rounds);
    for (int r = 0; r < rounds; ++r) {
        EXPECT(order[r] == r, "host function %d ran in place %d", order[r], r);
        EXPECT(probes[r].saw_results, "host function %d did not see the copy queued before it", r);
    }
    std::printf("%d host functions ran in stream order, each after the copy queued before it\n", rounds);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(h));
    CHECK(cudaFree(d));
    return pass();
}
