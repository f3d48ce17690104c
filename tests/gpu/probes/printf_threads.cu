// A probe of the real driver, run natively (no vcuda): on which thread does the driver write what kernels
// printed? The server gives device printf to the client of the thread that wrote it
// (server/device_output.cpp), which is right only if the driver writes a context's lines on a thread whose
// call synchronized with that context. Each case launches a kernel printing `lines` lines in context A, waits
// `delay` ms (the kernel takes about 1 ms), then has one thread synchronize context A:
//   launcher: the thread that launched; seasoned: a thread that has made driver calls before; fresh: a new
//   thread whose first driver call this is (as a suspend's helper thread); other_ctx: a new thread that
//   synchronizes another context, B, and never A (does a synchronize take another context's lines?).
// stdout is replaced by a stream that counts the lines each named thread wrote; "driver" is any thread this
// program did not start.
// Session 25 (one H200, driver 580.159), call 3: with a delay of 0 or 5 ms, all 200 lines on the
// synchronizing thread whichever it was; at 20 ms on it for the launcher and the seasoned thread, on the
// driver's for the fresh one; at 100 and 300 ms all 200 on the driver's own thread for every syncing thread.
// (Call 2, an earlier form of this probe with a 300 ms delay and syncs by other contexts and threads: every
// line on the driver's thread.) Session 26, call 1, the other_ctx case: at every delay (0 to 300 ms) all 200
// lines on the driver's own thread, none on the thread that synchronized context B (the other cases as
// before).
//   nvcc -o printf_threads printf_threads.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

__global__ void pt_lines(int n) {
    for (int i = 0; i < n; ++i) printf("probe line %d\n", i);
}

static std::mutex counts_mu;
static std::map<std::string, int> counts;
static thread_local const char* who = "driver";

static ssize_t count_lines(void*, const char* buf, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; ++i) k += buf[i] == '\n';
    std::lock_guard lock(counts_mu);
    counts[who] += k;
    return static_cast<ssize_t>(n);
}

#define CK(x)                                                                \
    do {                                                                     \
        int r_ = static_cast<int>(x);                                        \
        if (r_) {                                                            \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); \
            _exit(1);                                                        \
        }                                                                    \
    } while (0)

// A thread that runs jobs one at a time and stays: it has made driver calls before each new job.
class seasoned_thread {
  public:
    seasoned_thread() : t_([this] { loop(); }) {}
    ~seasoned_thread() {
        run(nullptr);
        t_.join();
    }
    void run(std::function<void()> job) {
        std::unique_lock lock(mu_);
        job_ = std::move(job);
        has_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !has_; });
    }

  private:
    void loop() {
        who = "seasoned";
        for (;;) {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return has_; });
            auto job = std::move(job_);
            if (!job) {
                has_ = false;
                cv_.notify_all();
                return;
            }
            job();
            has_ = false;
            cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> job_;
    bool has_ = false;
    std::thread t_;
};

int main(int argc, char** argv) {
    const int lines = argc > 1 ? atoi(argv[1]) : 200;
    cookie_io_functions_t io{nullptr, count_lines, nullptr, nullptr};
    FILE* f = fopencookie(nullptr, "w", io);
    setvbuf(f, nullptr, _IONBF, 0);
    stdout = f;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    who = "launcher";
    CUcontext a, b;
    CK(cuCtxCreate(&b, nullptr, 0, dev));
    CK(cuCtxCreate(&a, nullptr, 0, dev));
    CK(cuCtxSetCurrent(a));
    seasoned_thread seasoned;
    seasoned.run([&] {
        CK(cuCtxSetCurrent(a));
        CK(cuCtxSynchronize());
    });
    for (int delay : {0, 5, 20, 100, 300})
        for (const char* by : {"launcher", "seasoned", "fresh", "other_ctx"}) {
            pt_lines<<<1, 1>>>(lines);
            CK(cudaGetLastError());
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            auto sync = [&] {
                CK(cuCtxSetCurrent(a));
                CK(cuCtxSynchronize());
            };
            if (by[0] == 'l') sync();
            if (by[0] == 's') seasoned.run(sync);
            if (by[0] == 'f')
                std::thread([&] {
                    who = "fresh";
                    sync();
                }).join();
            if (by[0] == 'o')
                std::thread([&] {
                    who = "other_ctx";
                    CK(cuCtxSetCurrent(b));
                    CK(cuCtxSynchronize());
                }).join();
            std::this_thread::sleep_for(std::chrono::milliseconds(400));  // anything left is written by then
            std::lock_guard lock(counts_mu);
            fprintf(stderr, "delay %3d ms, synchronized by %-8s:", delay, by);
            for (auto& [t, n] : counts) fprintf(stderr, " %s=%d", t.c_str(), n);
            fprintf(stderr, "\n");
            counts.clear();
        }
    CK(cuCtxDestroy(a));
    CK(cuCtxDestroy(b));
    return 0;
}
