// IPC exports (server/ipc.hpp): the 64-byte handle's encoding, the registry's tenant check, withdrawal and
// descriptors, and a worker's broker talking to a parent that serves it from the registry over a real socket
// pair, as --isolation process does.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "server/control_messages.hpp"
#include "server/ipc.hpp"

using namespace vcuda::server;

namespace {

// A memfd holding `text`, standing for a physical allocation's descriptor.
int descriptor_with(const std::string& text) {
    int fd = ::memfd_create("ipc-test", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()));
    return fd;
}

std::string contents(int fd) {
    char buf[64] = {};
    ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

ipc_export memory_export(const std::string& text) {
    ipc_export e;
    e.kind = ipc_kind::memory;
    e.meta = {std::byte{1}, std::byte{2}, std::byte{3}};
    e.fd = unique_fd(descriptor_with(text));
    return e;
}

}  // namespace

TEST_CASE("an IPC handle encodes its kind, instance and token, and nothing else decodes", "[unit]") {
    ipc_handle h{ipc_kind::event, 0x1122334455667788ull, new_ipc_token()};
    auto bytes = encode_ipc_handle(h);
    ipc_handle back;
    REQUIRE(decode_ipc_handle(bytes, back));
    CHECK(back.kind == ipc_kind::event);
    CHECK(back.instance == h.instance);
    CHECK(back.token == h.token);
    CHECK(new_ipc_token() != new_ipc_token());  // 128 random bits: two never meet

    auto bad = bytes;
    bad[0] = std::byte{'x'};
    CHECK_FALSE(decode_ipc_handle(bad, back));  // not the magic
    bad = bytes;
    bad[6] = std::byte{9};
    CHECK_FALSE(decode_ipc_handle(bad, back));  // no such kind
    bad = bytes;
    bad[40] = std::byte{1};
    CHECK_FALSE(decode_ipc_handle(bad, back));  // the padding is zero
    CHECK_FALSE(decode_ipc_handle(std::span(bytes).first(63), back));
}

TEST_CASE("the registry gives an export to its tenant only, until it is withdrawn", "[unit]") {
    ipc_registry r;
    auto t = new_ipc_token();
    r.put(t, 7, "tenant:alice", memory_export("alice's memory"));
    ipc_export got;
    REQUIRE(r.fetch(t, 8, "tenant:alice", got));
    CHECK(got.owner == 7);
    CHECK(got.kind == ipc_kind::memory);
    CHECK(got.meta.size() == 3);
    REQUIRE(got.fd.get() >= 0);
    CHECK(contents(got.fd.get()) == "alice's memory");  // a descriptor of its own, of the same memory
    ipc_export other;
    CHECK_FALSE(r.fetch(t, 9, "tenant:bob", other));
    CHECK_FALSE(r.fetch(new_ipc_token(), 8, "tenant:alice", other));
    r.withdraw(t, 8);  // not its owner: nothing happens
    CHECK(r.fetch(t, 8, "tenant:alice", other));
    r.withdraw(t, 7);
    CHECK_FALSE(r.fetch(t, 8, "tenant:alice", other));
    CHECK(contents(got.fd.get()) == "alice's memory");  // what was fetched stays usable

    auto a = new_ipc_token(), b = new_ipc_token();
    r.put(a, 7, "tenant:alice", memory_export("a"));
    r.put(b, 8, "tenant:alice", memory_export("b"));
    r.drop_owner(7);
    CHECK(r.size() == 1);
    CHECK(r.fetch(b, 7, "tenant:alice", other));
}

TEST_CASE("a worker's broker deposits and fetches through the parent over a socket pair", "[unit]") {
    ipc_registry registry;
    // Two workers (sessions 11 and 12 of alice, 13 of bob), each with its control socket to the parent.
    struct worker_link {
        int parent = -1, worker = -1;
        uint64_t session;
        std::string tenant;
    };
    std::vector<worker_link> links = {
        {-1, -1, 11, "tenant:alice"}, {-1, -1, 12, "tenant:alice"}, {-1, -1, 13, "tenant:bob"}};
    std::vector<std::thread> parents;
    for (auto& l : links) {
        int sv[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
        l.parent = sv[0];
        l.worker = sv[1];
        parents.emplace_back([&registry, l] {
            std::vector<std::byte> m;
            std::vector<int> fds;
            while (receive_message(l.parent, m, fds) == 1)
                serve_ipc_request(registry, l.session, l.tenant, m, fds);
            registry.drop_owner(l.session);
        });
    }
    const uint64_t instance = 42;
    auto w11 = make_worker_broker(instance, links[0].worker);
    auto w12 = make_worker_broker(instance, links[1].worker);
    auto w13 = make_worker_broker(instance, links[2].worker);
    CHECK_FALSE(w11->in_process());

    auto t = new_ipc_token();
    std::string why;
    REQUIRE(w11->deposit(t, 0, "ignored: the parent knows", memory_export("shared bytes"), why));
    ipc_export got;
    REQUIRE(w12->fetch(t, 0, "", got, why));
    CHECK(got.owner == 11);
    CHECK(got.kind == ipc_kind::memory);
    CHECK(got.meta == std::vector<std::byte>{std::byte{1}, std::byte{2}, std::byte{3}});
    REQUIRE(got.fd.get() >= 0);
    CHECK(contents(got.fd.get()) == "shared bytes");
    ipc_export none;
    CHECK_FALSE(w13->fetch(t, 0, "tenant:alice", none, why));  // bob's worker, whatever it claims

    w11->withdraw(t, 0);
    for (int i = 0; i < 100 && registry.size() != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK_FALSE(w12->fetch(t, 0, "", none, why));

    // A worker that ends takes its exports with it.
    auto u = new_ipc_token();
    REQUIRE(w12->deposit(u, 0, "", memory_export("more"), why));
    CHECK(registry.size() == 1);
    for (auto& l : links) ::close(l.worker);
    for (auto& p : parents) p.join();
    for (auto& l : links) ::close(l.parent);
    CHECK(registry.size() == 0);
}
