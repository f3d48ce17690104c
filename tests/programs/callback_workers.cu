// callback_workers: the pattern of NVIDIA's simpleCallback sample, which hung over TCP: eight threads each
// fill pinned memory, copy it to the GPU, run a kernel, copy the result back into the same pinned memory and
// add a stream callback; each callback starts a thread that reads the result with no CUDA call before it,
// then frees the memory and destroys the stream. Over TCP the copies back are left under way (deferred
// copies), the server's lanes register staging pages while other streams wait for their callbacks, and the
// client's host-function thread collects finished copies before each callback runs: that collection must not
// wait for the driver (it waited for cuMemHostRegister, which waited for the GPU, which waited for the
// callback). argv[1]: ms each callback waits before it starts its thread (default 0): the program is then
// idle with callbacks still due, when a server that suspends idle sessions suspends it; the callbacks after
// the first collect their copies while the suspend waits for them, which must not wait for the suspend.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void cw_increment(int* data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1;
}

namespace {

constexpr int workers = 8, n = 1 << 16;

struct workload {
    int id = 0;
    int* d = nullptr;
    int* h = nullptr;
    cudaStream_t stream = nullptr;
    std::atomic<bool> right{false};
};
std::atomic<int> finished{0};
int callback_wait_ms = 0;

void postprocess(workload* w) {
    bool right = true;
    for (int i = 0; i < n; ++i) right &= w->h[i] == w->id + i + 1;
    w->right = right;
    CHECK(cudaFree(w->d));
    CHECK(cudaFreeHost(w->h));
    CHECK(cudaStreamDestroy(w->stream));
    finished.fetch_add(1);
}

void CUDART_CB on_done(cudaStream_t, cudaError_t status, void* data) {
    if (status != cudaSuccess) fail("a callback saw %s", cudaGetErrorName(status));
    if (callback_wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(callback_wait_ms));
    std::thread(postprocess, static_cast<workload*>(data)).detach();
}

void launch(workload* w) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreate(&w->stream));
    CHECK(cudaMalloc(&w->d, n * sizeof(int)));
    CHECK(cudaHostAlloc(&w->h, n * sizeof(int), cudaHostAllocPortable));
    for (int i = 0; i < n; ++i) w->h[i] = w->id + i;
    CHECK(cudaMemcpyAsync(w->d, w->h, n * sizeof(int), cudaMemcpyHostToDevice, w->stream));
    cw_increment<<<(n + 511) / 512, 512, 0, w->stream>>>(w->d, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(w->h, w->d, n * sizeof(int), cudaMemcpyDeviceToHost, w->stream));
    CHECK(cudaStreamAddCallback(w->stream, on_done, w, 0));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1) callback_wait_ms = atoi(argv[1]);
    std::vector<workload> loads(workers);
    std::vector<std::thread> threads;
    for (int i = 0; i < workers; ++i) {
        loads[i].id = i;
        threads.emplace_back(launch, &loads[i]);
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 3000 && finished.load() < workers; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT(finished.load() == workers, "%d of %d workloads finished in 30 s", finished.load(), workers);
    for (auto& w : loads)
        EXPECT(w.right.load(), "workload %d read wrong results in its callback's thread", w.id);
    printf("%d workloads, each checked in a thread its stream's callback started\n", workers);
    return pass();
}
