// Shared-memory frame rings: the byte rings alone (wraparound, full and empty, corrupt counters, the sealed
// mapping) and streams over real Unix socket pairs with rings attached (frames larger than the ring, the
// sleeping reader woken by the doorbell, descriptors passed alongside ring bytes, a peer that goes away).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "test_support.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

// Both sides of one set of rings in this process: the creator's mapping and the opener's.
struct ring_pair {
    std::unique_ptr<shm_rings> creator, opener;
    int fd = -1;
    explicit ring_pair(size_t ring_bytes) {
        auto c = shm_rings::create(ring_bytes, fd);
        REQUIRE(c);
        creator = std::move(*c);
        auto o = shm_rings::open(fd);
        REQUIRE(o);
        opener = std::move(*o);
    }
    ~ring_pair() {
        if (fd >= 0) close(fd);
    }
};

// Two streams over a connected Unix socket pair, each with its end of one set of rings attached, as the
// client and the server have them after HELLO.
struct ring_streams {
    connected_pair sockets{transport_kind::unix_socket};
    frame_stream client, server;
    explicit ring_streams(std::chrono::microseconds spin, size_t ring_bytes = 64u << 10)
        : client(std::move(sockets.client)), server(std::move(sockets.accepted)) {
        int fd = -1;
        auto c = shm_rings::create(ring_bytes, fd);
        REQUIRE(c);
        auto o = shm_rings::open(fd);
        close(fd);
        REQUIRE(o);
        server.raw().attach_rings(std::move(*c), spin);
        client.raw().attach_rings(std::move(*o), spin);
    }
};

outgoing_frame frame_with(const bytes& meta, std::span<const std::byte> payload, uint64_t seq) {
    outgoing_frame f;
    f.header = header_for(frame_kind::call, seq);
    f.meta = meta;
    f.payload = payload;
    return f;
}

}  // namespace

TEST_CASE("ring bytes wrap around the end intact, in pieces of every size", "[unit][shm]") {
    ring_pair rp(4096);
    auto& out = rp.opener->outbound();
    auto& in = rp.creator->inbound();
    std::mt19937_64 rng(7);
    const bytes sent = random_bytes(rng, 1 << 20);
    bytes got(sent.size());
    size_t w = 0, r = 0;
    while (r < sent.size()) {
        size_t want = std::min<size_t>(1 + rng() % 5000, sent.size() - w);
        size_t n = out.write_some(sent.data() + w, want);
        REQUIRE(n != SIZE_MAX);
        REQUIRE(n <= 4096);
        w += n;
        out.publish();
        size_t k = in.read_some(got.data() + r, 1 + rng() % 5000);
        REQUIRE(k != SIZE_MAX);
        r += k;
        REQUIRE(r <= w);
    }
    CHECK(got == sent);
    CHECK_FALSE(in.readable());
    CHECK(out.writable());
}

TEST_CASE("a full ring takes nothing more and an empty one gives nothing", "[unit][shm]") {
    ring_pair rp(4096);
    auto& out = rp.creator->outbound();
    auto& in = rp.opener->inbound();
    const bytes block = pattern(4096, 1);
    CHECK(out.write_some(block.data(), block.size()) == 4096);
    CHECK_FALSE(out.writable());
    CHECK(out.write_some(block.data(), 1) == 0);
    bytes got(8192);
    CHECK(in.read_some(got.data(), got.size()) == 0);  // nothing published yet
    out.publish();
    CHECK(in.read_some(got.data(), got.size()) == 4096);
    CHECK(std::equal(block.begin(), block.end(), got.begin()));
    CHECK(in.read_some(got.data(), 1) == 0);
    CHECK(out.writable());
}

TEST_CASE("the producer sees the consumer's room after a quarter of the ring or when it has read all",
          "[unit][shm]") {
    ring_pair rp(4096);
    auto& out = rp.creator->outbound();
    auto& in = rp.opener->inbound();
    const bytes block = pattern(4096, 3);
    REQUIRE(out.write_some(block.data(), block.size()) == 4096);
    out.publish();
    bytes got(4096);
    REQUIRE(in.read_some(got.data(), 100) == 100);
    CHECK_FALSE(out.writable());  // 100 bytes read: not published yet
    REQUIRE(in.read_some(got.data() + 100, 1024) == 1024);
    CHECK(out.writable());  // past a quarter
    CHECK(out.write_some(block.data(), 2000) == 1124);
    REQUIRE(in.read_some(got.data(), 4096) == 2972);
    CHECK(std::equal(block.begin() + 1124, block.end(), got.begin()));
    CHECK(out.write_some(block.data(), 4096) == 2972);  // everything read: all of it is room again
}

TEST_CASE("counters a peer corrupted read as an error, never as bytes", "[unit][shm]") {
    ring_pair rp(4096);
    auto& ctl = rp.creator->outbound().control();
    bytes buf(16);
    SECTION("head runs more than a ring ahead") {
        ctl.head.store(4097);
        CHECK(rp.opener->inbound().read_some(buf.data(), buf.size()) == SIZE_MAX);
    }
    SECTION("head moves backwards") {
        ctl.head.store(~uint64_t{0});
        CHECK(rp.opener->inbound().read_some(buf.data(), buf.size()) == SIZE_MAX);
    }
    SECTION("tail runs past what was written") {
        ctl.tail.store(12345);
        bytes full(4096);  // the producer reads the tail when it needs room
        CHECK(rp.creator->outbound().write_some(full.data(), full.size()) == 4096);
        CHECK(rp.creator->outbound().write_some(buf.data(), buf.size()) == SIZE_MAX);
    }
}

