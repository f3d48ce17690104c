#include "common/metrics_http.hpp"

// Boost 1.74 turns Asio's co_await support on for clang only with the old Coroutines TS
// (<experimental/coroutine>); clang 14 (clang-tidy's) has C++20 coroutines and libstdc++'s <coroutine>.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && __has_include(<coroutine>)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#define BOOST_ASIO_HAS_STD_COROUTINE 1
#endif

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <cmath>
#include <thread>

#include "common/log.hpp"

namespace vcuda::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// ---------------------------------------------------------------- exposition

namespace {

const char* type_name(metric_type t) {
    switch (t) {
        case metric_type::counter:
            return "counter";
        case metric_type::gauge:
            return "gauge";
        case metric_type::summary:
            return "summary";
    }
    return "untyped";
}

// HELP text escapes \ and newline; label values also ".
void append_escaped(std::string& out, std::string_view text, bool quote) {
    for (char c : text) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else if (c == '"' && quote)
            out += "\\\"";
        else
            out += c;
    }
}

}  // namespace

void exposition::family(std::string_view name, metric_type type, std::string_view help) {
    text_ += fmt::format("# HELP {} ", name);
    append_escaped(text_, help, false);
    text_ += fmt::format("\n# TYPE {} {}\n", name, type_name(type));
}

void exposition::write_name_labels(std::string_view name, const labels& l) {
    text_ += name;
    if (l.empty()) return;
    text_ += '{';
    for (size_t i = 0; i < l.size(); ++i) {
        text_ += fmt::format("{}{}=\"", i ? "," : "", l[i].first);
        append_escaped(text_, l[i].second, true);
        text_ += '"';
    }
    text_ += '}';
}

void exposition::sample(std::string_view name, const labels& l, double value) {
    write_name_labels(name, l);
    if (std::isnan(value))
        text_ += " NaN\n";
    else if (std::isinf(value))
        text_ += value > 0 ? " +Inf\n" : " -Inf\n";
    else
        text_ += fmt::format(" {}\n", value);
}

void exposition::summary(std::string_view name, std::string_view help, uint64_t count, double sum_seconds) {
    family(name, metric_type::summary, help);
    sample(fmt::format("{}_sum", name), sum_seconds);
    sample(fmt::format("{}_count", name), count);
}

// ---------------------------------------------------------------- the listener

result<endpoint, std::string> parse_listen_address(const std::string& text, bool insecure) {
    auto ep = endpoint::parse(text);
    if (!ep) return ep;
    if (ep->type != endpoint::kind::tcp)
        return unexpected{
            std::string("metrics are served over TCP only: write HOST:PORT, e.g. 127.0.0.1:9400")};
    if (is_loopback(ep->host)) return ep;
    if (!insecure)
        return unexpected{
            std::string("refusing to serve metrics on a network address: the page has no authentication and "
                        "names tenants, "
                        "leases and clients. Listen on 127.0.0.1 (a local Prometheus agent, or a proxy with "
                        "authentication, "
                        "can take it from there), or add --insecure on a network you trust")};
    VCUDA_LOG_WARN(
        "--metrics-listen {} with --insecure: anyone who reaches it reads the metrics, tenant and lease "
        "names included",
        text);
    return ep;
}

struct http_listener::impl {
    asio::io_context io{1};
    tcp::acceptor acceptor{io};
    collect_fn collect;
    http_limits limits;
    int open = 0;  // connections being served; only the listener's thread touches it
    std::thread thread;

    asio::awaitable<void> accept_loop();
    asio::awaitable<void> serve(beast::tcp_stream stream);
    http::response<http::string_body> answer(const http::request<http::empty_body>& req);
};

asio::awaitable<void> http_listener::impl::accept_loop() {
    for (;;) {
        boost::system::error_code ec;
        tcp::socket s = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
        if (ec == asio::error::operation_aborted) co_return;
        if (ec) {  // out of descriptors, most likely: back off rather than spin
            VCUDA_LOG_WARN("metrics: accept failed: {}; retrying in 100 ms", ec.message());
            asio::steady_timer t(io, std::chrono::milliseconds(100));
            co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        if (open >= limits.max_connections) {
            VCUDA_LOG_DEBUG("metrics: {} scrapes open already; closing a new connection", open);
            s.close(ec);
            continue;
        }
        ++open;
        asio::co_spawn(io, serve(beast::tcp_stream(std::move(s))), [this](const std::exception_ptr& e) {
            --open;
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                VCUDA_LOG_WARN("metrics: a scrape failed: {}", x.what());
            }
        });
    }
}

asio::awaitable<void> http_listener::impl::serve(beast::tcp_stream stream) {
    boost::system::error_code ec;
    beast::flat_buffer buffer(limits.max_request_bytes);
    http::request_parser<http::empty_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(limits.max_request_bytes));
    parser.body_limit(0);  // a scrape has no body; one that announces a body is refused
    stream.expires_after(limits.request_deadline);
    co_await http::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {  // malformed, too large, or too slow: nothing is owed to such a peer
        VCUDA_LOG_DEBUG("metrics: request not read: {}", ec.message());
        co_return;
    }
    auto res = answer(parser.get());
    stream.expires_after(limits.request_deadline);  // a reader too slow to take the answer is dropped too
    co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
}

http::response<http::string_body> http_listener::impl::answer(const http::request<http::empty_body>& req) {
    http::response<http::string_body> res;
    res.version(req.version());
    res.keep_alive(false);  // one scrape per connection: nothing to time out between requests
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") {
        res.result(http::status::not_found);
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = "not found: metrics are at /metrics\n";
    } else if (req.method() != http::verb::get) {
        res.result(http::status::method_not_allowed);
        res.set(http::field::allow, "GET");
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = "only GET /metrics is served\n";
    } else {
        res.result(http::status::ok);
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        res.body() = collect();
    }
    res.prepare_payload();
    return res;
}

result<std::unique_ptr<http_listener>, std::string> http_listener::start(const endpoint& ep,
                                                                         collect_fn collect,
                                                                         http_limits limits) {
    if (ep.type != endpoint::kind::tcp)
        return unexpected{"metrics are served over TCP only (HOST:PORT, e.g. 127.0.0.1:9400), not " +
                          ep.to_string()};
    auto i = std::make_unique<impl>();
    i->collect = std::move(collect);
    i->limits = limits;
    boost::system::error_code ec;
    tcp::resolver resolver(i->io);
    auto found = resolver.resolve(ep.host, std::to_string(ep.port), tcp::resolver::passive, ec);
    if (ec || found.empty())
        return unexpected{"cannot resolve " + ep.to_string() + ": " + (ec ? ec.message() : "no address")};
    const tcp::endpoint at = found.begin()->endpoint();
    i->acceptor.open(at.protocol(), ec);
    if (!ec) i->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) i->acceptor.bind(at, ec);
    if (!ec) i->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return unexpected{"cannot listen on " + ep.to_string() + ": " + ec.message()};
    endpoint local = ep;
    local.host = i->acceptor.local_endpoint().address().to_string();
    local.port = i->acceptor.local_endpoint().port();
    asio::co_spawn(i->io, i->accept_loop(), asio::detached);
    i->thread = std::thread([io = &i->io] { io->run(); });
    return std::unique_ptr<http_listener>(new http_listener(std::move(i), std::move(local)));
}

http_listener::http_listener(std::unique_ptr<impl> i, endpoint local)
    : impl_(std::move(i)), local_(std::move(local)) {}

http_listener::~http_listener() {
    impl_->io.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace vcuda::metrics
