// vcuda-server's Prometheus endpoint (--metrics-listen, server/metrics.hpp) against a server on the software
// driver: what a scrape says matches what the sessions did (sessions open, memory they allocated, calls they
// made, suspends and resumes), totals do not go down when a session ends, a scraper that misbehaves harms no
// session, and a network address is refused without --insecure.
#include <atomic>
#include <catch2/catch.hpp>
#include <regex>
#include <thread>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "raw_client.hpp"
#include "tests/metrics_scrape.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t MiB = 1u << 20;

struct metered_server {
    server_process server;
    uint16_t port = 0;
    explicit metered_server(std::vector<std::string> more = {}) : server(with_metrics(std::move(more))) {
        REQUIRE(server.wait_for_log("metrics at http://"));
        port = metrics_port(server.log());
        REQUIRE(port != 0);
    }
    static std::vector<std::string> with_metrics(std::vector<std::string> more) {
        more.insert(more.begin(), {"--metrics-listen", "127.0.0.1:0"});
        return more;
    }
    std::string scrape_text() const {
        auto answer = scrape(port);
        REQUIRE(answer.starts_with("HTTP/1.1 200 OK\r\n"));
        return answer;
    }
    // The value of `series`, 0 when the page does not have it.
    double value(const std::string& series) const { return metric(scrape_text(), series).value_or(0); }
    // The sample of `name` for session `id` (any GPU, any lease), or nothing.
    std::optional<double> of_session(const std::string& name, uint64_t id) const {
        std::smatch m;
        const std::string text = scrape_text();
        const std::regex line("\n" + name + R"(\{session=")" + std::to_string(id) + R"(",[^}]*\} (\S+))");
        if (!std::regex_search(text, m, line)) return std::nullopt;
        return std::stod(m[1]);
    }
    bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = 10s) const {
        for (auto end = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < end;) {
            if (done()) return true;
            std::this_thread::sleep_for(20ms);
        }
        return done();
    }
};

const std::string active = R"(vcuda_server_sessions{state="active"})";
const std::string suspended = R"(vcuda_server_sessions{state="suspended"})";

}  // namespace

