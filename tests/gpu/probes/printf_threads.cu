// A probe of the real driver, run natively (no vcuda): on which thread does the driver write what kernels
// printed? The server gives device printf to the client of the thread that wrote it
// (server/device_output.cpp), which is right only if the driver writes a context's lines on a thread whose
// call synchronized with that context. Each case runs a kernel printing `lines` lines in context A and then
// has some thread call the driver; stdout is replaced by a stream that counts the lines each named thread
// wrote. Cases:
//   1 other_ctx_sync:    another thread syncs and copies in context B while A's kernel has finished
//   2 other_ctx_destroy: another thread destroys context B then
//   3 same_ctx_thread:   another thread, A current, copies from A (the launching thread has not synchronized)
//   4 fresh_thread_sync: a new thread, A current, calls cuCtxSynchronize (as a suspend's helper would)
//   5 launcher_sync:     the launching thread synchronizes (the ordinary case)
// Each case ends with the launching thread synchronizing, so that any line not yet written is written then.
//   nvcc -o printf_threads printf_threads.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

__global__ void pt_lines(int n) {
    for (int i = 0; i < n; ++i) printf("probe line %d\n", i);
}

static std::mutex counts_mu;
static std::map<std::string, int> counts;
static thread_local const char* who = "unnamed";

static ssize_t count_lines(void*, const char* buf, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; ++i) k += buf[i] == '\n';
    std::lock_guard lock(counts_mu);
    counts[who] += k;
    return static_cast<ssize_t>(n);
}

#define CK(x)                                                   \
    do {                                                        \
        int r_ = static_cast<int>(x);                           \
        if (r_) {                                               \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); \
            _exit(1);                                           \
        }                                                       \
    } while (0)

static void report(const char* name) {
    std::lock_guard lock(counts_mu);
    fprintf(stderr, "%-18s", name);
    for (auto& [t, n] : counts) fprintf(stderr, " %s=%d", t.c_str(), n);
    fprintf(stderr, "\n");
    counts.clear();
}

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
    for (int c = 1; c <= 5; ++c) {
        CUcontext a, b;
        CK(cuCtxCreate(&a, nullptr, 0, dev));
        CK(cuCtxCreate(&b, nullptr, 0, dev));
        CUdeviceptr pa, pb;
        CK(cuCtxSetCurrent(b));
        CK(cuMemAlloc(&pb, 64));
        CK(cuCtxSetCurrent(a));
        CK(cuMemAlloc(&pa, 64));
        pt_lines<<<1, 1>>>(lines);
        CK(cudaGetLastError());
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the kernel is done by then
        const char* name = "";
        std::thread other([&] {
            char buf[64];
            switch (c) {
                case 1:
                    who = "other_ctx_B";
                    name = "other_ctx_sync";
                    CK(cuCtxSetCurrent(b));
                    CK(cuCtxSynchronize());
                    CK(cuMemcpyDtoH(buf, pb, 64));
                    break;
                case 2:
                    who = "other_ctx_B";
                    name = "other_ctx_destroy";
                    CK(cuCtxDestroy(b));
                    b = nullptr;
                    break;
                case 3:
                    who = "other_thread_A";
                    name = "same_ctx_thread";
                    CK(cuCtxSetCurrent(a));
                    CK(cuMemcpyDtoH(buf, pa, 64));
                    break;
                case 4:
                    who = "fresh_thread_A";
                    name = "fresh_thread_sync";
                    CK(cuCtxSetCurrent(a));
                    CK(cuCtxSynchronize());
                    break;
                default:
                    name = "launcher_sync";
                    break;
            }
        });
        other.join();
        CK(cuCtxSetCurrent(a));
        CK(cuCtxSynchronize());
        report(name);
        CK(cuCtxDestroy(a));
        if (b) CK(cuCtxDestroy(b));
    }
    return 0;
}
