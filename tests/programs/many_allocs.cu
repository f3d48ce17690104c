// many_allocs: 10,000 small cudaMalloc calls (1 byte .. 4 KiB), every pointer aligned to 256 bytes and no two
// ranges overlapping; every 10th allocation filled with its own pattern and all of them read back after all
// allocations exist (no aliasing); freed in a shuffled order; then the same again, to see the space reused.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.cuh"

int main() {
    const int count = 10000;
    for (int round = 0; round < 2; ++round) {
        std::vector<void*> ptr(count, nullptr);
        std::vector<size_t> size(count);
        for (int i = 0; i < count; ++i) {
            size[i] = size_t(i * 37 + round * 11) % 4096 + 1;
            CHECK(cudaMalloc(&ptr[i], size[i]));
            EXPECT(ptr[i] != nullptr, "allocation %d is null", i);
            EXPECT(reinterpret_cast<uintptr_t>(ptr[i]) % 256 == 0, "allocation %d not 256-byte aligned", i);
        }
        // No overlap: sort by address.
        std::vector<int> order(count);
        for (int i = 0; i < count; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int x, int y) { return ptr[x] < ptr[y]; });
        for (int k = 1; k < count; ++k) {
            uintptr_t prev_end = reinterpret_cast<uintptr_t>(ptr[order[k - 1]]) + size[order[k - 1]];
            EXPECT(prev_end <= reinterpret_cast<uintptr_t>(ptr[order[k]]), "allocations %d and %d overlap",
                   order[k - 1], order[k]);
        }
        printf("round %d: %d allocations, 256-byte aligned, no overlap\n", round, count);

        // Fill every 10th with a pattern of its own, then check them all.
        std::vector<unsigned char> buf(4096);
        for (int i = 0; i < count; i += 10) {
            for (size_t j = 0; j < size[i]; ++j) buf[j] = static_cast<unsigned char>(i * 7 + j * 3 + round);
            CHECK(cudaMemcpy(ptr[i], buf.data(), size[i], cudaMemcpyHostToDevice));
        }
        for (int i = 5; i < count; i += 10) CHECK(cudaMemset(ptr[i], i & 0xff, size[i]));
        for (int i = 0; i < count; i += 5) {
            CHECK(cudaMemcpy(buf.data(), ptr[i], size[i], cudaMemcpyDeviceToHost));
            for (size_t j = 0; j < size[i]; ++j) {
                unsigned char want = i % 10 == 0 ? static_cast<unsigned char>(i * 7 + j * 3 + round)
                                                 : static_cast<unsigned char>(i & 0xff);
                if (buf[j] != want)
                    fail("round %d allocation %d byte %zu = %#x, expected %#x", round, i, j, buf[j], want);
            }
        }
        printf("round %d: contents of %d allocations ok\n", round, count / 5);

        // Free in a deterministic shuffled order.
        rng r(1234 + round);
        for (int i = count - 1; i > 0; --i) std::swap(order[i], order[r.u32() % (i + 1)]);
        for (int i = 0; i < count; ++i) CHECK(cudaFree(ptr[order[i]]));
        printf("round %d: all freed\n", round);
    }
    CHECK(cudaFree(nullptr));
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("info: free %zu MiB of %zu MiB\n", free_b >> 20, total_b >> 20);
    return pass();
}
