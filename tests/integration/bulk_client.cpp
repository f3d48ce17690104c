// A client program for the striped-copy tests (bulk_test.cpp): it loads vcuda's libcuda.so.1 (VCUDA_SERVER
// and VCUDA_BULK_STREAMS come from the environment) and copies through it with the driver API.
//   verify SIZE...    per size: a host-to-device copy checked by reading it back in small copies (which go
//                     on the lane), a device-to-host copy of bytes written in small copies, and an
//                     asynchronous round trip through pinned memory; every byte compared. Ends "PASS verify".
//   bench SIZE REPS   pinned host memory, synchronous copies: "metric htod_gbps X", "metric dtoh_gbps Y".
//   loop SIZE         host-to-device copies until killed; prints "looping" once the first is done.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// clang-format 14 reflows this list differently on each run: left as written.
// clang-format off
#define VCUDA_BULK_CLIENT_API(X)                                                                       \
    X(cuInit)                                                                                          \
    X(cuDeviceGet)                                                                                     \
    X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemcpyHtoD_v2) \
        X(cuMemcpyDtoH_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2) X(cuStreamCreate)           \
            X(cuStreamSynchronize) X(cuStreamDestroy_v2) X(cuMemHostAlloc) X(cuMemFreeHost)            \
                X(cuGetErrorName)
// clang-format on

struct api {
#define X(name) decltype(&::name) name = nullptr;
    VCUDA_BULK_CLIENT_API(X)
#undef X
} cu;

[[noreturn]] void fail(const char* what, CUresult rc, int line) {
    const char* name = "?";
    if (cu.cuGetErrorName) cu.cuGetErrorName(rc, &name);
    std::printf("FAIL %s: %s (%d) at line %d\n", what, name, static_cast<int>(rc), line);
    std::exit(1);
}
#define CHECK(call)                                          \
    do {                                                     \
        CUresult rc_ = (call);                               \
        if (rc_ != CUDA_SUCCESS) fail(#call, rc_, __LINE__); \
    } while (0)

// Bytes that differ at every position and from one seed to another.
void fill(unsigned char* p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = static_cast<unsigned char>(x >> 32);
    }
}

void same(const unsigned char* got, const unsigned char* want, size_t n, const char* what) {
    if (std::memcmp(got, want, n) == 0) return;
    size_t i = 0;
    while (got[i] == want[i]) ++i;
    std::printf("FAIL %s: %zu bytes differ from byte %zu on\n", what, n, i);
    std::exit(1);
}

// Small copies travel on the lane, never striped (client/copy_paths.cpp: striped_threshold).
constexpr size_t small = 1u << 20;

void verify(size_t n) {
    std::vector<unsigned char> a(n), b(n), back(n);
    fill(a.data(), n, n);
    fill(b.data(), n, n + 1);
    CUdeviceptr d;
    CHECK(cu.cuMemAlloc_v2(&d, n));
    // Host to device, striped; read back on the lane.
    CHECK(cu.cuMemcpyHtoD_v2(d, a.data(), n));
    for (size_t off = 0; off < n; off += small)
        CHECK(cu.cuMemcpyDtoH_v2(back.data() + off, d + off, std::min(small, n - off)));
    same(back.data(), a.data(), n, "host to device");
    // Device to host, striped, of bytes written on the lane.
    for (size_t off = 0; off < n; off += small)
        CHECK(cu.cuMemcpyHtoD_v2(d + off, b.data() + off, std::min(small, n - off)));
    CHECK(cu.cuMemcpyDtoH_v2(back.data(), d, n));
    same(back.data(), b.data(), n, "device to host");
    // The asynchronous forms, pinned memory, one stream.
    void *pin_in, *pin_out;
    CHECK(cu.cuMemHostAlloc(&pin_in, n, 0));
    CHECK(cu.cuMemHostAlloc(&pin_out, n, 0));
    fill(static_cast<unsigned char*>(pin_in), n, n + 2);
    std::memset(pin_out, 0, n);
    CUstream s;
    CHECK(cu.cuStreamCreate(&s, 0));
    CHECK(cu.cuMemcpyHtoDAsync_v2(d, pin_in, n, s));
    CHECK(cu.cuMemcpyDtoHAsync_v2(pin_out, d, n, s));
    CHECK(cu.cuStreamSynchronize(s));
    same(static_cast<unsigned char*>(pin_out), static_cast<unsigned char*>(pin_in), n,
         "asynchronous round trip");
    CHECK(cu.cuStreamDestroy_v2(s));
    CHECK(cu.cuMemFreeHost(pin_in));
    CHECK(cu.cuMemFreeHost(pin_out));
    CHECK(cu.cuMemFree_v2(d));
    std::printf("verified %zu bytes\n", n);
}

void bench(size_t n, int reps) {
    void* h;
    CHECK(cu.cuMemHostAlloc(&h, n, 0));
    std::memset(h, 1, n);
    CUdeviceptr d;
    CHECK(cu.cuMemAlloc_v2(&d, n));
    CHECK(cu.cuMemcpyHtoD_v2(d, h, n));  // warm: connections, staging buffers
    CHECK(cu.cuMemcpyDtoH_v2(h, d, n));
    using clk = std::chrono::steady_clock;
    auto t0 = clk::now();
    for (int i = 0; i < reps; ++i) CHECK(cu.cuMemcpyHtoD_v2(d, h, n));
    double up = std::chrono::duration<double>(clk::now() - t0).count();
    t0 = clk::now();
    for (int i = 0; i < reps; ++i) CHECK(cu.cuMemcpyDtoH_v2(h, d, n));
    double down = std::chrono::duration<double>(clk::now() - t0).count();
    std::printf("metric htod_gbps %.2f GB/s\nmetric dtoh_gbps %.2f GB/s\n", n * reps / up / 1e9,
                n * reps / down / 1e9);
}

void loop(size_t n) {
    std::vector<unsigned char> a(n, 7);
    CUdeviceptr d;
    CHECK(cu.cuMemAlloc_v2(&d, n));
    for (bool first = true;; first = false) {
        CHECK(cu.cuMemcpyHtoD_v2(d, a.data(), n));
        if (first) {
            std::printf("looping\n");
            std::fflush(stdout);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s verify SIZE... | bench SIZE REPS | loop SIZE\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(VCUDA_CLIENT_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::printf("FAIL dlopen: %s\n", dlerror());
        return 1;
    }
#define X(name) cu.name = reinterpret_cast<decltype(cu.name)>(dlsym(lib, #name));
    VCUDA_BULK_CLIENT_API(X)
#undef X
    CHECK(cu.cuInit(0));
    CUdevice dev;
    CHECK(cu.cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cu.cuCtxSetCurrent(ctx));
    std::string mode = argv[1];
    if (mode == "verify") {
        for (int i = 2; i < argc; ++i) verify(std::strtoull(argv[i], nullptr, 10));
        std::printf("PASS verify\n");
    } else if (mode == "bench" && argc == 4) {
        bench(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
    } else if (mode == "loop") {
        loop(std::strtoull(argv[2], nullptr, 10));
    } else {
        std::fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
