// TLS over TCP (common/tls.hpp) with throw-away certificates made at test time: frames both ways, large
// payloads read and written at once; what an attacker on the wire sees (no plaintext) and what tampering does
// (the connection fails, no altered byte is delivered); and every misconfiguration a user can make, each with
// its message and none hanging: the wrong CA, the wrong name, a plain client on a TLS listener and the other
// way round, mutual TLS without a client certificate or with one from another CA, bad certificate files.
// Catch2 assertions are not thread-safe: helper threads only record what they saw; the test thread checks it.
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "common/tls.hpp"
#include "test_support.hpp"
#include "tests/tls/test_certs.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

struct certs {
    temp_dir dir;
    test_cert_files files;
    certs() {
        if (auto why = write_test_certs(dir.path().string(), files); !why.empty())
            throw std::runtime_error(why);
    }
    std::shared_ptr<const tls_context> server(bool mutual = false) const {
        auto c = tls_context::server({files.server_cert, files.server_key, mutual ? files.ca : ""});
        if (!c) throw std::runtime_error(c.error());
        return *c;
    }
    std::shared_ptr<const tls_context> client(const std::string& ca, const std::string& cert = "",
                                              const std::string& key = "") const {
        auto c = tls_context::client({cert, key, ca});
        if (!c) throw std::runtime_error(c.error());
        return *c;
    }
};

// One TLS (or plain, with a null context) connection's server side on its own thread: the handshake, then
// every frame echoed back until the client goes.
class echo_server {
  public:
    explicit echo_server(std::shared_ptr<const tls_context> tls)
        : srv_(transport_kind::tcp), tls_(std::move(tls)) {
        thread_ = std::jthread([this] {
            auto s = srv_.lis.accept(after(10s));
            if (!s) return;
            frame_stream fs(std::move(*s));
            if (tls_) {
                auto t = accept_tls(fs, *tls_, after(10s));
                handshake_error_ = t ? "" : t.error().message;
                handshake_done_ = true;
                if (!t) return;
                subject_ = fs.raw().tls_peer_subject();
            } else {
                handshake_done_ = true;
            }
            for (;;) {
                auto f = fs.receive(after(10s), 10s);
                if (!f) {
                    read_error_ = f.error().message;
                    if (!tls_ && f.error().code == transport_errc::protocol)
                        send_wire_error(fs, wire_errc::verify_failed, f.error().message);
                    return;
                }
                ++frames_;
                outgoing_frame o{f->header, f->meta, f->payload};
                if (!fs.send(o, after(10s))) return;
            }
        });
    }
    void join() { thread_.join(); }
    const endpoint& address() const { return srv_.address(); }
    std::string handshake_error() const { return handshake_error_; }
    std::string read_error() const { return read_error_; }
    std::string subject() const { return subject_; }
    int frames() const { return frames_; }

  private:
    test_server srv_;
    std::shared_ptr<const tls_context> tls_;
    std::string handshake_error_, read_error_, subject_;
    std::atomic<bool> handshake_done_{false};
    std::atomic<int> frames_{0};
    std::jthread thread_;
};

outgoing_frame call_with(const bytes& meta, std::span<const std::byte> payload, uint64_t seq) {
    outgoing_frame f;
    f.header = header_for(frame_kind::call, seq);
    f.meta = meta;
    f.payload = payload;
    return f;
}

// A frame out and its echo back, compared; "" when they match, else what went wrong.
std::string round_trip(frame_stream& fs, std::span<const std::byte> payload, uint64_t seq) {
    auto meta = small_call_meta(7, seq);
    if (auto r = fs.send(call_with(meta, payload, seq), after(20s)); !r) return "send: " + r.error().message;
    auto f = fs.receive(after(20s), 20s);
    if (!f) return "receive: " + f.error().message;
    if (f->header.sequence != seq) return "wrong sequence";
    if (f->payload.size() != payload.size() ||
        !std::equal(payload.begin(), payload.end(), f->payload.begin()))
        return "payload differs";
    return {};
}