TEST_CASE("the opener cannot resize the rings and rejects a bad mapping", "[unit][shm]") {
    ring_pair rp(4096);
    CHECK(ftruncate(rp.fd, 4096) != 0);  // sealed: shrinking would fault the creator's reads
    int bad = memfd_create("not-rings", MFD_CLOEXEC);
    REQUIRE(bad >= 0);
    REQUIRE(ftruncate(bad, 3 * 4096 + 4096) == 0);
    auto r = shm_rings::open(bad);
    close(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().find("bad header") != std::string::npos);
    int fd2 = -1;
    CHECK_FALSE(shm_rings::create(5000, fd2));
    CHECK(fd2 == -1);
}

TEST_CASE("frames larger than the ring cross it whole, both ways, with and without spinning", "[unit][shm]") {
    const auto spin = GENERATE(std::chrono::microseconds(0), std::chrono::microseconds(50));
    INFO("spin " << spin.count() << " us");
    ring_streams rs(spin);
    const bytes meta = call_meta();
    for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20, size_t{5} << 20}) {
        INFO(size << " bytes");
        const bytes payload = pattern(size, size + 3);
        transport_result<void> sent;
        std::jthread writer([&] { sent = rs.client.send(frame_with(meta, payload, size + 1), after(10s)); });
        auto f = rs.server.receive(after(10s), 10s);
        writer.join();
        REQUIRE(sent);
        REQUIRE(f);
        CHECK(f->header.sequence == size + 1);
        CHECK((f->payload == payload));
        // And back, server to client.
        std::jthread replier([&] { sent = rs.server.send(frame_with(meta, payload, size + 2), after(10s)); });
        auto g = rs.client.receive(after(10s), 10s);
        replier.join();
        REQUIRE(sent);
        REQUIRE(g);
        CHECK((g->payload == payload));
    }
}

TEST_CASE("a sleeping reader is woken by the doorbell for every one of 2000 calls", "[unit][shm]") {
    ring_streams rs(std::chrono::microseconds(0));  // no spinning: every wait sleeps on the socket
    const bytes meta = call_meta();
    std::atomic<int> echoed{0};
    std::jthread server([&] {
        for (int i = 0; i < 2000; ++i) {
            auto f = rs.server.receive(after(10s), 10s);
            if (!f) return;
            if (!rs.server.send(frame_with(meta, f->payload, f->header.sequence), after(10s))) return;
            ++echoed;
        }
    });
    for (uint64_t i = 1; i <= 2000; ++i) {
        const bytes p = pattern(i % 300, i);
        REQUIRE(rs.client.send(frame_with(meta, p, i), after(10s)));
        auto r = rs.client.receive(after(10s), 10s);
        REQUIRE(r);
        REQUIRE(r->header.sequence == i);
        REQUIRE((r->payload == p));
    }
    server.join();
    CHECK(echoed == 2000);
}

TEST_CASE("descriptors sent with ring frames reach the reader with their frame", "[unit][shm]") {
    ring_streams rs(std::chrono::microseconds(0));
    const bytes meta = call_meta();
    for (int i = 0; i < 20; ++i) {
        int fd = memfd_create("passed", MFD_CLOEXEC);
        REQUIRE(fd >= 0);
        REQUIRE(ftruncate(fd, 4096 * (i + 1)) == 0);
        auto sent = rs.server.send(frame_with(meta, {}, i + 1), after(5s), fd);
        close(fd);
        REQUIRE(sent);
        auto f = rs.client.receive(after(5s), 5s);
        REQUIRE(f);
        int got = rs.client.raw().take_fd();
        REQUIRE(got >= 0);
        struct stat st {};
        REQUIRE(fstat(got, &st) == 0);
        CHECK(st.st_size == 4096 * (i + 1));
        close(got);
        CHECK(rs.client.raw().take_fd() == -1);  // nothing more came
    }
}

TEST_CASE("a peer that goes away ends a reader waiting on the rings and a writer blocked on a full ring",
          "[unit][shm]") {
    const auto spin = GENERATE(std::chrono::microseconds(0), std::chrono::microseconds(50));
    SECTION("reader") {
        ring_streams rs(spin);
        std::jthread closer([&] {
            std::this_thread::sleep_for(50ms);
            rs.server = frame_stream(stream());  // closes the server's socket
        });
        auto f = rs.client.receive(after(10s), 10s);
        REQUIRE_FALSE(f);
        CHECK(f.error().code == transport_errc::peer_lost);
    }
    SECTION("writer") {
        ring_streams rs(spin, 4096);
        const bytes big = pattern(1 << 20, 9);
        std::jthread closer([&] {
            std::this_thread::sleep_for(50ms);
            rs.server = frame_stream(stream());
        });
        auto sent = rs.client.send(frame_with(call_meta(), big, 1), after(10s));
        REQUIRE_FALSE(sent);
        CHECK(sent.error().code == transport_errc::peer_lost);
    }
}

TEST_CASE("a receive deadline ends a wait on empty rings and leaves the stream usable", "[unit][shm]") {
    ring_streams rs(std::chrono::microseconds(20));
    auto t0 = clock::now();
    auto f = rs.client.receive(after(100ms), 10s);
    REQUIRE_FALSE(f);
    CHECK(f.error().code == transport_errc::timeout);
    CHECK(clock::now() - t0 >= 90ms);
    REQUIRE(rs.server.send(frame_with(call_meta(), {}, 5), after(1s)));
    auto g = rs.client.receive(after(5s), 5s);
    REQUIRE(g);
    CHECK(g->header.sequence == 5);
}
