// managed_streams: after NVIDIA's UnifiedMemoryStreams sample, without cuBLAS and OpenMP. Tasks of sizes from
// a fixed seed, each with its matrix, vector and result in managed memory attached to the host, are taken by
// four host threads, each with a stream of its own. Small tasks are computed on the CPU; large ones attach
// their memory to the thread's stream and run a matrix-vector kernel there, while the other threads go on
// touching their own managed memory. Every result is checked against the CPU's; the digest of all results is
// printed in task order.
#include <cuda_runtime.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common.cuh"

// y[i] += sum_j a[i * n + j] * x[j] (unsigned: wraps the same on every machine)
extern "C" __global__ void ms_gemv(const unsigned* a, const unsigned* x, unsigned* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned s = 0;
    for (int j = 0; j < n; ++j) s += a[static_cast<size_t>(i) * n + j] * x[j];
    y[i] += s;
}

struct task {
    int id = 0, n = 0;
    unsigned *a = nullptr, *x = nullptr, *y = nullptr;
    uint64_t digest = 0;
};

static void run_task(task& t, cudaStream_t s) {
    const size_t n = t.n;
    CHECK(cudaMallocManaged(&t.a, n * n * sizeof(unsigned), cudaMemAttachHost));
    CHECK(cudaMallocManaged(&t.x, n * sizeof(unsigned), cudaMemAttachHost));
    CHECK(cudaMallocManaged(&t.y, n * sizeof(unsigned), cudaMemAttachHost));
    rng r(1000 + t.id);
    for (size_t i = 0; i < n * n; ++i) t.a[i] = r.u32() % 100;
    for (size_t i = 0; i < n; ++i) t.x[i] = r.u32() % 10, t.y[i] = static_cast<unsigned>(i);
    std::vector<unsigned> want(n);
    for (size_t i = 0; i < n; ++i) {
        unsigned acc = 0;
        for (size_t j = 0; j < n; ++j) acc += t.a[i * n + j] * t.x[j];
        want[i] = t.y[i] + acc;
    }
    if (t.n < 100) {  // small: on the CPU, as the sample does
        for (size_t i = 0; i < n; ++i) t.y[i] = want[i];
    } else {
        CHECK(cudaStreamAttachMemAsync(s, t.a, 0, cudaMemAttachSingle));
        CHECK(cudaStreamAttachMemAsync(s, t.x, 0, cudaMemAttachSingle));
        CHECK(cudaStreamAttachMemAsync(s, t.y, 0, cudaMemAttachSingle));
        ms_gemv<<<(t.n + 127) / 128, 128, 0, s>>>(t.a, t.x, t.y, t.n);
        CHECK_LAUNCH();
        CHECK(cudaStreamSynchronize(s));
    }
    for (size_t i = 0; i < n; ++i)
        if (t.y[i] != want[i]) fail("task %d (n %d): y[%zu] = %u, want %u", t.id, t.n, i, t.y[i], want[i]);
    t.digest = fnv1a(t.y, n * sizeof(unsigned));
    CHECK(cudaFree(t.a));
    CHECK(cudaFree(t.x));
    CHECK(cudaFree(t.y));
}

int main() {
    const int task_count = 40, threads = 4;
    std::vector<task> tasks(task_count);
    rng r(7);
    for (int i = 0; i < task_count; ++i) {
        tasks[i].id = i;
        tasks[i].n = 20 + static_cast<int>(r.u32() % 500);
    }
    CHECK(cudaSetDevice(0));
    std::atomic<int> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            cudaStream_t s;
            CHECK(cudaStreamCreate(&s));
            for (int i; (i = next.fetch_add(1)) < task_count;) run_task(tasks[i], s);
            CHECK(cudaStreamDestroy(s));
        });
    for (auto& t : pool) t.join();
    uint64_t all = 0;
    int on_gpu = 0;
    for (auto& t : tasks) {
        all = fnv1a(&t.digest, sizeof t.digest, all);
        on_gpu += t.n >= 100;
    }
    printf("%d tasks (%d on the GPU) over %d threads with a stream each: ok, digest %016llx\n", task_count,
           on_gpu, threads, static_cast<unsigned long long>(all));
    return pass();
}
