// --isolation process: every session runs in a worker process of its own. A worker that dies (a driver crash,
// a context poisoned by a device-side assert) ends its own session only; other sessions go on and new ones
// open; a worker exits with its session and frees its --max-sessions slot.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <thread>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 13 + seed) & 0xff);
    return v;
}

// The worker process serving session `id`, from the line the server logs when it opens one.
int worker_pid(const server_process& server, uint64_t id) {
    std::regex line("session " + std::to_string(id) + " opened by .*: worker pid (\\d+)");
    for (int i = 0; i < 250; ++i) {
        std::smatch m;
        std::string text = server.log();
        if (std::regex_search(text, m, line)) return std::stoi(m[1]);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
}

// A round trip of `n` bytes through a new allocation: true when all of it worked.
bool round_trip(raw_client& c, size_t n, uint8_t seed) {
    auto a = c.call(op::mem_alloc, {n});
    if (a.result != CUDA_SUCCESS || a.outs.size() != 1) return false;
    auto data = pattern(n, seed);
    if (c.call(op::copy_htod, {a.outs[0], 0}, {}, data).result != CUDA_SUCCESS) return false;
    auto back = c.call(op::copy_dtoh, {a.outs[0], n, 0});
    bool ok = back.result == CUDA_SUCCESS && back.payload == data;
    return c.call(op::mem_free, {a.outs[0]}).result == CUDA_SUCCESS && ok;
}

bool server_alive(const server_process& s) { return s.pid() > 0 && ::kill(s.pid(), 0) == 0; }

}  // namespace

TEST_CASE("process isolation: a session whose worker crashes ends alone, the others go on", "[integration]") {
    auto t = GENERATE(server_process::transport::unix_socket, server_process::transport::tcp);
    server_process server({"--isolation", "process"}, t);
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(round_trip(*a, 1 << 16, 1));
    REQUIRE(round_trip(*b, 1 << 16, 2));
    // A second lane of B joins B's worker; a wrong key is refused by the server.
    auto b2 = raw_client::open(server.address(), b->session_id(), b->key());
    REQUIRE(b2);
    REQUIRE(round_trip(*b2, 4096, 3));
    std::string why;
    CHECK_FALSE(raw_client::open(server.address(), b->session_id(), altered(b->key()), &why));

    int pa = worker_pid(server, a->session_id());
    int pb = worker_pid(server, b->session_id());
    REQUIRE(pa > 0);
    REQUIRE(pb > 0);
    REQUIRE(pa != pb);
    REQUIRE(pa != server.pid());

    // What a driver crash does (the software driver cannot assert on a GPU): A's worker dies by SIGSEGV.
    REQUIRE(::kill(pa, SIGSEGV) == 0);
    CHECK(server.wait_for_log("session " + std::to_string(a->session_id()) + ": worker pid " +
                              std::to_string(pa) + " was killed by signal 11"));
    auto dead = a->call(op::mem_alloc, {4096});
    CHECK((!dead.connection_ok || dead.result != CUDA_SUCCESS));

    // B sees nothing of it: every call of many works, on both its lanes.
    int errors = 0;
    for (int i = 0; i < 50; ++i) {
        if (!round_trip(*b, 1 << 14, static_cast<uint8_t>(i))) ++errors;
        if (!round_trip(*b2, 512, static_cast<uint8_t>(i + 7))) ++errors;
    }
    CHECK(errors == 0);
    // A new session opens and works; the server lives on.
    auto c = raw_client::open(server.address());
    REQUIRE(c);
    CHECK(round_trip(*c, 1 << 16, 9));
    CHECK(server_alive(server));
}

TEST_CASE("process isolation: a worker ends with its session and frees its slot", "[integration]") {
    server_process server({"--isolation", "process", "--max-sessions", "1"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(round_trip(*a, 4096, 1));
    int pa = worker_pid(server, a->session_id());
    REQUIRE(pa > 0);
    std::string why;
    CHECK_FALSE(raw_client::open(server.address(), 0, {}, &why));  // the one slot is A's
    CHECK(why.find("--max-sessions") != std::string::npos);
    uint64_t id = a->session_id();
    a.reset();  // the client goes: its session ends, and its worker with it
    REQUIRE(server.wait_for_log("session " + std::to_string(id) + " ended"));
    REQUIRE(server.wait_for_log("session " + std::to_string(id) + ": worker pid " + std::to_string(pa) +
                                " exited (status 0)"));
    auto b = raw_client::open(server.address());
    REQUIRE(b);
    CHECK(round_trip(*b, 4096, 2));
    // A join of the ended session is refused.
    CHECK_FALSE(raw_client::open(server.address(), id, std::string(32, 'x')));
}

// The start cost of a session in each mode: connect to HELLO_REPLY (process mode: a worker is started, which
// loads the driver), then the first call (the session's context is made). On the software driver in CI; on a
// GPU host: VCUDA_TEST_DRIVER=/usr/lib/x86_64-linux-gnu/libcuda.so.1 bin/vcuda_integration_tests "session
// start*"
TEST_CASE("session start cost in each --isolation mode", "[integration]") {
    for (const char* mode : {"thread", "process"}) {
        server_process server({"--isolation", mode});
        constexpr int n = 10;
        double hello_ms = 0, hello_worst = 0, first_ms = 0;
        for (int i = 0; i < n; ++i) {
            auto t0 = std::chrono::steady_clock::now();
            std::string why;
            auto c = raw_client::open(server.address(), 0, {}, &why);
            auto t1 = std::chrono::steady_clock::now();
            INFO(mode << " session " << i << ": " << why << "\n" << server.log());
            REQUIRE(c);
            auto a = c->call(op::mem_alloc, {4096});
            auto t2 = std::chrono::steady_clock::now();
            REQUIRE(a.result == CUDA_SUCCESS);
            double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
            hello_ms += ms;
            hello_worst = std::max(hello_worst, ms);
            first_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
        }
        std::printf(
            "start cost (--isolation %s): connect to HELLO_REPLY %.2f ms on average (%.2f ms at most), "
            "then the first call (context creation) %.2f ms; %d sessions\n",
            mode, hello_ms / n, hello_worst, first_ms / n, n);
        std::fflush(stdout);
    }
}
