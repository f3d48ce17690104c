// copy_forever (GPU suite, the kill test): allocates 4 GiB on the device and 256 MiB of pinned host memory,
// prints `ready`, then copies host -> device -> host through the whole 4 GiB in 256 MiB pieces, round after
// round, until killed (or after SECONDS, default 120, as a safety net).
// Usage: copy_forever [SECONDS]
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>

#include "common.cuh"

int main(int argc, char** argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 120.0;
    const size_t dev_bytes = size_t(4) << 30, piece = size_t(256) << 20;
    char* d = nullptr;
    char* h = nullptr;
    CHECK(cudaMalloc(&d, dev_bytes));
    CHECK(cudaMallocHost(&h, piece));
    memset(h, 0x5c, piece);
    CHECK(cudaMemset(d, 0, dev_bytes));
    CHECK(cudaDeviceSynchronize());
    printf("allocated 4 GiB on the device\nready\n");
    fflush(stdout);

    const auto start = std::chrono::steady_clock::now();
    long rounds = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
        for (size_t off = 0; off < dev_bytes; off += piece) {
            h[0] = static_cast<char>(rounds);
            CHECK(cudaMemcpy(d + off, h, piece, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(h, d + off, piece, cudaMemcpyDeviceToHost));
            EXPECT(h[0] == static_cast<char>(rounds), "round trip lost a byte");
        }
        ++rounds;
        printf("info: round %ld done\n", rounds);
        fflush(stdout);
    }
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(h));
    return pass();
}
