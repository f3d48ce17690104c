// precopy_dirty: memory that changes after a pre-copied move has begun must arrive as it is when the session
// is paused, and memory that did not change must arrive too. Two 64 MiB pieces (the pre-copy's grain) get
// pattern A; after argv[1] ms (default 0) the second piece gets pattern B; after argv[2] ms more both are
// read back. Moved with `vcuda-server --move-memory precopy --test-move-after 400 --test-precopy-hold 1000`
// and argv = 800 1500, the pre-copy sees A everywhere and the pause sees B in the second piece: a receiver
// that kept the pre-copied second piece would read back A there. Copies and memsets only (no kernels), so
// that it runs unchanged on the software driver. `precopy_dirty --gates DIR` paces itself by files instead of
// time, for a test that drives the move (tests/integration/move_session.sh): it creates DIR/a-written after
// pattern A, waits for DIR/precopied before pattern B, then creates DIR/b-written.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

namespace {

void touch(const std::string& path) {
    if (!std::ofstream(path)) fail("cannot create %s", path.c_str());
}

void wait_for(const std::string& path) {
    for (int i = 0; i < 6000; ++i) {
        if (std::ifstream(path)) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fail("%s did not appear in 60 s", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    const std::string gates = argc > 2 && std::string(argv[1]) == "--gates" ? argv[2] : "";
    const int before_ms = argc > 1 && gates.empty() ? atoi(argv[1]) : 0;
    const int after_ms = argc > 2 && gates.empty() ? atoi(argv[2]) : 0;
    const size_t piece = size_t{64} << 20, n = 2 * piece;
    unsigned char* d = nullptr;
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemset(d, 0xa1, n));
    std::vector<unsigned char> words(4096);
    for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<unsigned char>(i * 7 + 3);
    CHECK(cudaMemcpy(d + 12345, words.data(), words.size(), cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    if (!gates.empty()) {
        touch(gates + "/a-written");
        wait_for(gates + "/precopied");
    }
    usleep(static_cast<useconds_t>(before_ms) * 1000);
    CHECK(cudaMemset(d + piece, 0xb2, piece));
    CHECK(cudaMemcpy(d + piece + 777, words.data(), words.size(), cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    if (!gates.empty()) touch(gates + "/b-written");
    usleep(static_cast<useconds_t>(after_ms) * 1000);

    std::vector<unsigned char> h(n);
    CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    size_t wrong_a = 0, wrong_b = 0;
    for (size_t i = 0; i < n; ++i) {
        unsigned char want = i < piece ? 0xa1 : 0xb2;
        if (i >= 12345 && i < 12345 + words.size()) want = words[i - 12345];
        if (i >= piece + 777 && i < piece + 777 + words.size()) want = words[i - piece - 777];
        if (h[i] != want) ++(i < piece ? wrong_a : wrong_b);
    }
    printf("unchanged piece: %zu wrong bytes; changed piece: %zu wrong bytes\n", wrong_a, wrong_b);
    if (wrong_a || wrong_b) fail("memory is not what was written");
    CHECK(cudaFree(d));
    return pass();
}
