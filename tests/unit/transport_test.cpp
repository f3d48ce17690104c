// Transport tests over real sockets, Unix domain and TCP on 127.0.0.1: payload sizes from 0 bytes to 512 MiB,
// partial reads, peers that vanish mid-frame, deadlines, 100 concurrent connections, a 10,000-frame batch,
// addresses, refused connections and listener shutdown.
// Catch2 assertions are not thread-safe: helper threads only record what they saw; the test thread checks it.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <thread>

#include "test_support.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

using ms = std::chrono::milliseconds;

ms since(clock::time_point t0) { return std::chrono::duration_cast<ms>(clock::now() - t0); }

// A CALL frame whose payload is `payload`; metadata says which op and sequence it is.
outgoing_frame call_frame(const bytes& meta, std::span<const std::byte> payload, uint64_t sequence,
                          uint32_t lane = 0) {
    outgoing_frame f;
    f.header = header_for(frame_kind::call, sequence, lane);
    f.meta = meta;
    f.payload = payload;
    return f;
}

// The arguments a small_call_meta() carried.
std::pair<uint32_t, uint64_t> call_of(const frame& f) {
    auto* c = root_of<wire::Call>(f);
    return {c->op(), c->args() && c->args()->size() == 1 ? c->args()->Get(0) : ~uint64_t{0}};
}

// Answers every CALL with a REPLY that carries the call's op and first argument back, and the same payload.
// One thread per connection, as the server's sessions will have.
class echo_server {
  public:
    explicit echo_server(transport_kind k) : srv_(k) {
        acceptor_ = std::jthread([this] {
            for (;;) {
                auto s = srv_.lis.accept();
                if (!s) break;
                ++accepted_;
                sessions_.emplace_back([this, st = std::move(*s)]() mutable { serve(std::move(st)); });
            }
        });
    }
    ~echo_server() { stop(); }
    // Stops accepting and waits for every session to end (sessions end when their clients go); the counts are
    // final after this.
    void stop() {
        srv_.lis.close();
        if (acceptor_.joinable()) acceptor_.join();
        sessions_.clear();  // joins
    }
    const endpoint& address() const { return srv_.address(); }
    int accepted() const { return accepted_; }
    int errors() const { return errors_; }
    int frames() const { return frames_; }

  private:
    void serve(stream st) {
        frame_stream fs(std::move(st));
        for (;;) {
            auto f = fs.receive(after(30s), 30s);
            if (!f) {
                if (f.error().code != transport_errc::peer_lost) ++errors_;
                return;
            }
            if (f->kind() == frame_kind::goodbye) return;
            if (f->kind() != frame_kind::call) {
                ++errors_;
                return;
            }
            auto [op, arg] = call_of(*f);
            flatbuffers::FlatBufferBuilder b(64);
            auto outs = b.CreateVector(std::vector<uint64_t>{op, arg});
            b.Finish(wire::CreateReply(b, 0, outs));
            auto out = make_frame(frame_kind::reply, b, f->header.sequence, f->header.lane, 0, f->payload);
            if (!fs.send(out, after(30s))) {
                ++errors_;
                return;
            }
            ++frames_;
        }
    }

    test_server srv_;
    std::jthread acceptor_;
    std::vector<std::jthread> sessions_;
    std::atomic<int> accepted_{0}, errors_{0}, frames_{0};
};

}  // namespace

// ------------------------------------------------------------------ addresses