// The message of a wire error frame that answered a frame sent on `fs`, or what came instead.
std::string answer_to_a_frame(frame_stream& fs) {
    auto meta = hello_meta();
    outgoing_frame o{header_for(frame_kind::hello), meta, {}};
    if (auto r = fs.send(o, after(5s)); !r) return "send failed: " + r.error().message;
    auto f = fs.receive(after(5s), 5s);
    if (!f) return "receive failed: " + f.error().message;
    if (f->kind() != frame_kind::error) return "not an error frame";
    auto* e = root_of<wire::Error>(*f);
    return e->message() ? e->message()->str() : "";
}

// Copies bytes between a client and the real server, keeping what went each way; once `tamper` is set it
// flips one bit of the next client bytes it forwards: an attacker on the path.
class relay {
  public:
    explicit relay(const endpoint& to) : front_(transport_kind::tcp) {
        thread_ = std::jthread([this, to] {
            auto a = front_.lis.accept(after(10s));
            auto b = stream::connect(to, 5s, nullptr);
            if (!a || !b) return;
            int fds[2] = {a->native_handle(), b->native_handle()};
            char buf[65536];
            for (;;) {
                pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
                if (::poll(p, 2, 10000) <= 0) return;
                for (int i = 0; i < 2; ++i) {
                    if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                    ssize_t n = ::recv(fds[i], buf, sizeof buf, 0);
                    if (n <= 0) return;
                    std::lock_guard lock(mu_);
                    (i == 0 ? upstream_ : downstream_).append(buf, static_cast<size_t>(n));
                    if (i == 0 && tamper.exchange(false)) buf[n / 2] ^= 0x20;
                    if (::send(fds[1 - i], buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) return;
                }
            }
        });
    }
    const endpoint& address() const { return front_.address(); }
    std::string seen() {
        std::lock_guard lock(mu_);
        return upstream_ + downstream_;
    }
    std::atomic<bool> tamper{false};

  private:
    test_server front_;
    std::mutex mu_;
    std::string upstream_, downstream_;
    std::jthread thread_;
};

// A client's first round trip after connect, or why it failed (connect included).
std::string first_round_trip(transport_result<stream> s) {
    if (!s) return s.error().message;
    frame_stream fs(std::move(*s));
    auto why = round_trip(fs, {}, 1);
    fs.shutdown();
    return why;
}

bool contains(const std::string& hay, const std::string& needle) {
    return hay.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("tls: frames both ways, small and large, with a writer and a reader at once", "[unit][tls]") {
    certs c;
    echo_server srv(c.server());
    auto s = stream::connect(srv.address(), 5s, c.client(c.files.ca).get());
    REQUIRE(s);
    CHECK(s->is_tls());
    frame_stream fs(std::move(*s));
    CHECK(round_trip(fs, {}, 1).empty());
    auto small = pattern(100, 1);
    CHECK(round_trip(fs, small, 2).empty());
    // 8 MiB out while its echo already comes back: the TLS connection's reader and writer overlap.
    auto big = pattern(8u << 20, 2);
    std::string reader_error;
    std::jthread reader([&] {
        auto f = fs.receive(after(60s), 60s);
        if (!f)
            reader_error = f.error().message;
        else if (f->payload.size() != big.size() || !std::equal(big.begin(), big.end(), f->payload.begin()))
            reader_error = "payload differs";
    });
    auto meta = small_call_meta(7, 3);
    REQUIRE(fs.send(call_with(meta, big, 3), after(60s)));
    reader.join();
    CHECK(reader_error.empty());
    // A batch of many small frames in one write.
    std::vector<outgoing_frame> batch;
    for (uint64_t i = 0; i < 500; ++i) batch.push_back(call_with(meta, small, 100 + i));
    REQUIRE(fs.send(batch, after(20s)));
    for (uint64_t i = 0; i < 500; ++i) {
        auto f = fs.receive(after(20s), 20s);
        REQUIRE(f);
        CHECK(f->header.sequence == 100 + i);
    }
    fs.shutdown();
    srv.join();
    CHECK(srv.frames() == 503);
}

TEST_CASE("tls: an attacker on the wire sees no plaintext, and an altered byte ends the connection",
          "[unit][tls]") {
    certs c;
    const std::string secret = "the-session-key-0123456789abcdef-and-a-kernel-argument";
    auto secret_bytes = std::as_bytes(std::span(secret.data(), secret.size()));
    SECTION("plain TCP shows it (the test can see it)") {
        echo_server srv(nullptr);
        relay path(srv.address());
        auto s = stream::connect(path.address(), 5s, nullptr);
        REQUIRE(s);
        frame_stream fs(std::move(*s));
        CHECK(round_trip(fs, secret_bytes, 1).empty());
        CHECK(contains(path.seen(), secret));
        fs.shutdown();
    }
    SECTION("TLS hides it, both ways") {
        echo_server srv(c.server());
        relay path(srv.address());
        auto s = stream::connect(path.address(), 5s, c.client(c.files.ca).get());
        REQUIRE(s);
        frame_stream fs(std::move(*s));
        CHECK(round_trip(fs, secret_bytes, 1).empty());
        auto seen = path.seen();
        CHECK(seen.size() > 2 * secret.size());
        CHECK_FALSE(contains(seen, secret));
        CHECK_FALSE(contains(seen, "VCDA"));  // not even the frames' magic
        // One flipped bit: the server's TLS refuses the record; nothing altered reaches the frame layer.
        path.tamper = true;
        auto meta = small_call_meta(7, 2);
        REQUIRE(fs.send(call_with(meta, secret_bytes, 2), after(5s)));
        auto f = fs.receive(after(5s), 5s);
        CHECK_FALSE(f);
        fs.shutdown();
        srv.join();
        CHECK(srv.frames() == 1);
        CHECK(contains(srv.read_error(), "TLS"));
    }
}

TEST_CASE("tls: a client that does not trust the server's CA refuses it, and says why", "[unit][tls]") {
    certs c;
    echo_server srv(c.server());
    auto t0 = clock::now();
    auto s = stream::connect(srv.address(), 5s, c.client(c.files.other_ca).get());
    REQUIRE_FALSE(s);
    INFO(s.error().message);
    CHECK(contains(s.error().message, "the server's certificate is not trusted"));
    CHECK(contains(s.error().message, "VCUDA_TLS_CA"));
    CHECK(clock::now() - t0 < 3s);
    srv.join();
    CHECK_FALSE(srv.handshake_error().empty());
}

TEST_CASE("tls: a certificate for other names is refused", "[unit][tls]") {
    certs c;
    echo_server srv(c.server());
    auto ep = srv.address();
    auto s = stream::connect(ep, 5s, nullptr);
    REQUIRE(s);
    auto h = s->start_tls(*c.client(c.files.ca), "gpu.example.com", after(5s));
    REQUIRE_FALSE(h);
    INFO(h.error().message);
    CHECK(contains(h.error().message, "not for this address"));
}

TEST_CASE("tls: a plain client on a TLS listener is told to use TLS", "[unit][tls]") {
    certs c;
    echo_server srv(c.server());
    auto s = stream::connect(srv.address(), 5s, nullptr);
    REQUIRE(s);
    frame_stream fs(std::move(*s));
    auto answer = answer_to_a_frame(fs);
    INFO(answer);
    CHECK(contains(answer, "accepts TLS only"));
    CHECK(contains(answer, "VCUDA_TLS_CA"));
    srv.join();
}

TEST_CASE("tls: a TLS client on a plain listener fails at once, and says why", "[unit][tls]") {
    certs c;
    echo_server srv(nullptr);
    auto t0 = clock::now();
    auto s = stream::connect(srv.address(), 5s, c.client(c.files.ca).get());
    REQUIRE_FALSE(s);
    INFO(s.error().message);
    CHECK((contains(s.error().message, "does not speak TLS") ||
           contains(s.error().message, "closed the connection during the TLS handshake")));
    CHECK(clock::now() - t0 < 3s);
    srv.join();
}

TEST_CASE("tls: mutual TLS admits a client certificate its CA signed, and no other", "[unit][tls]") {
    certs c;
    SECTION("with the right certificate") {
        echo_server srv(c.server(true));
        auto s = stream::connect(srv.address(), 5s,
                                 c.client(c.files.ca, c.files.client_cert, c.files.client_key).get());
        REQUIRE(s);
        frame_stream fs(std::move(*s));
        CHECK(round_trip(fs, pattern(1000, 3), 1).empty());
        fs.shutdown();
        srv.join();
        CHECK(contains(srv.subject(), "vcuda test client"));
    }
    SECTION("without one") {
        echo_server srv(c.server(true));
        auto s = stream::connect(srv.address(), 5s, c.client(c.files.ca).get());
        // TLS 1.3: the client finishes its handshake before the server checks; it learns at its first read.
        std::string why = first_round_trip(std::move(s));
        INFO(why);
        CHECK(contains(why, "requires a client certificate"));
        srv.join();
        CHECK(contains(srv.handshake_error(), "no certificate"));
    }
    SECTION("with one from another CA") {
        echo_server srv(c.server(true));
        auto s = stream::connect(srv.address(), 5s,
                                 c.client(c.files.ca, c.files.other_cert, c.files.other_key).get());
        std::string why = first_round_trip(std::move(s));
        INFO(why);
        CHECK(contains(why, "does not accept this client certificate"));
        srv.join();
        CHECK_FALSE(srv.handshake_error().empty());
    }
}

TEST_CASE("tls: bad certificate files are reported with the file and the fault", "[unit][tls]") {
    certs c;
    auto missing = tls_context::server({c.dir.path().string() + "/nope.pem", c.files.server_key, ""});
    REQUIRE_FALSE(missing);
    CHECK(contains(missing.error(), "cannot read"));
    CHECK(contains(missing.error(), "nope.pem"));
    auto mismatched = tls_context::server({c.files.server_cert, c.files.client_key, ""});
    REQUIRE_FALSE(mismatched);
    INFO(mismatched.error());
    CHECK(contains(mismatched.error(), "is not the private key of the certificate"));
    auto swapped = tls_context::server({c.files.server_key, c.files.server_cert, ""});
    REQUIRE_FALSE(swapped);
    CHECK(contains(swapped.error(), "not a PEM certificate"));
    auto half = tls_context::client({c.files.client_cert, "", c.files.ca});
    REQUIRE_FALSE(half);
    CHECK(contains(half.error(), "needs its key"));
    auto bad_ca = tls_context::client({"", "", c.files.server_key});
    REQUIRE_FALSE(bad_ca);
    CHECK(contains(bad_ca.error(), "no PEM certificate"));
}

TEST_CASE("tls: the environment turns TLS on for every TCP connection a process makes", "[unit][tls]") {
    certs c;
    echo_server srv(c.server());
    ::setenv("VCUDA_TLS_CA", c.files.ca.c_str(), 1);
    auto s = stream::connect(srv.address(), 5s);
    ::unsetenv("VCUDA_TLS_CA");
    REQUIRE(s);
    CHECK(s->is_tls());
    frame_stream fs(std::move(*s));
    CHECK(round_trip(fs, pattern(64, 4), 1).empty());
    fs.shutdown();
    srv.join();
    ::setenv("VCUDA_TLS_CERT", c.files.client_cert.c_str(), 1);
    auto half = tls_context::from_environment();
    ::unsetenv("VCUDA_TLS_CERT");
    REQUIRE_FALSE(half);
    CHECK(contains(half.error(), "VCUDA_TLS_CA is not"));
    auto off = tls_context::from_environment();
    REQUIRE(off);
    CHECK(*off == nullptr);
}
