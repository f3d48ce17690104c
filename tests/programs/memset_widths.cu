// memset_widths: the runtime's memsets — cudaMemset (byte values at odd offsets and lengths),
// cudaMemsetAsync, cudaMemset2D and cudaMemset2DAsync on pitched memory — checked on the host after a copy
// back and on the device by a kernel that counts mismatches. The runtime only exposes byte memsets; the 16-
// and 32-bit widths are exercised through the driver API by driver_memset.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// Counts the bytes of [p, p + n) that differ from v.
extern "C" __global__ void mw_count_mismatch(const unsigned char* p, unsigned long long n, unsigned char v,
                                             unsigned long long* count) {
    unsigned long long local = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        local += p[i] != v;
    if (local) atomicAdd(count, local);
}

static unsigned long long* d_count;

static unsigned long long device_mismatches(const void* p, size_t n, unsigned char v) {
    CHECK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
    mw_count_mismatch<<<120, 256>>>(static_cast<const unsigned char*>(p), n, v, d_count);
    CHECK_LAUNCH();
    unsigned long long c = 0;
    CHECK(cudaMemcpy(&c, d_count, sizeof c, cudaMemcpyDeviceToHost));
    return c;
}

int main() {
    CHECK(cudaMalloc(&d_count, sizeof(unsigned long long)));
    const size_t n = (8 << 20) + 77;
    unsigned char* d;
    CHECK(cudaMalloc(&d, n));
    std::vector<unsigned char> h(n);

    // Whole buffer, then sub-ranges at odd offsets: everything outside a range keeps its old value.
    CHECK(cudaMemset(d, 0xAB, n));
    EXPECT(device_mismatches(d, n, 0xAB) == 0, "cudaMemset(0xAB) not seen by the kernel");
    CHECK(cudaMemset(d + 3, 0x5A, 1001));
    CHECK(cudaMemset(d + 4096 + 1, 0x00, 65535));
    CHECK(cudaMemset(d + n - 5, 0xFF, 5));
    CHECK(cudaMemset(d + 100, 0x11, 0));  // zero bytes: a no-op
    CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {
        unsigned char want = 0xAB;
        if (i >= 3 && i < 3 + 1001) want = 0x5A;
        if (i >= 4097 && i < 4097 + 65535) want = 0x00;
        if (i >= n - 5) want = 0xFF;
        if (h[i] != want) fail("cudaMemset: byte %zu = %#x, expected %#x", i, h[i], want);
    }
    EXPECT(device_mismatches(d + 3, 1001, 0x5A) == 0, "kernel sees a wrong sub-range");
    EXPECT(device_mismatches(d + 4097, 65535, 0x00) == 0, "kernel sees a wrong zeroed range");
    printf("cudaMemset: whole buffer and 4 sub-ranges ok\n");
    printf("mismatches of 0xAB over the whole buffer: %llu\n", device_mismatches(d, n, 0xAB));

    // int-typed view: cudaMemset sets bytes, so 0x01 gives 0x01010101.
    {
        int* di;
        CHECK(cudaMalloc(&di, 1024 * sizeof(int)));
        CHECK(cudaMemset(di, 0x01, 1024 * sizeof(int)));
        std::vector<int> hi(1024);
        CHECK(cudaMemcpy(hi.data(), di, 1024 * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < 1024; ++i) EXPECT(hi[i] == 0x01010101, "int view [%d] = %#x", i, hi[i]);
        printf("cudaMemset on ints gives 0x%08x\n", hi[0]);
        CHECK(cudaFree(di));
    }

    // Async memsets in one stream, in order: the last one wins where they overlap.
    {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaMemsetAsync(d, 0x33, n, s));
        CHECK(cudaMemsetAsync(d + 1000, 0x44, 5000, s));
        CHECK(cudaMemsetAsync(d + 3000, 0x55, 10, s));
        CHECK(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (size_t i = 0; i < n; ++i) {
            unsigned char want = 0x33;
            if (i >= 1000 && i < 6000) want = 0x44;
            if (i >= 3000 && i < 3010) want = 0x55;
            if (h[i] != want) fail("cudaMemsetAsync: byte %zu = %#x, expected %#x", i, h[i], want);
        }
        printf("cudaMemsetAsync: 3 overlapping memsets in stream order ok\n");
        CHECK(cudaStreamDestroy(s));
    }

    // 2D: only width bytes of each row are set; the pitch padding keeps its value.
    {
        const size_t width = 1000, height = 57;
        unsigned char* p;
        size_t pitch = 0;
        CHECK(cudaMallocPitch(&p, &pitch, width, height));
        printf("cudaMallocPitch(%zu, %zu): pitch %zu\n", width, height, pitch);
        EXPECT(pitch >= width, "pitch %zu < width", pitch);
        CHECK(cudaMemset(p, 0xC3, pitch * height));
        CHECK(cudaMemset2D(p, pitch, 0x3C, width, height));
        CHECK(cudaMemset2D(p + 10 * pitch + 100, pitch, 0x77, 300, 20));
        std::vector<unsigned char> hp(pitch * height);
        CHECK(cudaMemcpy(hp.data(), p, pitch * height, cudaMemcpyDeviceToHost));
        for (size_t y = 0; y < height; ++y)
            for (size_t x = 0; x < pitch; ++x) {
                unsigned char want = x < width ? 0x3C : 0xC3;
                if (y >= 10 && y < 30 && x >= 100 && x < 400) want = 0x77;
                if (hp[y * pitch + x] != want)
                    fail("cudaMemset2D: (%zu, %zu) = %#x, expected %#x", x, y, hp[y * pitch + x], want);
            }
        for (size_t y = 0; y < height; ++y)
            if (y < 10 || y >= 30)
                EXPECT(device_mismatches(p + y * pitch, width, 0x3C) == 0, "kernel: row %zu", y);
        printf("cudaMemset2D: rows, padding and a sub-rectangle ok\n");

        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaMemset2DAsync(p, pitch, 0x99, width / 2, height, s));
        CHECK(cudaMemcpy2DAsync(hp.data(), width, p, pitch, width, height, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (size_t y = 0; y < height; ++y)
            for (size_t x = 0; x < width; ++x) {
                unsigned char want = x < width / 2 ? 0x99 : 0x3C;
                if (x >= width / 2 && y >= 10 && y < 30 && x >= 100 && x < 400) want = 0x77;
                if (hp[y * width + x] != want)
                    fail("cudaMemset2DAsync: (%zu, %zu) = %#x, expected %#x", x, y, hp[y * width + x], want);
            }
        printf("cudaMemset2DAsync: ok\n");
        CHECK(cudaStreamDestroy(s));
        CHECK(cudaFree(p));
    }

    CHECK(cudaFree(d));
    CHECK(cudaFree(d_count));
    return pass();
}
