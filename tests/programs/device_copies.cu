// device_copies: device-to-device copies — cudaMemcpy DeviceToDevice between allocations and within one
// (disjoint ranges, odd offsets and lengths), cudaMemcpyAsync DeviceToDevice on a stream, cudaMemcpyDefault
// (direction inferred from unified addresses) in all three directions, and 1,000 small async DtoD copies;
// results checked on the host and by a kernel checksum on the device.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// Sum of 32-bit words (as unsigned 64-bit) and of their index-weighted values: order-independent.
extern "C" __global__ void dc_checksum(const unsigned* p, unsigned long long n, unsigned long long* out) {
    unsigned long long s = 0, ws = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        s += p[i];
        ws += p[i] * (i + 1);
    }
    atomicAdd(&out[0], s);
    atomicAdd(&out[1], ws);
}

static void host_checksum(const unsigned* p, size_t n, unsigned long long out[2]) {
    out[0] = out[1] = 0;
    for (size_t i = 0; i < n; ++i) {
        out[0] += p[i];
        out[1] += p[i] * (unsigned long long)(i + 1);
    }
}

static unsigned long long* d_sums;

static void device_checksum(const unsigned* p, size_t n, unsigned long long out[2]) {
    CHECK(cudaMemset(d_sums, 0, 2 * sizeof(unsigned long long)));
    dc_checksum<<<96, 256>>>(p, n, d_sums);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out, d_sums, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
}

int main() {
    CHECK(cudaMalloc(&d_sums, 2 * sizeof(unsigned long long)));
    const size_t n = 16 << 20;  // 64 MiB of words
    const size_t bytes = n * sizeof(unsigned);
    std::vector<unsigned> h(n), back(n);
    rng r(2024);
    for (auto& v : h) v = r.u32();

    unsigned *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemcpy(a, h.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    unsigned long long hs[2], ds[2];
    host_checksum(h.data(), n, hs);
    device_checksum(b, n, ds);
    EXPECT(hs[0] == ds[0] && hs[1] == ds[1], "checksum after DtoD: device %llx/%llx, host %llx/%llx", ds[0],
           ds[1], hs[0], hs[1]);
    printf("64 MiB DtoD: checksum %016llx %016llx\n", ds[0], ds[1]);

    // Within one allocation, byte-granular: b[1 .. 1+L) <- a-bytes at offset 7 + 3 MiB (disjoint ranges of
    // b).
    {
        unsigned char* bb = reinterpret_cast<unsigned char*>(b);
        const size_t L = (1 << 20) + 13;
        CHECK(cudaMemcpy(bb + (3 << 20) + 7, bb + 1, L, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy(back.data(), b, bytes, cudaMemcpyDeviceToHost));
        std::vector<unsigned char> want(reinterpret_cast<unsigned char*>(h.data()),
                                        reinterpret_cast<unsigned char*>(h.data()) + bytes);
        for (size_t i = 0; i < L; ++i) want[(3 << 20) + 7 + i] = want[1 + i];
        const unsigned char* got = reinterpret_cast<const unsigned char*>(back.data());
        for (size_t i = 0; i < bytes; ++i)
            if (got[i] != want[i])
                fail("DtoD within an allocation: byte %zu = %#x, expected %#x", i, got[i], want[i]);
        printf("DtoD within one allocation at odd offsets: ok\n");
        CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // restore
    }

    // Async DtoD on a stream, then a kernel on the same stream reads the copy.
    {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        unsigned* c;
        CHECK(cudaMalloc(&c, bytes / 2));
        CHECK(cudaMemcpyAsync(c, b + n / 2, bytes / 2, cudaMemcpyDeviceToDevice, s));
        CHECK(cudaMemsetAsync(d_sums, 0, 2 * sizeof(unsigned long long), s));
        dc_checksum<<<96, 256, 0, s>>>(c, n / 2, d_sums);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(ds, d_sums, sizeof ds, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        host_checksum(h.data() + n / 2, n / 2, hs);
        EXPECT(hs[0] == ds[0] && hs[1] == ds[1], "async DtoD checksum differs");
        printf("async DtoD + kernel in stream order: checksum %016llx %016llx\n", ds[0], ds[1]);
        CHECK(cudaFree(c));
        CHECK(cudaStreamDestroy(s));
    }

    // cudaMemcpyDefault: the runtime infers the direction from the pointers.
    {
        std::vector<unsigned> x(4096), y(4096, 0);
        for (int i = 0; i < 4096; ++i) x[i] = i * 2654435761u;
        CHECK(cudaMemcpy(a, x.data(), x.size() * sizeof(unsigned), cudaMemcpyDefault));
        CHECK(cudaMemcpy(b + 100, a, x.size() * sizeof(unsigned), cudaMemcpyDefault));
        CHECK(cudaMemcpy(y.data(), b + 100, y.size() * sizeof(unsigned), cudaMemcpyDefault));
        EXPECT(x == y, "cudaMemcpyDefault round trip differs");
        printf("cudaMemcpyDefault HtoD, DtoD, DtoH: ok\n");
    }

    // 1,000 small async DtoD copies that reverse 4 KiB blocks of a into b.
    {
        CHECK(cudaMemcpy(a, h.data(), bytes, cudaMemcpyHostToDevice));
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        const int blocks = 1000, words = 1024;
        for (int k = 0; k < blocks; ++k)
            CHECK(cudaMemcpyAsync(b + size_t(blocks - 1 - k) * words, a + size_t(k) * words,
                                  words * sizeof(unsigned), cudaMemcpyDeviceToDevice, s));
        CHECK(cudaMemcpyAsync(back.data(), b, size_t(blocks) * words * sizeof(unsigned),
                              cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int k = 0; k < blocks; ++k)
            for (int i = 0; i < words; ++i)
                if (back[size_t(blocks - 1 - k) * words + i] != h[size_t(k) * words + i])
                    fail("small DtoD copy %d word %d", k, i);
        printf("%d async 4 KiB DtoD copies: ok\n", blocks);
        CHECK(cudaStreamDestroy(s));
    }

    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(d_sums));
    return pass();
}
