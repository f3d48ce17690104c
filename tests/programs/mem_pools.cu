// mem_pools: stream-ordered allocation and memory pools — cudaMallocAsync/cudaFreeAsync on a stream, the
// device's default and current pools, a pool of its own (attributes, access, trim, cudaMallocFromPoolAsync,
// destroy), kernels and copies on pooled memory, a free of a pointer that is not an allocation, a free of
// NULL, a cudaMalloc allocation freed with cudaFreeAsync. `mem_pools PAUSE_MS`: holds an allocation of the
// default pool (and one freed in stream order, not yet waited for) and one of a pool of its own (its
// attributes set) through a pause, in which a server may suspend or move the session, and checks their
// contents and the pools after it.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void mp_fill(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

static void fill_and_check(int* d, int n, int v, cudaStream_t s, const char* what) {
    mp_fill<<<(n + 255) / 256, 256, 0, s>>>(d, n, v);
    CHECK_LAUNCH();
    std::vector<int> h(n);
    CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) EXPECT(h[i] == v + i, "%s: [%d] = %d, expected %d", what, i, h[i], v + i);
    printf("%s: %d ints ok\n", what, n);
}

// A pool of device 0's memory, as the application makes one.
static cudaMemPoolProps device0_pool() {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    return props;
}

int main(int argc, char** argv) {
    const int pause_ms = argc > 1 ? std::atoi(argv[1]) : 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n = 1 << 20;

    // The default pool, through cudaMallocAsync.
    int* a = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a), n * sizeof(int), s));
    fill_and_check(a, n, 7, s, "cudaMallocAsync");
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaStreamSynchronize(s));

    cudaMemPool_t def = nullptr, cur = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    EXPECT(def && def == cur, "the current pool is not the default one");
    cudaMemPool_t again = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&again, 0));
    EXPECT(again == def, "the default pool changed between two queries");
    uint64_t threshold = 64ull << 20, got = 0;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &got));
    printf("default pool release threshold %llu MiB\n", static_cast<unsigned long long>(got >> 20));
    EXPECT(got == threshold, "release threshold %llu", static_cast<unsigned long long>(got));
    int reuse = -1;
    CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &reuse));
    printf("default pool opportunistic reuse %d\n", reuse);

    // Held through a pause: one allocation written, another freed behind a kernel still queued on the stream.
    int* held = nullptr;
    int* gone = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&held), n * sizeof(int), s));
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&gone), 4096 * sizeof(int), s));
    mp_fill<<<(n + 255) / 256, 256, 0, s>>>(held, n, 21);
    mp_fill<<<16, 256, 0, s>>>(gone, 4096, 5);
    CHECK_LAUNCH();
    CHECK(cudaFreeAsync(gone, s));
    CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &got));
    printf("default pool in use with a held allocation: %s\n",
           got >= n * sizeof(int) ? "at least its size" : "too little");
    // A pool of its own, with an allocation and attributes of its own held through the pause.
    cudaMemPoolProps own = device0_pool();
    cudaMemPool_t kept_pool = nullptr;
    CHECK(cudaMemPoolCreate(&kept_pool, &own));
    uint64_t kept_threshold = 32ull << 20;
    int no = 0;
    CHECK(cudaMemPoolSetAttribute(kept_pool, cudaMemPoolAttrReleaseThreshold, &kept_threshold));
    CHECK(cudaMemPoolSetAttribute(kept_pool, cudaMemPoolReuseAllowOpportunistic, &no));
    int* kept = nullptr;
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&kept), n * sizeof(int), kept_pool, s));
    mp_fill<<<(n + 255) / 256, 256, 0, s>>>(kept, n, 33);
    CHECK_LAUNCH();
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    {
        std::vector<int> k(n);
        CHECK(cudaMemcpyAsync(k.data(), kept, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        int lost = 0;
        for (int i = 0; i < n; ++i) lost += k[i] != 33 + i;
        EXPECT(lost == 0, "the own pool's allocation lost %d of its ints over the pause", lost);
        uint64_t t = 0, in_use = 0;
        int opportunistic = -1;
        CHECK(cudaMemPoolGetAttribute(kept_pool, cudaMemPoolAttrReleaseThreshold, &t));
        CHECK(cudaMemPoolGetAttribute(kept_pool, cudaMemPoolReuseAllowOpportunistic, &opportunistic));
        CHECK(cudaMemPoolGetAttribute(kept_pool, cudaMemPoolAttrUsedMemCurrent, &in_use));
        printf(
            "own pool after the pause: %d ints kept, release threshold %llu MiB, opportunistic reuse %d, in "
            "use %s\n",
            n - lost, static_cast<unsigned long long>(t >> 20), opportunistic,
            in_use >= n * sizeof(int) ? "at least its allocation" : "too little");
        fill_and_check(kept, n, 9, s, "the own pool's allocation written again");
        CHECK(cudaFreeAsync(kept, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemPoolGetAttribute(kept_pool, cudaMemPoolAttrUsedMemCurrent, &in_use));
        printf("own pool in use after its free: %llu\n", static_cast<unsigned long long>(in_use));
        CHECK(cudaMemPoolDestroy(kept_pool));
    }
    std::vector<int> back(n);
    CHECK(cudaMemcpyAsync(back.data(), held, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += back[i] != 21 + i;
    EXPECT(wrong == 0, "the held allocation lost %d of its ints over the pause", wrong);
    printf("held allocation after the pause: %d ints kept\n", n - wrong);
    CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &got));
    printf("default pool in use after the pause: %s\n",
           got >= n * sizeof(int) ? "at least its size" : "too little");
    fill_and_check(held, n, 8, s, "the held allocation written again");
    CHECK(cudaFreeAsync(held, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolTrimTo(def, 0));

    // A pool of our own.
    cudaMemPoolProps props = device0_pool();
    cudaMemPool_t pool = nullptr;
    CHECK(cudaMemPoolCreate(&pool, &props));
    cudaMemAccessDesc desc = {};
    desc.location = props.location;
    desc.flags = cudaMemAccessFlagsProtReadWrite;
    CHECK(cudaMemPoolSetAccess(pool, &desc, 1));
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    cudaMemLocation loc = props.location;
    CHECK(cudaMemPoolGetAccess(&flags, pool, &loc));
    printf("own pool access for device 0: %d\n", static_cast<int>(flags));
    int* b = nullptr;
    int* c = nullptr;
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&b), n * sizeof(int), pool, s));
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&c), 4096 * sizeof(int), pool, s));
    uint64_t used = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("own pool in use with two allocations: %s\n",
           used >= (n + 4096) * sizeof(int) ? "at least their size" : "too little");
    fill_and_check(b, n, -3, s, "cudaMallocFromPoolAsync");
    CHECK(cudaMemcpyAsync(c, b + 1000, 4096 * sizeof(int), cudaMemcpyDeviceToDevice, s));
    std::vector<int> h(4096);
    CHECK(cudaMemcpyAsync(h.data(), c, h.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 4096; ++i) EXPECT(h[i] == -3 + 1000 + i, "pooled device copy [%d] = %d", i, h[i]);
    printf("device-to-device copy between pooled allocations: ok\n");
    CHECK(cudaFreeAsync(b, s));
    CHECK(cudaFree(c));  // cudaFree takes a stream-ordered allocation too
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    // The H200's driver (580.159) still counts the allocation freed with cudaFree (16384 bytes here, after a
    // device synchronize); vcuda's served pool does not.
    printf("own pool in use after the frees: %s\n",
           used <= 4096 * sizeof(int) ? "at most the one freed with cudaFree" : "more");
    CHECK(cudaMemPoolTrimTo(pool, 0));

    // The device's current pool switched to ours and back.
    CHECK(cudaDeviceSetMemPool(0, pool));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    EXPECT(cur == pool, "cudaDeviceSetMemPool did not take");
    int* d = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), 1000 * sizeof(int), s));
    fill_and_check(d, 1000, 11, s, "cudaMallocAsync from the current pool");
    CHECK(cudaFreeAsync(d, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSetMemPool(0, def));
    // CUDA 13's calls by location: the same pools.
    cudaMemLocation dev0 = {};
    dev0.type = cudaMemLocationTypeDevice;
    dev0.id = 0;
    CHECK(cudaMemGetDefaultMemPool(&again, &dev0, cudaMemAllocationTypePinned));
    EXPECT(again == def, "cudaMemGetDefaultMemPool: another pool than the device's default");
    CHECK(cudaMemSetMemPool(&dev0, cudaMemAllocationTypePinned, pool));
    CHECK(cudaMemGetMemPool(&cur, &dev0, cudaMemAllocationTypePinned));
    EXPECT(cur == pool, "cudaMemSetMemPool did not take");
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    EXPECT(cur == pool, "cudaMemSetMemPool did not set the device's current pool");
    CHECK(cudaMemSetMemPool(&dev0, cudaMemAllocationTypePinned, def));
    CHECK(cudaMemGetMemPool(&cur, &dev0, cudaMemAllocationTypePinned));
    EXPECT(cur == def, "cudaMemSetMemPool did not set the default pool back");
    printf("pools by location: the device's default and current pools\n");
    CHECK(cudaMemPoolDestroy(pool));

    // Bad input.
    int not_allocated = 0;
    cudaError_t e = cudaFreeAsync(&not_allocated, s);
    printf("cudaFreeAsync of a host address: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess, "a host address was freed");
    cudaGetLastError();
    // NULL is nothing to free, on a stream as with cudaFree (cuSPARSE's cusparseDestroyCsrilu02Info relies on
    // it).
    CHECK(cudaFreeAsync(nullptr, s));
    CHECK(cudaStreamSynchronize(s));
    printf("cudaFreeAsync of NULL: cudaSuccess\n");
    // An allocation of cudaMalloc freed in stream order, after a kernel on the stream wrote it (cuSPARSE 13
    // frees its SpSV buffers so); freeing it again is refused.
    int* plain = nullptr;
    CHECK(cudaMalloc(&plain, 1 << 20));
    fill_and_check(plain, 1000, 12, s, "cudaMalloc memory before cudaFreeAsync");
    mp_fill<<<1024, 256, 0, s>>>(plain, 1 << 18, 13);
    CHECK_LAUNCH();
    CHECK(cudaFreeAsync(plain, s));
    CHECK(cudaStreamSynchronize(s));
    e = cudaFree(plain);
    EXPECT(e != cudaSuccess, "cudaMalloc memory freed by cudaFreeAsync could be freed again");
    cudaGetLastError();
    printf("cudaFreeAsync of cudaMalloc memory: freed (a second free: %s)\n", cudaGetErrorName(e));
    CHECK(cudaStreamDestroy(s));
    return pass();
}
