// multi_thread: four std::threads share the device, each with streams of its own. Thread 0 launches a kernel
// that spins for 400 ms and blocks in cudaStreamSynchronize on it; threads 1-3, started once the spin kernel
// is queued (their streams and buffers made before), each run 30 rounds of copy in / kernel / copy out /
// synchronize on their two streams and check every result. A blocking synchronize in one thread must not
// stall the others: they finish before it. Usage: multi_thread [SPIN_MS [serial]]   (default 400). `serial`:
// the driver runs each kernel inside its launch call (CI's software driver), so the long kernel holds up
// whatever is ordered after its launch — with vcuda, every later call of the other threads (calls keep their
// order across threads). Then the overlap is only reported; on a GPU it is required.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

// Spins (on the device's global timer) for `ns` nanoseconds, then sets *flag.
extern "C" __global__ void mt_spin(unsigned long long ns, int* flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do {
            __nanosleep(10000);
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now - start < ns);
        *flag = 1;
    }
}

extern "C" __global__ void mt_work(int* d, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = d[i] * 2 + k;
}

using clock_type = std::chrono::steady_clock;

struct worker_result {
    int rounds_ok = 0;
    clock_type::time_point done;
    char error[256] = {};
};

static const int rounds = 30, n = 1 << 16;
static unsigned long long spin_ns = 400ull * 1000 * 1000;  // argv[1] in ms overrides (slow CI machines)
static std::atomic<int> workers_ready{0};
static std::atomic<bool> spin_queued{false};
static std::atomic<bool> long_finished{false};

static void worker(int id, worker_result* res) {
    CHECK(cudaSetDevice(0));
    cudaStream_t st[2];
    int* h[2];
    int* d[2];
    for (int k = 0; k < 2; ++k) {
        CHECK(cudaStreamCreateWithFlags(&st[k], cudaStreamNonBlocking));
        CHECK(cudaMallocHost(&h[k], n * sizeof(int)));
        CHECK(cudaMalloc(&d[k], n * sizeof(int)));
    }
    // Everything allocated and created before the spin kernel starts; then wait for it to be queued.
    workers_ready.fetch_add(1);
    while (!spin_queued.load()) std::this_thread::yield();
    for (int r = 0; r < rounds; ++r) {
        for (int k = 0; k < 2; ++k) {
            for (int i = 0; i < n; ++i) h[k][i] = i + id * 1000 + r * 10 + k;
            CHECK(cudaMemcpyAsync(d[k], h[k], n * sizeof(int), cudaMemcpyHostToDevice, st[k]));
            mt_work<<<n / 256, 256, 0, st[k]>>>(d[k], n, id);
            CHECK_LAUNCH();
            CHECK(cudaMemcpyAsync(h[k], d[k], n * sizeof(int), cudaMemcpyDeviceToHost, st[k]));
        }
        for (int k = 0; k < 2; ++k) {
            CHECK(cudaStreamSynchronize(st[k]));
            for (int i = 0; i < n; ++i) {
                int want = (i + id * 1000 + r * 10 + k) * 2 + id;
                if (h[k][i] != want) {
                    snprintf(res->error, sizeof res->error,
                             "thread %d round %d stream %d: [%d] = %d, expected %d", id, r, k, i, h[k][i],
                             want);
                    res->done = clock_type::now();
                    return;
                }
            }
        }
        ++res->rounds_ok;
    }
    res->done = clock_type::now();
    // cudaFree synchronizes the device, and while it waits on the spin kernel the driver holds a lock that
    // blocks every other thread's calls: free only once the long synchronize has returned.
    while (!long_finished.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int k = 0; k < 2; ++k) {
        CHECK(cudaStreamDestroy(st[k]));
        CHECK(cudaFreeHost(h[k]));
        CHECK(cudaFree(d[k]));
    }
}

int main(int argc, char** argv) {
    if (argc > 1) spin_ns = strtoull(argv[1], nullptr, 10) * 1000ull * 1000ull;
    const bool serial_driver = argc > 2 && std::string(argv[2]) == "serial";
    // Load the module and touch both kernels before any thread starts: with lazy loading, loading a kernel
    // while another one runs may wait for it, which is not what this program measures.
    int* flag;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    mt_spin<<<1, 1>>>(0, flag);
    CHECK_LAUNCH();
    mt_work<<<1, 32>>>(flag, 0, 0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemset(flag, 0, sizeof(int)));

    worker_result res[4];
    clock_type::time_point long_start, long_done;
    int long_flag = 0;
    std::thread spinner([&] {
        CHECK(cudaSetDevice(0));
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        while (workers_ready.load() < 3) std::this_thread::yield();
        long_start = clock_type::now();
        mt_spin<<<1, 1, 0, s>>>(spin_ns, flag);
        CHECK_LAUNCH();
        spin_queued.store(true);
        CHECK(cudaStreamSynchronize(s));
        long_done = clock_type::now();
        long_finished.store(true);
        CHECK(cudaMemcpy(&long_flag, flag, sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(cudaStreamDestroy(s));
    });
    std::vector<std::thread> workers;
    for (int id = 1; id <= 3; ++id) workers.emplace_back(worker, id, &res[id]);
    for (auto& t : workers) t.join();
    spinner.join();

    using ms = std::chrono::duration<double, std::milli>;
    double long_ms = ms(long_done - long_start).count();
    printf("info: long synchronize returned after %.1f ms\n", long_ms);
    printf("long kernel flag: %d\n", long_flag);
    EXPECT(long_flag == 1, "the spin kernel did not finish");
    EXPECT(long_ms >= spin_ns / 1e6 * 0.9,
           "cudaStreamSynchronize returned after %.1f ms, before the kernel's %llu ms", long_ms,
           spin_ns / 1000000);
    bool all_before = true;
    for (int id = 1; id <= 3; ++id) {
        if (res[id].error[0]) fail("%s", res[id].error);
        printf("thread %d: %d rounds ok\n", id, res[id].rounds_ok);
        printf("info: thread %d finished %.1f ms after the long launch\n", id,
               ms(res[id].done - long_start).count());
        EXPECT(res[id].rounds_ok == rounds, "thread %d: %d rounds", id, res[id].rounds_ok);
        if (res[id].done >= long_done) all_before = false;
    }
    printf("the other threads finished before the long synchronize returned: %s\n",
           all_before ? "yes" : "no");
    if (!serial_driver)
        EXPECT(all_before,
               "a thread finished after the long synchronize: one thread's blocking synchronize stalled the "
               "others");
    CHECK(cudaFree(flag));
    return pass();
}