TEST_CASE("endpoint::parse accepts the documented forms", "[unit][transport]") {
    struct tcp_case {
        const char* text;
        const char* host;
        uint16_t port;
    };
    for (auto c :
         {tcp_case{"127.0.0.1:7300", "127.0.0.1", 7300}, tcp_case{"tcp://127.0.0.1:7300", "127.0.0.1", 7300},
          tcp_case{"gpu-host.example:1", "gpu-host.example", 1}, tcp_case{"localhost:0", "localhost", 0},
          tcp_case{"host:65535", "host", 65535}, tcp_case{":7300", "0.0.0.0", 7300},
          tcp_case{"[::1]:7300", "::1", 7300}, tcp_case{"tcp://[fe80::1]:80", "fe80::1", 80}}) {
        INFO(c.text);
        auto ep = endpoint::parse(c.text);
        REQUIRE(ep);
        CHECK(ep->type == endpoint::kind::tcp);
        CHECK(ep->host == c.host);
        CHECK(ep->port == c.port);
        auto again = endpoint::parse(ep->to_string());  // to_string() gives back a parseable address
        REQUIRE(again);
        CHECK(again->host == ep->host);
        CHECK(again->port == ep->port);
    }
    for (auto [text, path] : {std::pair{"unix:/run/vcuda.sock", "/run/vcuda.sock"},
                              std::pair{"unix:///run/vcuda.sock", "/run/vcuda.sock"},
                              std::pair{"unix:relative.sock", "relative.sock"}}) {
        INFO(text);
        auto ep = endpoint::parse(text);
        REQUIRE(ep);
        CHECK(ep->type == endpoint::kind::unix_socket);
        CHECK(ep->path == path);
        CHECK(ep->to_string() == "unix:" + std::string(path));
    }
    std::string longest = "unix:/" + std::string(106, 'a');  // 107 bytes of path: the most sun_path holds
    CHECK(endpoint::parse(longest));
}

TEST_CASE("endpoint::parse rejects malformed addresses with a reason", "[unit][transport]") {
    for (const char* text : {"", "host", "host:", "tcp://", "tcp://host", "host:65536", "host:99999999999",
                             "host:-1", "host:+80", "host:80x", "host: 80", "host:abc", "[::1]", "unix:"}) {
        INFO("'" << text << "'");
        auto ep = endpoint::parse(text);
        REQUIRE_FALSE(ep);
        CHECK_FALSE(ep.error().empty());
    }
    CHECK_FALSE(endpoint::parse("unix:/" + std::string(107, 'a')));  // 108 bytes: no room for the NUL
}

// ------------------------------------------------------------------ payload sizes

TEST_CASE("payloads from 0 bytes to 1 MiB arrive intact", "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));
    const bytes meta = call_meta();

    uint64_t seq = 0;
    for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20}) {
        INFO(size << " bytes");
        const bytes payload = pattern(size, size);
        transport_result<void> sent;
        std::jthread writer([&] { sent = out.send(call_frame(meta, payload, ++seq, 2), after(10s)); });
        auto f = in.receive(after(10s), 10s);
        writer.join();
        REQUIRE(sent);
        REQUIRE(f);
        CHECK(f->kind() == frame_kind::call);
        CHECK(f->header.sequence == seq);
        CHECK(f->header.lane == 2);
        CHECK((f->meta == meta));
        REQUIRE(f->payload.size() == size);
        CHECK((f->payload == payload));
    }
}

TEST_CASE("receive_into reuses the frame's buffers and set_limits applies to the frames after it",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));
    frame f;
    const std::byte* meta_buffer = nullptr;
    const std::byte* payload_buffer = nullptr;
    for (uint64_t i = 0; i < 20; ++i) {
        // Frames of decreasing size into one frame object: the buffers grown for the first are kept.
        const bytes meta = small_call_meta(9, i);
        const bytes payload = pattern(4096 - i, i);
        REQUIRE(out.send(call_frame(meta, payload, i + 1), after(5s)));
        REQUIRE(in.receive_into(f, after(5s), 5s));
        CHECK(call_of(f) == std::pair<uint32_t, uint64_t>{9, i});
        CHECK(f.header.sequence == i + 1);
        CHECK((f.payload == payload));
        if (i == 0) {
            meta_buffer = f.meta.data();
            payload_buffer = f.payload.data();
        }
        CHECK(f.meta.data() == meta_buffer);
        CHECK(f.payload.data() == payload_buffer);
    }
    // A frame without a payload leaves none behind from the one before.
    REQUIRE(out.send(call_frame(small_call_meta(9, 99), {}, 21), after(5s)));
    REQUIRE(in.receive_into(f, after(5s), 5s));
    CHECK(f.payload.empty());
    // Smaller limits from now on: a payload past them is refused before it is read.
    frame_limits small;
    small.max_payload = 1024;
    in.set_limits(small);
    REQUIRE(out.send(call_frame(small_call_meta(9, 100), pattern(1025, 1), 22), after(5s)));
    auto r = in.receive_into(f, after(5s), 5s);
    REQUIRE(!r);
    CHECK(r.error().code == transport_errc::protocol);
}

