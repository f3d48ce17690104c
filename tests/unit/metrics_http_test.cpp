// The Prometheus listener and exposition writer (common/metrics_http.hpp): the text format with its escapes,
// GET /metrics answered and everything else refused, and scrapers that misbehave (oversized, with a body,
// garbage, too slow, too many at once) closed without holding up a well-behaved scrape.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "common/metrics_http.hpp"
#include "tests/metrics_scrape.hpp"

using namespace vcuda;
using namespace vcuda::metrics;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

const std::string page = "# HELP up test\n# TYPE up gauge\nup 1\n";

struct served {
    std::atomic<int> scrapes{0};
    std::unique_ptr<http_listener> listener;
    explicit served(http_limits limits = {}) {
        auto l = http_listener::start(
            *endpoint::parse("127.0.0.1:0"),
            [this] {
                ++scrapes;
                return page;
            },
            limits);
        REQUIRE(l);
        listener = std::move(*l);
    }
    uint16_t port() const { return listener->local().port; }
};

std::string body_of(const std::string& answer) {
    auto at = answer.find("\r\n\r\n");
    return at == std::string::npos ? std::string() : answer.substr(at + 4);
}

}  // namespace

TEST_CASE("the exposition format: HELP and TYPE once, labels escaped, exact integers", "[unit]") {
    exposition out;
    out.family("vcuda_x_bytes", metric_type::gauge, "a help\nwith a newline and a \\");
    out.sample("vcuda_x_bytes", {{"tenant", "a\"b\\c\nd"}, {"gpu", "GPU-1"}}, uint64_t{(1ull << 60) + 1});
    out.sample("vcuda_x_bytes", 0.25);
    out.summary("vcuda_y_seconds", "took", 3, 1.5);
    out.family("vcuda_z", metric_type::counter, "odd values");
    out.sample("vcuda_z", {{"v", "nan"}}, std::numeric_limits<double>::quiet_NaN());
    out.sample("vcuda_z", {{"v", "inf"}}, std::numeric_limits<double>::infinity());
    CHECK(out.text() ==
          "# HELP vcuda_x_bytes a help\\nwith a newline and a \\\\\n"
          "# TYPE vcuda_x_bytes gauge\n"
          "vcuda_x_bytes{tenant=\"a\\\"b\\\\c\\nd\",gpu=\"GPU-1\"} 1152921504606846977\n"
          "vcuda_x_bytes 0.25\n"
          "# HELP vcuda_y_seconds took\n"
          "# TYPE vcuda_y_seconds summary\n"
          "vcuda_y_seconds_sum 1.5\n"
          "vcuda_y_seconds_count 3\n"
          "# HELP vcuda_z odd values\n"
          "# TYPE vcuda_z counter\n"
          "vcuda_z{v=\"nan\"} NaN\n"
          "vcuda_z{v=\"inf\"} +Inf\n");
}

TEST_CASE("metrics: a --metrics-listen address is loopback TCP unless --insecure", "[unit]") {
    CHECK(parse_listen_address("127.0.0.1:9400", false));
    CHECK(parse_listen_address("localhost:9400", false));
    CHECK(parse_listen_address("[::1]:9400", false));
    auto network = parse_listen_address("0.0.0.0:9400", false);
    REQUIRE_FALSE(network);
    CHECK(network.error().find("--insecure") != std::string::npos);
    CHECK(parse_listen_address("0.0.0.0:9400", true));
    auto unix_socket = parse_listen_address("unix:/tmp/m.sock", true);
    REQUIRE_FALSE(unix_socket);
    CHECK(unix_socket.error().find("TCP only") != std::string::npos);
    CHECK_FALSE(parse_listen_address("127.0.0.1", false));  // no port
}

TEST_CASE("GET /metrics is answered with the collected text, other paths and methods are not", "[unit]") {
    served s;
    auto answer = scrape(s.port());
    CHECK(answer.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(answer.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
    CHECK(body_of(answer) == page);
    CHECK(s.scrapes == 1);
    // A query string is not part of the path (Prometheus may add one).
    CHECK(http_exchange(s.port(), "GET /metrics?x=1 HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(http_exchange(s.port(), "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found\r\n"));
    CHECK(
        http_exchange(s.port(), "GET /metricsx HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found\r\n"));
    auto post = http_exchange(s.port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    CHECK(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
    CHECK(post.find("Allow: GET\r\n") != std::string::npos);
    CHECK(s.scrapes == 2);
}

TEST_CASE("malformed, oversized and body-carrying requests are closed unanswered", "[unit]") {
    served s;
    const std::string too_big = "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(9000, 'a') + "\r\n\r\n";
    const std::string with_body = "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    const std::string garbage = std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + "\r\n\r\n";
    for (auto* request : {&too_big, &with_body, &garbage}) {
        http_socket c(s.port());
        REQUIRE(c.fd >= 0);
        c.send(*request);  // the server may close before it has read it all
        bool closed = false;
        auto answer = c.receive_all(3s, &closed);
        CHECK(closed);
        CHECK(answer.find("200 OK") == std::string::npos);
    }
    CHECK(s.scrapes == 0);
    CHECK(body_of(scrape(s.port())) == page);  // and the listener still serves
}

TEST_CASE("a scraper too slow to send its request is dropped at the deadline and blocks nobody", "[unit]") {
    http_limits limits;
    limits.request_deadline = 500ms;
    limits.max_connections = 3;
    served s(limits);
    // Two slow scrapers hold connections with half a request each.
    http_socket slow1(s.port()), slow2(s.port());
    REQUIRE(slow1.send("GET /metr"));
    REQUIRE(slow2.send("GET /metrics HTTP/1.1\r\nHost: x\r\n"));
    // A third connects meanwhile and is answered at once.
    auto t0 = std::chrono::steady_clock::now();
    CHECK(body_of(scrape(s.port())) == page);
    CHECK(std::chrono::steady_clock::now() - t0 < 400ms);
    // Past the deadline the slow ones are closed, unanswered.
    for (auto* c : {&slow1, &slow2}) {
        bool closed = false;
        auto answer = c->receive_all(3s, &closed);
        CHECK(closed);
        CHECK(answer.empty());
    }
}

TEST_CASE("connections past max_connections are closed at once, and the limit frees as they end", "[unit]") {
    http_limits limits;
    limits.request_deadline = 1s;
    limits.max_connections = 2;
    served s(limits);
    http_socket a(s.port()), b(s.port());
    REQUIRE(a.send("GET"));
    REQUIRE(b.send("GET"));
    std::this_thread::sleep_for(100ms);  // both accepted
    http_socket third(s.port());
    third.send("GET /metrics HTTP/1.1\r\n\r\n");
    bool closed = false;
    auto answer = third.receive_all(500ms, &closed);
    CHECK(closed);  // long before the 1 s deadline
    CHECK(answer.empty());
    // Once the two have timed out, scrapes are answered again.
    CHECK(a.receive_all(3s).empty());
    CHECK(b.receive_all(3s).empty());
    std::this_thread::sleep_for(50ms);
    CHECK(body_of(scrape(s.port())) == page);
}
