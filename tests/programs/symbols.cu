// symbols: __device__ and __constant__ variables reached through the runtime's symbol API —
// cudaMemcpyToSymbol / cudaMemcpyFromSymbol (whole, at an offset, async, device-to-device),
// cudaGetSymbolAddress, cudaGetSymbolSize — and used by a kernel through their addresses; plus the initial
// value of an initialized __device__ array. With a pause (argv[1] ms) at the end, during which the session
// may be suspended or moved (its module loaded again, the globals maybe elsewhere), the kernel runs again
// through the addresses cudaGetSymbolAddress gave before, and symbol copies and a memset name them: they must
// still reach the globals.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>

#include <vector>

#include "common.cuh"

__device__ int sym_table[256];
__constant__ float sym_coeffs[16];
__device__ unsigned long long sym_counter;
__device__ int sym_init[4] = {11, 22, 33, 44};

extern "C" __global__ void sym_apply(const int* table, const float* coeffs, float* out,
                                     unsigned long long* counter, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = coeffs[i % 16] * static_cast<float>(table[i % 256]);
        atomicAdd(counter, 1ull);
    }
}

int main(int argc, char** argv) {
    size_t sz = 0;
    CHECK(cudaGetSymbolSize(&sz, sym_table));
    printf("sizeof sym_table = %zu\n", sz);
    EXPECT(sz == sizeof(int) * 256, "sym_table size %zu", sz);
    CHECK(cudaGetSymbolSize(&sz, sym_coeffs));
    printf("sizeof sym_coeffs = %zu\n", sz);
    EXPECT(sz == sizeof(float) * 16, "sym_coeffs size %zu", sz);
    CHECK(cudaGetSymbolSize(&sz, sym_counter));
    printf("sizeof sym_counter = %zu\n", sz);
    CHECK(cudaGetSymbolSize(&sz, sym_init));
    printf("sizeof sym_init = %zu\n", sz);

    int init[4] = {};
    CHECK(cudaMemcpyFromSymbol(init, sym_init, sizeof init));
    printf("sym_init initial value: %d %d %d %d\n", init[0], init[1], init[2], init[3]);

    std::vector<int> table(256);
    for (int i = 0; i < 256; ++i) table[i] = i * 3 - 100;
    float coeffs[16];
    for (int i = 0; i < 16; ++i) coeffs[i] = 0.5f * static_cast<float>(i + 1);
    unsigned long long zero = 0;
    CHECK(cudaMemcpyToSymbol(sym_table, table.data(), 256 * sizeof(int)));
    CHECK(cudaMemcpyToSymbol(sym_coeffs, coeffs, sizeof coeffs));
    CHECK(cudaMemcpyToSymbol(sym_counter, &zero, sizeof zero));

    int* p_table;
    float* p_coeffs;
    unsigned long long* p_counter;
    CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&p_table), sym_table));
    CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&p_coeffs), sym_coeffs));
    CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&p_counter), sym_counter));
    EXPECT(p_table && p_coeffs && p_counter, "null symbol address");
    printf("info: sym_table at %p, sym_coeffs at %p\n", static_cast<void*>(p_table),
           static_cast<void*>(p_coeffs));

    const int n = 50000;
    float* d_out;
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    sym_apply<<<(n + 255) / 256, 256>>>(p_table, p_coeffs, d_out, p_counter, n);
    CHECK_LAUNCH();
    std::vector<float> out(n);
    CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        float want = coeffs[i % 16] * static_cast<float>(table[i % 256]);
        if (out[i] != want) fail("out[%d] = %g, expected %g", i, out[i], want);
    }
    unsigned long long counter = 0;
    CHECK(cudaMemcpyFromSymbol(&counter, sym_counter, sizeof counter));
    printf("kernel through symbol addresses: ok, counter %llu\n", counter);
    EXPECT(counter == static_cast<unsigned long long>(n), "counter %llu", counter);

    // At an offset: 16 ints at byte 512 of sym_table.
    {
        int part[16], back[16];
        for (int i = 0; i < 16; ++i) part[i] = 7000 + i;
        CHECK(cudaMemcpyToSymbol(sym_table, part, sizeof part, 512));
        CHECK(cudaMemcpyFromSymbol(back, sym_table, sizeof back, 512));
        for (int i = 0; i < 16; ++i) EXPECT(back[i] == 7000 + i, "offset copy [%d] = %d", i, back[i]);
        std::vector<int> all(256);
        CHECK(cudaMemcpyFromSymbol(all.data(), sym_table, 256 * sizeof(int)));
        for (int i = 0; i < 256; ++i) {
            int want = (i >= 128 && i < 144) ? 7000 + (i - 128) : table[i];
            EXPECT(all[i] == want, "sym_table[%d] = %d, expected %d", i, all[i], want);
        }
        printf("cudaMemcpyToSymbol/FromSymbol at an offset: ok\n");
    }

    // Async, on a stream, and device-to-device.
    {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        float c2[16], back[16];
        for (int i = 0; i < 16; ++i) c2[i] = -static_cast<float>(i);
        CHECK(cudaMemcpyToSymbolAsync(sym_coeffs, c2, sizeof c2, 0, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemcpyFromSymbolAsync(back, sym_coeffs, sizeof back, 0, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < 16; ++i) EXPECT(back[i] == c2[i], "async symbol copy [%d] = %g", i, back[i]);
        printf("cudaMemcpyToSymbolAsync/FromSymbolAsync: ok\n");

        int* d_src;
        CHECK(cudaMalloc(&d_src, 256 * sizeof(int)));
        std::vector<int> src(256), all(256);
        for (int i = 0; i < 256; ++i) src[i] = -i;
        CHECK(cudaMemcpy(d_src, src.data(), 256 * sizeof(int), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyToSymbol(sym_table, d_src, 256 * sizeof(int), 0, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpyFromSymbol(d_src, sym_init, sizeof init, 0, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpyFromSymbol(all.data(), sym_table, 256 * sizeof(int)));
        EXPECT(all == src, "device-to-device symbol copy differs");
        int first[4];
        CHECK(cudaMemcpy(first, d_src, sizeof first, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 4; ++i)
            EXPECT(first[i] == init[i], "sym_init -> device copy [%d] = %d", i, first[i]);
        printf("device-to-device symbol copies: ok\n");
        CHECK(cudaFree(d_src));
        CHECK(cudaStreamDestroy(s));
    }
    if (int pause_ms = argc > 1 ? atoi(argv[1]) : 0; pause_ms > 0) {
        std::vector<int> t_now(256);
        float c_now[16];
        CHECK(cudaMemcpyFromSymbol(t_now.data(), sym_table, 256 * sizeof(int)));
        CHECK(cudaMemcpyFromSymbol(c_now, sym_coeffs, sizeof c_now));
        printf("pausing %d ms\n", pause_ms);
        fflush(stdout);
        usleep(static_cast<useconds_t>(pause_ms) * 1000);
        sym_apply<<<(n + 255) / 256, 256>>>(p_table, p_coeffs, d_out, p_counter, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            float want = c_now[i % 16] * static_cast<float>(t_now[i % 256]);
            if (out[i] != want) fail("after the pause: out[%d] = %g, expected %g", i, out[i], want);
        }
        printf("after the pause, the kernel through the symbol addresses from before: ok\n");
        // Copies and a memset after the pause, to the addresses from before: the program's own, and (cudart
        // may cache them) the symbol API's.
        for (int i = 0; i < 256; ++i) t_now[i] = 5 - i;
        for (int i = 0; i < 16; ++i) c_now[i] = 0.25f * static_cast<float>(i);
        CHECK(cudaMemcpyToSymbol(sym_table, t_now.data(), 256 * sizeof(int)));
        CHECK(cudaMemcpy(p_coeffs, c_now, sizeof c_now, cudaMemcpyHostToDevice));
        std::vector<int> t_back(256);
        CHECK(cudaMemcpy(t_back.data(), p_table, 256 * sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT(t_back == t_now, "after the pause: the table read through its old address differs");
        CHECK(cudaMemset(p_counter, 0, sizeof(unsigned long long)));
        sym_apply<<<(n + 255) / 256, 256>>>(p_table, p_coeffs, d_out, p_counter, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            float want = c_now[i % 16] * static_cast<float>(t_now[i % 256]);
            if (out[i] != want)
                fail("after the pause, new table: out[%d] = %g, expected %g", i, out[i], want);
        }
        CHECK(cudaMemcpyFromSymbol(&counter, sym_counter, sizeof counter));
        EXPECT(counter == static_cast<unsigned long long>(n), "after the pause: counter %llu", counter);
        printf("after the pause, symbol copies and a memset through the addresses from before: ok\n");
    }
    CHECK(cudaFree(d_out));
    return pass();
}