TEST_CASE("a 512 MiB payload arrives intact", "[unit][integration][transport][large]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    constexpr size_t size = size_t{512} << 20;
    static const bytes payload = pattern(size, 0x512);  // built once, shared by both transports
    REQUIRE(size <= frame_limits{}.max_payload);

    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));
    const bytes meta = small_call_meta(42, size);
    transport_result<void> sent;
    std::jthread writer([&] { sent = out.send(call_frame(meta, payload, 1), after(120s)); });

    // Over TCP the payload goes into a buffer the receiver supplies (as the server's staging pool will);
    // over the Unix socket into frame::payload.
    std::unique_ptr<std::byte[]> sink_buffer;
    payload_sink sink;
    if (kind == transport_kind::tcp)
        sink = [&](const frame_header& h, const std::vector<std::byte>&) {
            sink_buffer.reset(new std::byte[h.payload_len]);
            return sink_buffer.get();
        };
    auto f = in.receive(after(30s), 60s, sink);
    writer.join();
    REQUIRE(sent);
    REQUIRE(f);
    CHECK(call_of(*f) == std::pair<uint32_t, uint64_t>{42, size});
    REQUIRE(f->header.payload_len == size);
    const std::byte* got = kind == transport_kind::tcp ? sink_buffer.get() : f->payload.data();
    if (kind == transport_kind::tcp) CHECK(f->payload.empty());
    REQUIRE(got != nullptr);
    CHECK(std::memcmp(got, payload.data(), size) == 0);
    CHECK(std::memcmp(got + size - 8, payload.data() + size - 8, 8) == 0);
}

// ------------------------------------------------------------------ partial reads

TEST_CASE("a frame written one byte at a time arrives whole", "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream in(std::move(p.accepted));
    const bytes meta = small_call_meta(7, 0xFEED);
    const bytes payload = pattern(32, 7);
    const bytes wire_bytes = encode_frame(header_for(frame_kind::call, 99, 4), meta, payload);

    std::atomic<bool> ok{true};
    std::jthread writer([&] {
        for (std::byte b : wire_bytes) {
            if (::send(p.client.native_handle(), &b, 1, MSG_NOSIGNAL) != 1) ok = false;
            std::this_thread::sleep_for(100us);
        }
    });
    auto f = in.receive(after(10s), 10s);
    writer.join();
    REQUIRE(ok);
    REQUIRE(f);
    CHECK(f->header.sequence == 99);
    CHECK(f->header.lane == 4);
    CHECK(call_of(*f) == std::pair<uint32_t, uint64_t>{7, 0xFEED});
    CHECK((f->payload == payload));
}

TEST_CASE("a frame split at every header field and section boundary arrives whole",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream in(std::move(p.accepted));
    const bytes meta = small_call_meta(8, 0xBEEF);
    const bytes payload = pattern(48, 8);
    const size_t m = frame_header_size + meta.size(), end = m + payload.size();
    // magic | version | kind | flags | lane | sequence | meta_len | reserved | payload_len | meta | payload
    const std::vector<size_t> splits = {
        1, 4, 6, 8, 12, 16, 24, 28, 32, 39, 40, 41, 40 + meta.size() / 2, m - 1, m, m + 1, end - 1};
    uint64_t seq = 0;
    for (size_t at : splits) {
        INFO("split after byte " << at);
        const bytes wire_bytes = encode_frame(header_for(frame_kind::call, ++seq), meta, payload);
        std::atomic<bool> ok{true};
        std::jthread writer([&] {
            ok = write_raw(p.client.native_handle(), std::span(wire_bytes).first(at));
            std::this_thread::sleep_for(2ms);  // the reader sees the first part alone
            ok = ok && write_raw(p.client.native_handle(), std::span(wire_bytes).subspan(at));
        });
        auto f = in.receive(after(10s), 10s);
        writer.join();
        REQUIRE(ok);
        REQUIRE(f);
        CHECK(f->header.sequence == seq);
        CHECK(call_of(*f) == std::pair<uint32_t, uint64_t>{8, 0xBEEF});
        CHECK((f->payload == payload));
    }
}

