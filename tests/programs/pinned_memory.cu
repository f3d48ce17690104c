// pinned_memory: page-locked host memory from cudaMallocHost, cudaHostAlloc with each flag, and
// cudaHostRegister on ordinary memory; each used as source and destination of sync and async copies around
// a kernel, and classified by cudaPointerGetAttributes. (No kernel reads host memory directly: zero-copy
// access is not part of what these programs exercise.)
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

extern "C" __global__ void pm_negate(int* d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = -d[i] + i;
}

static const char* type_name(cudaMemoryType t) {
    switch (t) {
        case cudaMemoryTypeUnregistered:
            return "unregistered";
        case cudaMemoryTypeHost:
            return "host";
        case cudaMemoryTypeDevice:
            return "device";
        case cudaMemoryTypeManaged:
            return "managed";
    }
    return "?";
}

static void describe(const char* what, const void* p) {
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        printf("%s: cudaPointerGetAttributes = %s\n", what, cudaGetErrorName(e));
        (void)cudaGetLastError();
        return;
    }
    printf("%s: type %s", what, type_name(a.type));
    if (a.type == cudaMemoryTypeHost) printf(", hostPointer == p: %s", a.hostPointer == p ? "yes" : "no");
    if (a.type == cudaMemoryTypeDevice)
        printf(", device %d, devicePointer == p: %s", a.device, a.devicePointer == p ? "yes" : "no");
    printf("\n");
}

// Round trip through the device: host src -> device -> kernel -> host dst, sync or async.
static void round_trip(const char* what, int* src, int* dst, int n, int* d, cudaStream_t s, bool async) {
    for (int i = 0; i < n; ++i) src[i] = i * 5 + 1;
    memset(dst, 0, n * sizeof(int));
    if (async) {
        CHECK(cudaMemcpyAsync(d, src, n * sizeof(int), cudaMemcpyHostToDevice, s));
        pm_negate<<<(n + 255) / 256, 256, 0, s>>>(d, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(dst, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
    } else {
        CHECK(cudaMemcpy(d, src, n * sizeof(int), cudaMemcpyHostToDevice));
        pm_negate<<<(n + 255) / 256, 256>>>(d, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(dst, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    }
    for (int i = 0; i < n; ++i)
        if (dst[i] != -(i * 5 + 1) + i)
            fail("%s (%s): dst[%d] = %d", what, async ? "async" : "sync", i, dst[i]);
    printf("%s: %s round trip ok\n", what, async ? "async" : "sync");
}

int main() {
    const int n = 3 << 20;  // 12 MiB of ints
    const size_t bytes = size_t(n) * sizeof(int);
    int* d;
    CHECK(cudaMalloc(&d, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    describe("cudaMalloc", d);

    // cudaMallocHost
    int *a, *b;
    CHECK(cudaMallocHost(&a, bytes));
    CHECK(cudaMallocHost(&b, bytes));
    describe("cudaMallocHost", a);
    round_trip("cudaMallocHost", a, b, n, d, s, false);
    round_trip("cudaMallocHost", a, b, n, d, s, true);

    // cudaHostAlloc with each flag; the destination is always an ordinary pinned buffer (b), except for
    // write-combined memory, which is only written by the host (reading it is slow) and used as a source.
    const struct {
        const char* name;
        unsigned flags;
    } kinds[] = {
        {"cudaHostAllocDefault", cudaHostAllocDefault},
        {"cudaHostAllocPortable", cudaHostAllocPortable},
        {"cudaHostAllocMapped", cudaHostAllocMapped},
        {"cudaHostAllocWriteCombined", cudaHostAllocWriteCombined},
        {"cudaHostAllocPortable|Mapped", cudaHostAllocPortable | cudaHostAllocMapped},
    };
    for (const auto& k : kinds) {
        int* h = nullptr;
        CHECK(cudaHostAlloc(&h, bytes, k.flags));
        describe(k.name, h);
        cudaPointerAttributes attr{};
        CHECK(cudaPointerGetAttributes(&attr, h));
        EXPECT(attr.type == cudaMemoryTypeHost, "%s: not host memory (type %d)", k.name,
               static_cast<int>(attr.type));
        round_trip(k.name, h, b, n, d, s, false);
        round_trip(k.name, h, b, n, d, s, true);
        if (!(k.flags & cudaHostAllocWriteCombined)) round_trip(k.name, b, h, n, d, s, true);
        CHECK(cudaFreeHost(h));
    }

    // cudaHostRegister of ordinary, page-aligned memory, with default and portable flags.
    const unsigned reg_flags[] = {cudaHostRegisterDefault, cudaHostRegisterPortable};
    for (unsigned f : reg_flags) {
        const char* name =
            f == cudaHostRegisterDefault ? "cudaHostRegisterDefault" : "cudaHostRegisterPortable";
        void* raw = aligned_alloc(4096, bytes);
        EXPECT(raw != nullptr, "aligned_alloc failed");
        int* r = static_cast<int*>(raw);
        describe("malloc before cudaHostRegister", r);
        CHECK(cudaHostRegister(r, bytes, f));
        describe(name, r);
        round_trip(name, r, b, n, d, s, true);
        round_trip(name, b, r, n, d, s, true);
        round_trip(name, r, b, n, d, s, false);
        CHECK(cudaHostUnregister(r));
        describe("after cudaHostUnregister", r);
        free(raw);
    }

    // Memsets of pinned host memory (unified addressing: the device sets it; XLA clears small pinned buffers
    // so), in stream order after a copy into it.
    {
        unsigned* h = nullptr;
        CHECK(cudaHostAlloc(&h, 64 * sizeof(unsigned), cudaHostAllocPortable));
        for (int i = 0; i < 64; ++i) h[i] = 0xdeadbeefu;
        CHECK(cudaMemcpyAsync(h, d, 16 * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
        CHECK(cudaMemsetAsync(h + 8, 0x5a, 8 * sizeof(unsigned), s));
        CHECK(cudaMemset2DAsync(h + 32, 8 * sizeof(unsigned), 0x3c, 4 * sizeof(unsigned), 2,
                                s));  // 2 rows of 4
        CHECK(cudaStreamSynchronize(s));
        std::vector<int> first(16);
        CHECK(cudaMemcpy(first.data(), d, 16 * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < 64; ++i) {
            unsigned want = i < 8                                        ? static_cast<unsigned>(first[i])
                            : i < 16                                     ? 0x5a5a5a5au
                            : (i >= 32 && i < 36) || (i >= 40 && i < 44) ? 0x3c3c3c3cu
                                                                         : 0xdeadbeefu;
            if (h[i] != want) fail("pinned memset: [%d] = %#x, expected %#x", i, h[i], want);
        }
        printf("memsets of pinned host memory (1D and 2D, in stream order): ok\n");
        CHECK(cudaFreeHost(h));
    }

    // Plain pageable memory as the baseline.
    {
        std::vector<int> p(n), q(n);
        describe("pageable", p.data());
        round_trip("pageable", p.data(), q.data(), n, d, s, false);
        round_trip("pageable", p.data(), q.data(), n, d, s, true);
    }

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(a));
    CHECK(cudaFreeHost(b));
    CHECK(cudaFree(d));
    return pass();
}