TEST_CASE("vcuda-server /metrics: sessions, the memory each allocated, and calls, as they are",
          "[integration]") {
    metered_server m;
    CHECK(m.value(active) == 0);
    auto a = raw_client::open(m.server.address());
    REQUIRE(a);
    REQUIRE(a->call(op::mem_alloc, {64 * MiB}).result == CUDA_SUCCESS);
    CHECK(m.value(active) == 1);
    CHECK(m.of_session("vcuda_server_session_memory_mapped_bytes", a->session_id()) == 64 * MiB);
    CHECK(m.of_session("vcuda_server_session_memory_resident_bytes", a->session_id()) == 64 * MiB);
    CHECK(m.of_session("vcuda_server_session_suspended", a->session_id()) == 0);

    // Every call counts, once: the session's counter and the server's total.
    const double calls = m.of_session("vcuda_server_session_calls_total", a->session_id()).value_or(-1);
    const double total = m.value("vcuda_server_calls_total");
    CHECK(calls >= 1);
    for (int i = 0; i < 25; ++i) REQUIRE(a->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    CHECK(m.of_session("vcuda_server_session_calls_total", a->session_id()) == calls + 25);
    CHECK(m.value("vcuda_server_calls_total") == total + 25);

    // A second session: counted and measured apart.
    auto b = raw_client::open(m.server.address());
    REQUIRE(b);
    REQUIRE(b->call(op::mem_alloc, {32 * MiB}).result == CUDA_SUCCESS);
    CHECK(m.value(active) == 2);
    CHECK(m.of_session("vcuda_server_session_memory_mapped_bytes", b->session_id()) == 32 * MiB);
    CHECK(m.of_session("vcuda_server_session_memory_mapped_bytes", a->session_id()) == 64 * MiB);

    // It ends: gone from the page, its calls still in the total.
    const double before_end = m.value("vcuda_server_calls_total");
    const uint64_t b_id = b->session_id();
    b.reset();
    CHECK(m.wait_until([&] { return m.value(active) == 1; }));
    CHECK_FALSE(m.of_session("vcuda_server_session_info", b_id));
    CHECK(m.value("vcuda_server_calls_total") == before_end);
}

TEST_CASE("vcuda-server /metrics: suspends and resumes, with the memory saved and rebuilt", "[integration]") {
    metered_server m({"--test-suspend-every", "100"});
    auto a = raw_client::open(m.server.address());
    REQUIRE(a);
    REQUIRE(a->call(op::mem_alloc, {64 * MiB}).result == CUDA_SUCCESS);
    // Idle, it is suspended: its memory stays charged but is not on the GPU.
    REQUIRE(
        m.wait_until([&] { return m.of_session("vcuda_server_session_suspended", a->session_id()) == 1; }));
    CHECK(m.value(suspended) == 1);
    CHECK(m.value(active) == 0);
    CHECK(m.of_session("vcuda_server_session_memory_mapped_bytes", a->session_id()) == 64 * MiB);
    CHECK(m.of_session("vcuda_server_session_memory_resident_bytes", a->session_id()) == 0);
    CHECK(m.value("vcuda_server_suspend_seconds_count") >= 1);
    CHECK(m.value("vcuda_server_suspend_seconds_sum") > 0);
    // Its next call brings it back.
    const double resumes = m.value("vcuda_server_resume_seconds_count");
    REQUIRE(a->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    CHECK(m.value("vcuda_server_resume_seconds_count") >= resumes + 1);
    CHECK(m.value("vcuda_server_resume_seconds_sum") > 0);
    CHECK(m.value("vcuda_server_migration_pause_seconds_count") == 0);  // live migration: not there yet
}

TEST_CASE("vcuda-server /metrics: scrapers that misbehave are closed and harm no session", "[integration]") {
    metered_server m;
    auto a = raw_client::open(m.server.address());
    REQUIRE(a);
    REQUIRE(a->call(op::mem_alloc, {16 * MiB}).result == CUDA_SUCCESS);
    const double calls = m.of_session("vcuda_server_session_calls_total", a->session_id()).value_or(-1);

    // The session calls throughout; Catch2 is not thread-safe, so the thread only counts.
    std::atomic<bool> stop{false};
    std::atomic<int> made{0}, failed{0};
    std::thread session([&] {
        while (!stop) {
            if (a->call(op::mem_get_info, {}).result != CUDA_SUCCESS) ++failed;
            ++made;
        }
    });
    // Meanwhile: an oversized request and garbage, each closed unanswered; then more slow scrapers than the
    // listener serves at once.
    for (const std::string& bad : {"GET /metrics HTTP/1.1\r\nX: " + std::string(64 << 10, 'x') + "\r\n\r\n",
                                   std::string("\x00\x01\x02garbage\r\n\r\n", 14)}) {
        http_socket c(m.port);
        c.send(bad);
        bool closed = false;
        CHECK(c.receive_all(3s, &closed).find("200 OK") == std::string::npos);
        CHECK(closed);
    }
    std::vector<std::unique_ptr<http_socket>> slow;
    for (int i = 0; i < 20; ++i) {
        slow.push_back(std::make_unique<http_socket>(m.port));
        slow.back()->send("GET /metrics HTTP/1.1\r\n");
    }
    std::this_thread::sleep_for(300ms);
    const int during = made;
    stop = true;
    session.join();
    CHECK(failed == 0);
    CHECK(during > 0);
    slow.clear();
    // Once the slow ones are gone the page is served again, and it counted every call.
    REQUIRE(m.wait_until([&] { return scrape(m.port).starts_with("HTTP/1.1 200 OK"); }));
    CHECK(m.of_session("vcuda_server_session_calls_total", a->session_id()) == calls + made);
    CHECK(m.server.log().find("metrics: a scrape failed") == std::string::npos);
}

TEST_CASE("vcuda-server --metrics-listen on a network address needs --insecure", "[integration]") {
    server_process refused({"--metrics-listen", "0.0.0.0:0"}, server_process::transport::tcp);
    CHECK(refused.wait_exit(10) == 2);
    CHECK(refused.log().find("refusing to serve metrics on a network address") != std::string::npos);
    server_process allowed({"--metrics-listen", "0.0.0.0:0", "--insecure"}, server_process::transport::tcp);
    CHECK(allowed.wait_for_log("metrics at http://0.0.0.0:"));
    CHECK(allowed.log().find("anyone who reaches it reads the metrics") != std::string::npos);
}