// ------------------------------------------------------------------ lost peers

TEST_CASE("a peer that vanishes mid-frame is reported once as peer_lost and then as closed",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    const bytes meta = call_meta();
    const bytes payload = pattern(4096, 5);
    const bytes wire_bytes = encode_frame(header_for(frame_kind::call, 1), meta, payload);
    const size_t after_meta = frame_header_size + meta.size();
    const auto [where, cut] = GENERATE_COPY(values<std::pair<const char*, size_t>>({
        {"before the first byte", 0},
        {"after half the header", frame_header_size / 2},
        {"after the header", frame_header_size},
        {"in the metadata", frame_header_size + meta.size() / 2},
        {"after the metadata", after_meta},
        {"in the payload", after_meta + payload.size() / 2},
        {"one byte short", wire_bytes.size() - 1},
    }));
    INFO(name_of(kind) << ", peer closes " << where);
    connected_pair p(kind);
    frame_stream in(std::move(p.accepted));
    REQUIRE(write_raw(p.client.native_handle(), std::span(wire_bytes).first(cut)));
    p.client = stream();  // closes the socket

    auto first = in.receive(after(5s), 5s);
    REQUIRE_FALSE(first);
    CHECK(first.error().code == transport_errc::peer_lost);
    auto second = in.receive(after(5s), 5s);
    REQUIRE_FALSE(second);
    CHECK(second.error().code == transport_errc::closed);
    CHECK_FALSE(in.raw().is_open());
    auto send = in.send(call_frame(meta, {}, 2), after(1s));
    REQUIRE_FALSE(send);
    CHECK(send.error().code == transport_errc::closed);
}

TEST_CASE("sending to a peer that is gone reports peer_lost once and raises no SIGPIPE",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream out(std::move(p.client));
    p.accepted = stream();
    const bytes meta = small_call_meta(1, 1);
    const bytes big(16 << 20);  // more than both socket buffers hold: the write must meet the closed peer
    std::vector<transport_errc> errors;
    for (int i = 0; i < 3; ++i) {
        auto r = out.send(call_frame(meta, big, i), after(10s));
        if (!r) errors.push_back(r.error().code);
    }
    REQUIRE(errors.size() >= 2);
    CHECK(errors[0] == transport_errc::peer_lost);
    for (size_t i = 1; i < errors.size(); ++i) CHECK(errors[i] == transport_errc::closed);
}

TEST_CASE("shutdown ends a blocked receive with closed and the peer sees peer_lost",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream a(std::move(p.client)), b(std::move(p.accepted));
    std::optional<transport_errc> got;
    std::jthread reader([&] {
        auto r = a.receive(after(10s), 10s);
        got = r ? std::nullopt : std::optional(r.error().code);
    });
    std::this_thread::sleep_for(20ms);
    const auto t0 = clock::now();
    a.shutdown();
    reader.join();
    CHECK(since(t0) < 2s);
    REQUIRE(got);
    CHECK(*got == transport_errc::closed);
    auto r = b.receive(after(5s), 5s);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == transport_errc::peer_lost);
}

// ------------------------------------------------------------------ deadlines

