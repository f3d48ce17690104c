// Prometheus metrics for vcuda-server and vcuda-mgmt (README, "Metrics"): a writer of the text exposition
// format (version 0.0.4) and a small HTTP/1.1 listener that answers `GET /metrics` with what a callback
// collects. The listener is kept away from the serving path: it has one thread of its own (Boost.Asio,
// Beast parsing the request), and http_limits bound what each scraper may hold (request size, deadlines,
// connections at once): a slow or hostile scraper ties up that thread at most, never a session's.
// runs on: the listener's own thread (the collect callback too); the exposition writer on its caller's.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "common/transport.hpp"

namespace vcuda::metrics {

enum class metric_type { counter, gauge, summary };

// A sample's labels, in the order they are written: {{"gpu", uuid}, {"lease", id}}.
using labels = std::vector<std::pair<std::string_view, std::string>>;

// The text exposition format: each family's `# HELP` and `# TYPE` once, then its samples. Label values and
// help texts are escaped as the format requires, so tenant and lease names cannot break the page.
class exposition {
  public:
    // Starts a family; the samples that follow belong to it (a summary's are `name_sum` and `name_count`).
    void family(std::string_view name, metric_type type, std::string_view help);
    void sample(std::string_view name, const labels& l, double value);
    template <std::integral T>
    void sample(std::string_view name, const labels& l, T value) {
        write_name_labels(name, l);
        text_ += fmt::format(" {}\n", value);  // exact: counters past 2^53 keep every digit
    }
    template <class T>
    void sample(std::string_view name, T value) {
        sample(name, labels{}, value);
    }
    // A whole summary without quantiles: `count` events that took `sum_seconds` in all.
    void summary(std::string_view name, std::string_view help, uint64_t count, double sum_seconds);
    const std::string& text() const { return text_; }

  private:
    void write_name_labels(std::string_view name, const labels& l);
    std::string text_;
};

// Seconds as Prometheus wants durations, from any std::chrono duration.
template <class Rep, class Period>
double seconds(std::chrono::duration<Rep, Period> d) {
    return std::chrono::duration<double>(d).count();
}

// A --metrics-listen value: HOST:PORT. The page has no authentication and names tenants, leases and clients,
// so an address other than loopback is refused unless `insecure` (the program's --insecure) allows it, and
// then served with a warning in the log.
result<endpoint, std::string> parse_listen_address(const std::string& text, bool insecure);

// What one scraper may cost the listener. A scrape is a few hundred bytes of request; Prometheus's own
// default scrape timeout is 10 s.
struct http_limits {
    size_t max_request_bytes = 8u << 10;               // request line and headers; a body is refused
    std::chrono::milliseconds request_deadline{5000};  // to send the request, and again to read the answer
    int max_connections = 16;                          // open at once; more are closed unanswered
};

class http_listener {
  public:
    // Returns the exposition text of one scrape; runs on the listener's thread.
    using collect_fn = std::function<std::string()>;

    // Binds `ep` (TCP only) now, so that a bad address fails at start-up with the reason, and serves it on a
    // thread of its own until destroyed. Tests shorten `limits`.
    static result<std::unique_ptr<http_listener>, std::string> start(const endpoint& ep, collect_fn collect,
                                                                     http_limits limits = {});
    ~http_listener();  // stops serving; open scrapes are dropped
    http_listener(const http_listener&) = delete;
    http_listener& operator=(const http_listener&) = delete;

    // The bound address (with the port the system chose for port 0).
    const endpoint& local() const { return local_; }

  private:
    struct impl;  // Asio stays out of this header: it is heavy, and only metrics_http.cpp needs it
    explicit http_listener(std::unique_ptr<impl> i, endpoint local);
    std::unique_ptr<impl> impl_;
    endpoint local_;
};

}  // namespace vcuda::metrics
