// Test helpers for the Prometheus endpoints (common/metrics_http.hpp): a raw HTTP exchange over a plain
// socket (CI has no curl to count on), a scrape, and reading one series' value out of the exposition text.
// Shared by tests/unit, tests/integration and mgmt/tests.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>

namespace vcuda::test {

// A connection to 127.0.0.1:port, closed when destroyed; -1 when the connection failed.
struct http_socket {
    int fd = -1;
    explicit http_socket(uint16_t port) {
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(fd);
            fd = -1;
        }
    }
    ~http_socket() {
        if (fd >= 0) ::close(fd);
    }
    http_socket(const http_socket&) = delete;
    http_socket& operator=(const http_socket&) = delete;
    bool send(const std::string& bytes) const {
        size_t done = 0;
        while (done < bytes.size()) {
            ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return false;
            done += static_cast<size_t>(n);
        }
        return true;
    }
    // Everything the peer sends until it closes; what came so far when `timeout` passes first (then
    // `closed`, when given, is false).
    std::string receive_all(std::chrono::milliseconds timeout, bool* closed = nullptr) const {
        std::string out;
        const auto until = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                until - std::chrono::steady_clock::now());
            pollfd p{fd, POLLIN, 0};
            if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
            char buf[4096];
            ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) {
                if (closed) *closed = true;
                return out;
            }
            out.append(buf, static_cast<size_t>(n));
        }
        if (closed) *closed = false;
        return out;
    }
};

// Sends `request` and returns the whole answer (status line, headers, body).
inline std::string http_exchange(uint16_t port, const std::string& request,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    http_socket s(port);
    if (s.fd < 0 || !s.send(request)) return {};
    return s.receive_all(timeout);
}

// GET /metrics: the whole answer.
inline std::string scrape(uint16_t port) {
    return http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: vcuda-test\r\n\r\n");
}

// The value of the sample written exactly as `series` (`name` or `name{a="b",...}`), if the text has it.
inline std::optional<double> metric(const std::string& text, const std::string& series) {
    const std::string key = "\n" + series + " ";
    auto at = text.find(key);
    if (at == std::string::npos) return std::nullopt;
    return std::stod(text.substr(at + key.size()));
}

// The port of "metrics at http://HOST:PORT/metrics" in a server's or manager's log; 0 when absent.
inline uint16_t metrics_port(const std::string& log) {
    static const std::regex at(R"(metrics at http://[^ ]*:(\d+)/metrics)");
    std::smatch m;
    return std::regex_search(log, m, at) ? static_cast<uint16_t>(std::stoi(m[1])) : 0;
}

}  // namespace vcuda::test