TEST_CASE("receive deadlines end waits and leave the stream usable", "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));
    const bytes meta = small_call_meta(3, 3);

    SECTION("no frame within the first-byte deadline") {
        const auto t0 = clock::now();
        auto r = in.receive(after(50ms), 5s);
        const auto took = since(t0);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::timeout);
        CHECK(took >= 50ms);
        CHECK(took < 1s);
        CHECK(in.raw().is_open());
        // the connection is intact in both directions
        REQUIRE(out.send(call_frame(meta, {}, 11), after(5s)));
        auto f = in.receive(after(5s), 5s);
        REQUIRE(f);
        CHECK(f->header.sequence == 11);
        REQUIRE(in.send(call_frame(meta, {}, 12), after(5s)));
        auto g = out.receive(after(5s), 5s);
        REQUIRE(g);
        CHECK(g->header.sequence == 12);
    }
    SECTION("a frame that stalls after its first bytes times out after `rest`") {
        const bytes wire_bytes = encode_frame(header_for(frame_kind::call, 1), meta, {});
        REQUIRE(write_raw(out.raw().native_handle(), std::span(wire_bytes).first(20)));
        const auto t0 = clock::now();
        auto r = in.receive(after(5s), 50ms);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::timeout);
        CHECK(since(t0) < 1s);
    }
    SECTION("a send the peer does not read gives up at its deadline") {
        const bytes big(64 << 20);
        const auto t0 = clock::now();
        auto r = out.send(call_frame(meta, big, 1), after(100ms));
        const auto took = since(t0);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::timeout);
        CHECK(took >= 100ms);
        CHECK(took < 2s);
    }
}

// ------------------------------------------------------------------ many connections, many frames

TEST_CASE("100 concurrent connections each exchange frames with an echo server",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    constexpr int clients = 100, per_client = 20;
    echo_server server(kind);
    std::latch all_connected(clients);
    std::atomic<int> connect_failures{0}, bad_replies{0}, replies{0};
    {
        std::vector<std::jthread> threads;
        for (int c = 0; c < clients; ++c)
            threads.emplace_back([&, c] {
                auto s = stream::connect(server.address(), 10s);
                all_connected.count_down();
                if (!s) {
                    ++connect_failures;
                    return;
                }
                all_connected.wait();  // every connection is open before any frame moves
                frame_stream fs(std::move(*s));
                for (int i = 0; i < per_client; ++i) {
                    const uint64_t seq = uint64_t(c) << 32 | uint64_t(i);
                    const bytes meta = small_call_meta(static_cast<uint32_t>(c), seq * 3);
                    const bytes payload = pattern(size_t(c * 37 + i * 101) % 8192, seq);
                    if (!fs.send(call_frame(meta, payload, seq, static_cast<uint32_t>(c)), after(30s))) {
                        ++bad_replies;
                        return;
                    }
                    auto r = fs.receive(after(30s), 30s);
                    if (!r || r->kind() != frame_kind::reply || r->header.sequence != seq ||
                        r->header.lane != static_cast<uint32_t>(c) || r->payload != payload) {
                        ++bad_replies;
                        return;
                    }
                    auto* reply = root_of<wire::Reply>(*r);
                    if (!reply->outs() || reply->outs()->size() != 2 ||
                        reply->outs()->Get(0) != uint64_t(c) || reply->outs()->Get(1) != seq * 3) {
                        ++bad_replies;
                        return;
                    }
                    ++replies;
                }
                outgoing_frame bye;
                bye.header = header_for(frame_kind::goodbye);
                (void)fs.send(bye, after(5s));
            });
    }
    server.stop();  // every session has ended: the server's counts are final
    CHECK(connect_failures == 0);
    CHECK(bad_replies == 0);
    CHECK(replies == clients * per_client);
    CHECK(server.accepted() == clients);
    CHECK(server.frames() == clients * per_client);
    CHECK(server.errors() == 0);
}

