// client/parallel_copy.cpp: large copies split over helper threads land byte for byte, from several threads
// at once and in a forked child (whose helpers are its own).
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "client/parallel_copy.hpp"

using vcuda::client::parallel_copy;

namespace {
std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<unsigned char> v(n);
    for (auto& b : v) b = static_cast<unsigned char>(rng());
    return v;
}
}  // namespace

TEST_CASE("parallel_copy copies every byte and nothing beyond, at any size and offset", "[unit]") {
    const size_t sizes[] = {0, 1, 4095, (1u << 20) - 1, 2u << 20, (2u << 20) + 3, 4u << 20, (13u << 20) + 5};
    for (size_t n : sizes)
        for (size_t shift : {size_t{0}, size_t{7}}) {
            INFO("size " << n << ", offset " << shift);
            auto src = random_bytes(n + shift, n);
            std::vector<unsigned char> dst(n + 2 * shift + 16, 0xab);
            parallel_copy(dst.data() + shift, src.data() + shift, n);
            CHECK(std::equal(src.begin() + shift, src.end(), dst.begin() + shift));
            CHECK(std::all_of(dst.begin(), dst.begin() + shift, [](unsigned char b) { return b == 0xab; }));
            CHECK(std::all_of(dst.begin() + shift + n, dst.end(), [](unsigned char b) { return b == 0xab; }));
        }
}

TEST_CASE("parallel_copy from several threads at once", "[unit]") {
    const size_t n = (8u << 20) + 11;
    std::vector<std::thread> threads;
    std::vector<int> bad(4, 0);
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            auto src = random_bytes(n, 100 + t);
            std::vector<unsigned char> dst(n);
            for (int round = 0; round < 10; ++round) {
                std::fill(dst.begin(), dst.end(), 0);
                parallel_copy(dst.data(), src.data(), n);
                if (dst != src) ++bad[t];
            }
        });
    for (auto& th : threads) th.join();
    CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("parallel_copy in a forked child", "[unit]") {
    const size_t n = 6u << 20;
    auto src = random_bytes(n, 5);
    std::vector<unsigned char> dst(n);
    parallel_copy(dst.data(), src.data(), n);  // the parent's helpers exist now
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::vector<unsigned char> mine(n);
        parallel_copy(mine.data(), src.data(), n);
        _exit(mine == src ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