TEST_CASE("a batch of 10000 small frames sent with one send() arrives complete and in order",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    constexpr size_t count = 10000;
    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));

    std::vector<bytes> metas(count), payloads(count);
    std::vector<outgoing_frame> batch(count);
    for (size_t i = 0; i < count; ++i) {
        metas[i] = small_call_meta(static_cast<uint32_t>(i), i * 7);
        if (i % 10 == 0) payloads[i] = pattern(i % 64, i);
        batch[i] = call_frame(metas[i], payloads[i], 1000 + i, static_cast<uint32_t>(i % 4));
        if (i % 3 == 0) batch[i].header.flags = frame_flags::no_reply;
    }
    transport_result<void> sent;
    std::jthread writer([&] { sent = out.send(batch, after(30s)); });

    size_t in_order = 0;
    for (size_t i = 0; i < count; ++i) {
        auto f = in.receive(after(10s), 10s);
        REQUIRE(f);
        const bool ok = f->header.sequence == 1000 + i && f->header.lane == i % 4 &&
                        f->header.flags == (i % 3 == 0 ? frame_flags::no_reply : 0u) &&
                        call_of(*f) == std::pair<uint32_t, uint64_t>{static_cast<uint32_t>(i), i * 7} &&
                        f->payload == payloads[i];
        if (!ok) FAIL("frame " << i << " arrived as sequence " << f->header.sequence);
        ++in_order;
    }
    writer.join();
    REQUIRE(sent);
    CHECK(in_order == count);
    auto extra = in.receive(after(50ms), 1s);  // nothing more than was sent
    REQUIRE_FALSE(extra);
    CHECK(extra.error().code == transport_errc::timeout);
}

TEST_CASE("frames sent from several threads on one stream never interleave",
          "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    constexpr int threads = 4, per_thread = 300;
    connected_pair p(kind);
    frame_stream out(std::move(p.client)), in(std::move(p.accepted));
    std::atomic<int> send_failures{0};
    std::vector<std::jthread> senders;
    for (int t = 0; t < threads; ++t)
        senders.emplace_back([&, t] {
            for (int i = 0; i < per_thread; ++i) {
                const uint64_t seq = uint64_t(t) << 32 | uint64_t(i);
                const bytes meta = small_call_meta(static_cast<uint32_t>(t), seq);
                const bytes payload = pattern(size_t(i * 997) % 20000, seq);
                if (!out.send(call_frame(meta, payload, seq, static_cast<uint32_t>(t)), after(30s)))
                    ++send_failures;
            }
        });
    std::vector<int> next(threads, 0);
    for (int n = 0; n < threads * per_thread; ++n) {
        auto f = in.receive(after(10s), 10s);
        REQUIRE(f);
        const uint32_t t = f->header.lane;
        REQUIRE(t < static_cast<uint32_t>(threads));
        const uint64_t seq = f->header.sequence;
        REQUIRE(seq == (uint64_t(t) << 32 | uint64_t(next[t])));  // each sender's frames in its own order
        REQUIRE((f->payload == pattern(size_t(next[t] * 997) % 20000, seq)));
        ++next[t];
    }
    senders.clear();
    CHECK(send_failures == 0);
}

// ------------------------------------------------------------------ connecting and listening

TEST_CASE("connecting where nothing listens is refused within the timeout",
          "[unit][integration][transport]") {
    SECTION("tcp port with no listener") {
        uint16_t port;
        {
            test_server gone(transport_kind::tcp);
            port = gone.address().port;
        }
        auto ep = endpoint::parse("127.0.0.1:" + std::to_string(port));
        REQUIRE(ep);
        const auto t0 = clock::now();
        auto s = stream::connect(*ep, 2s);
        REQUIRE_FALSE(s);
        CHECK(s.error().code == transport_errc::refused);
        CHECK(since(t0) < 2s);
        CHECK(s.error().message.find(ep->to_string()) != std::string::npos);
    }
    SECTION("unix socket path that does not exist") {
        temp_dir dir;
        auto ep = endpoint::parse("unix:" + (dir.path() / "nobody.sock").string());
        REQUIRE(ep);
        auto s = stream::connect(*ep, 2s);
        REQUIRE_FALSE(s);
        CHECK(s.error().code == transport_errc::refused);
    }
    SECTION("stale unix socket file left by a dead server") {
        temp_dir dir;
        const std::string path = (dir.path() / "stale.sock").string();
        int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
        ::close(fd);  // the file stays, nobody listens
        auto ep = endpoint::parse("unix:" + path);
        REQUIRE(ep);
        auto s = stream::connect(*ep, 2s);
        REQUIRE_FALSE(s);
        CHECK(s.error().code == transport_errc::refused);
        // a new listener replaces the stale file
        auto l = listener::listen(*ep);
        REQUIRE(l);
        CHECK(stream::connect(*ep, 2s));
    }
}

TEST_CASE("listener reports its port and hands out connections", "[unit][integration][transport]") {
    test_server srv(transport_kind::tcp);
    CHECK(srv.address().port != 0);
    CHECK(srv.address().host == "127.0.0.1");
    auto c = stream::connect(srv.address(), 2s);
    REQUIRE(c);
    auto a = srv.lis.accept(after(2s));
    REQUIRE(a);
    CHECK(a->peer_description().find("127.0.0.1:") == 0);
    for (int fd : {c->native_handle(), a->native_handle()}) {
        int nodelay = 0;
        socklen_t len = sizeof nodelay;
        REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0);
        CHECK(nodelay != 0);  // small calls must not wait for Nagle
    }
    SECTION("accept with a deadline and nobody connecting times out") {
        const auto t0 = clock::now();
        auto none = srv.lis.accept(after(50ms));
        REQUIRE_FALSE(none);
        CHECK(none.error().code == transport_errc::timeout);
        CHECK(since(t0) < 1s);
    }
}

TEST_CASE("listener::close ends a blocked accept", "[unit][integration][transport]") {
    const auto kind = GENERATE(transport_kind::unix_socket, transport_kind::tcp);
    INFO(name_of(kind));
    test_server srv(kind);
    std::optional<transport_errc> got;
    std::jthread acceptor([&] {
        auto s = srv.lis.accept();  // no deadline: only close() can end it
        got = s ? std::nullopt : std::optional(s.error().code);
    });
    std::this_thread::sleep_for(20ms);
    const auto t0 = clock::now();
    srv.lis.close();
    acceptor.join();
    CHECK(since(t0) < 1s);
    REQUIRE(got);
    CHECK(*got == transport_errc::closed);
    auto again = srv.lis.accept(after(1s));
    REQUIRE_FALSE(again);
    CHECK(again.error().code == transport_errc::closed);
}

TEST_CASE("a unix listener never takes over a socket another process serves",
          "[unit][integration][transport]") {
    test_server first(transport_kind::unix_socket);
    {
        auto second = listener::listen(first.address());
        REQUIRE_FALSE(second);
        CHECK(second.error().message.find("already served") != std::string::npos);
    }
    // the first server's socket file is still there and still answers
    auto c = stream::connect(first.address(), 2s);
    REQUIRE(c);
    REQUIRE(first.lis.accept(after(2s)));
}

// --isolation process: the parent reads a connection's HELLO, then hands the socket to a worker process;
// frames that came with it (a moving server sends its state right after HELLO) must reach the worker.
TEST_CASE("bytes read ahead of a frame go with the socket to the stream that takes it over",
          "[unit][integration][transport]") {
    connected_pair p(transport_kind::tcp);
    frame_stream out(std::move(p.client));
    std::vector<outgoing_frame> three;
    const bytes meta[3] = {small_call_meta(9, 1), small_call_meta(9, 2), small_call_meta(9, 3)};
    const bytes payload = pattern(3000, 7);
    for (uint64_t i = 0; i < 3; ++i) three.push_back(call_frame(meta[i], payload, i + 1));
    REQUIRE(out.send(three, after(5s)));  // one write: the first read takes them all
    frame_stream parent(std::move(p.accepted));
    std::this_thread::sleep_for(50ms);
    auto first = parent.receive(after(5s), 5s);
    REQUIRE(first);
    CHECK(call_of(*first).second == 1);
    REQUIRE(parent.raw().buffered() > 0);
    auto ahead = parent.raw().take_buffered();
    CHECK(parent.raw().buffered() == 0);
    stream worker_side(::dup(parent.raw().native_handle()));
    REQUIRE(worker_side.put_back(ahead));
    frame_stream worker(std::move(worker_side));
    for (uint64_t i = 2; i <= 3; ++i) {
        auto f = worker.receive(after(5s), 5s);
        REQUIRE(f);
        CHECK(call_of(*f).second == i);
        CHECK((f->payload == payload));
    }
    // More than a stream's read buffer, or onto bytes not yet handed out, is refused.
    stream other(::dup(parent.raw().native_handle()));
    CHECK(!other.put_back(std::vector<std::byte>(128u << 10)));
}
