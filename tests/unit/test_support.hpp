// Helpers shared by the unit tests: sample frames of every kind, a reader that touches every byte a verified
// table can reach (so that AddressSanitizer catches a verifier that let an out-of-bounds table through),
// socket pairs, temporary directories and connected transport pairs over real sockets.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/frame.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "vcuda_generated.h"

namespace vcuda::test {

using bytes = std::vector<std::byte>;

inline bytes to_bytes(std::span<const std::byte> s) { return bytes(s.begin(), s.end()); }
inline bytes to_bytes(const flatbuffers::FlatBufferBuilder& b) { return to_bytes(builder_bytes(b)); }

// Deterministic pseudo-random bytes (mt19937_64's output is fixed by the standard, unlike the distributions).
inline bytes random_bytes(std::mt19937_64& rng, size_t n) {
    bytes out(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>(rng() >> 56);
    return out;
}

// A payload whose every 8-byte word differs, so a lost, repeated or shifted chunk cannot compare equal.
inline void fill_pattern(std::span<std::byte> out, uint64_t seed) {
    uint64_t x = seed;
    size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        std::memcpy(&out[i], &z, 8);
    }
    for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(i * 131 + seed);
}
inline bytes pattern(size_t n, uint64_t seed) {
    bytes b(n);
    fill_pattern(b, seed);
    return b;
}

// ------------------------------------------------------------------ sample metadata of every kind

inline bytes hello_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto token = b.CreateString("lease-7f3a9c");
    auto host = b.CreateString("vm-17.example");
    auto devices = b.CreateVector(std::vector<int32_t>{0, 2, 3});
    auto key = b.CreateVector(std::vector<uint8_t>(32, 0xA5));
    b.Finish(wire::CreateHello(b, protocol_version, features::all, token, 0x1122334455667788ull, 7, 4242,
                               host, devices, 0, 0, key));
    return to_bytes(b);
}

inline bytes hello_reply_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto name = b.CreateString("gpu-host-1");
    auto key = b.CreateVector(std::vector<uint8_t>(32, 0x5A));
    b.Finish(wire::CreateHelloReply(b, protocol_version, features::async_calls, 0x1122334455667788ull, name,
                                    uint64_t{8} << 30, 0, key));
    return to_bytes(b);
}

inline bytes call_meta(uint32_t op = 1234,
                       std::vector<uint64_t> args = {1, uint64_t{1} << 63, ~uint64_t{0}}) {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<wire::Blob>> blobs;
    std::vector<uint8_t> small{1, 2, 3}, empty{}, big(300);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
    for (auto* v : {&small, &empty, &big}) blobs.push_back(wire::CreateBlob(b, b.CreateVector(*v)));
    auto a = b.CreateVector(args);
    auto bl = b.CreateVector(blobs);
    b.Finish(wire::CreateCall(b, op, 0, a, bl));
    return to_bytes(b);
}

inline bytes small_call_meta(uint32_t op, uint64_t arg) {
    flatbuffers::FlatBufferBuilder b(64);
    auto a = b.CreateVector(std::vector<uint64_t>{arg});
    b.Finish(wire::CreateCall(b, op, 0, a));
    return to_bytes(b);
}

inline bytes reply_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto outs = b.CreateVector(std::vector<uint64_t>{0x7f0000001000ull, 42});
    std::vector<flatbuffers::Offset<wire::Blob>> blobs{
        wire::CreateBlob(b, b.CreateVector(std::vector<uint8_t>{9, 8, 7, 6}))};
    auto bl = b.CreateVector(blobs);
    auto detail = b.CreateString("CUDA_ERROR_INVALID_VALUE: size past the allocation");
    b.Finish(wire::CreateReply(b, 1, outs, bl, detail));
    return to_bytes(b);
}

inline bytes error_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto msg = b.CreateString("metadata is not a valid call");
    b.Finish(wire::CreateError(b, static_cast<uint32_t>(wire_errc::verify_failed), msg));
    return to_bytes(b);
}

inline bytes mgmt_request_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto method = b.CreateString("lease.acquire");
    auto body = b.CreateString(R"({"tenant":"t1","memory":"8G"})");
    b.Finish(wire::CreateMgmtRequest(b, method, body));
    return to_bytes(b);
}

inline bytes mgmt_reply_meta() {
    flatbuffers::FlatBufferBuilder b;
    auto body = b.CreateString(R"({"token":"lease-7f3a9c"})");
    auto err = b.CreateString("");
    b.Finish(wire::CreateMgmtReply(b, true, body, err));
    return to_bytes(b);
}

struct sample {
    frame_kind kind;
    bytes meta;
};

// One valid metadata buffer per frame kind (GOODBYE carries none).
inline std::vector<sample> samples() {
    return {{frame_kind::hello, hello_meta()},
            {frame_kind::hello_reply, hello_reply_meta()},
            {frame_kind::call, call_meta()},
            {frame_kind::reply, reply_meta()},
            {frame_kind::error, error_meta()},
            {frame_kind::goodbye, {}},
            {frame_kind::mgmt_request, mgmt_request_meta()},
            {frame_kind::mgmt_reply, mgmt_reply_meta()}};
}

// A whole frame as it travels: header, metadata, payload.
inline bytes encode_frame(frame_header h, std::span<const std::byte> meta,
                          std::span<const std::byte> payload) {
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.payload_len = payload.size();
    bytes out(frame_header_size);
    encode_header(h, out.data());
    out.insert(out.end(), meta.begin(), meta.end());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

inline frame_header header_for(frame_kind k, uint64_t sequence = 0, uint32_t lane = 0, uint32_t flags = 0) {
    frame_header h;
    h.kind = static_cast<uint16_t>(k);
    h.sequence = sequence;
    h.lane = lane;
    h.flags = flags;
    return h;
}

// ------------------------------------------------------------------ touching everything a verified table
// reaches

namespace detail {
inline uint64_t touch(const flatbuffers::String* s) {
    uint64_t sum = 0;
    if (s)
        for (char c : s->string_view()) sum = sum * 31 + static_cast<uint8_t>(c);
    return sum;
}
template <class T>
uint64_t touch(const flatbuffers::Vector<T>* v) {
    uint64_t sum = 0;
    if (v)
        for (auto x : *v) sum = sum * 31 + static_cast<uint64_t>(x);
    return sum;
}
inline uint64_t touch(const flatbuffers::Vector<flatbuffers::Offset<wire::Blob>>* v) {
    uint64_t sum = 0;
    if (v)
        for (const wire::Blob* blob : *v) sum = sum * 31 + (blob ? touch(blob->bytes()) : 1);
    return sum;
}
// A vector of tables, each read by `f`.
template <class T, class F>
uint64_t touch_each(const flatbuffers::Vector<flatbuffers::Offset<T>>* v, F&& f) {
    uint64_t sum = 0;
    if (v)
        for (const T* t : *v) sum = sum * 31 + (t ? f(*t) : 1);
    return sum;
}
inline uint64_t touch(const wire::SessionState& t) {
    auto mapping = [](const wire::MovedMapping& m) {
        return m.va() + m.size() + m.shared() + m.live() + touch(m.free_runs());
    };
    auto allocation = [](const wire::MovedAllocation& a) { return a.start() + a.size() + a.mapping(); };
    auto device = [&](const wire::MovedDevice& d) {
        return d.had_context() + touch(d.limits()) + static_cast<uint64_t>(d.cache_config()) +
               touch_each(d.mappings(), mapping) + touch_each(d.allocations(), allocation) + d.heap_charge();
    };
    auto slot = [](const wire::MovedSlot& x) {
        return x.index() + x.generation() + x.live() + x.kind() + static_cast<uint64_t>(x.device()) +
               x.owner() + x.owned() + x.made_by() + touch(x.made_with()) + touch(x.layout());
    };
    auto entry = [](const wire::MovedEntry& e) {
        return e.id() + touch(e.name()) + touch(e.attributes()) + e.flags() +
               static_cast<uint64_t>(e.priority()) + e.recorded() + static_cast<uint64_t>(e.age_ms());
    };
    auto global = [](const wire::MovedGlobal& g) {
        return g.address() + g.size() + g.device() + g.owner() + touch(g.name()) + touch(g.bytes());
    };
    auto origin = [](const wire::MovedOrigin& o) {
        return o.handle() + o.library() + o.format() + touch(o.jit_options()) + touch(o.part_words()) +
               o.charge() + o.device();
    };
    return t.session_id() + touch(t.session_key()) + t.handle_tag() + touch(t.peer()) +
           touch_each(t.slots(), slot) + touch(t.free_slots()) + touch_each(t.devices(), device) +
           touch_each(t.entries(), entry) + touch_each(t.globals(), global) +
           touch_each(t.origins(), origin) + touch(t.lane_progress()) + t.bytes() + t.piece_bytes() +
           touch(t.host_regions()) + touch(t.gone_lanes());
}
}  // namespace detail

// Reads every field of a metadata buffer that verify_metadata() accepted; returns a checksum so that the
// reads cannot be optimized away. Under ASan this turns "verified" into "safe to read".
inline uint64_t read_everything(frame_kind kind, std::span<const std::byte> meta) {
    using namespace detail;
    if (kind == frame_kind::goodbye) return 0;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(meta.data());
    switch (kind) {
        case frame_kind::hello: {
            auto* t = flatbuffers::GetRoot<wire::Hello>(p);
            return t->protocol_version() + t->features() + touch(t->token()) + t->session_id() +
                   touch(t->session_key()) + t->lane() + t->client_pid() + touch(t->client_host()) +
                   touch(t->devices()) + t->adopt();
        }
        case frame_kind::hello_reply: {
            auto* t = flatbuffers::GetRoot<wire::HelloReply>(p);
            return t->protocol_version() + t->features() + t->session_id() + touch(t->session_key()) +
                   touch(t->server_name()) + t->memory_quota();
        }
        case frame_kind::call: {
            auto* t = flatbuffers::GetRoot<wire::Call>(p);
            return t->op() + static_cast<uint64_t>(t->device()) + touch(t->args()) + touch(t->blobs());
        }
        case frame_kind::reply: {
            auto* t = flatbuffers::GetRoot<wire::Reply>(p);
            return static_cast<uint64_t>(t->result()) + touch(t->outs()) + touch(t->blobs()) +
                   touch(t->detail()) + touch(t->device_output()) + touch(t->moved_to()) + t->ran_through();
        }
        case frame_kind::error: {
            auto* t = flatbuffers::GetRoot<wire::Error>(p);
            return t->code() + touch(t->message());
        }
        case frame_kind::mgmt_request: {
            auto* t = flatbuffers::GetRoot<wire::MgmtRequest>(p);
            return touch(t->method()) + touch(t->body());
        }
        case frame_kind::mgmt_reply: {
            auto* t = flatbuffers::GetRoot<wire::MgmtReply>(p);
            return t->ok() + touch(t->body()) + touch(t->error());
        }
        case frame_kind::session_state:
            return touch(*flatbuffers::GetRoot<wire::SessionState>(p));
        case frame_kind::state_piece:
            return flatbuffers::GetRoot<wire::StatePiece>(p)->index();
        case frame_kind::goodbye:
            return 0;
    }
    return 0;
}

// ------------------------------------------------------------------ sockets

// A connected pair of Unix stream sockets; [0] and [1] are plain fds owned by the caller.
inline std::array<int, 2> socket_pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
        throw std::runtime_error("socketpair failed");
    return {fds[0], fds[1]};
}

// Writes all of `data` to a raw fd (blocking); false if the peer is gone.
inline bool write_raw(int fd, std::span<const std::byte> data) {
    while (!data.empty()) {
        ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data = data.subspan(static_cast<size_t>(n));
    }
    return true;
}

// A private directory under /tmp, removed with everything in it when the object goes.
class temp_dir {
  public:
    temp_dir() {
        std::string tmpl = "/tmp/vcuda-test-XXXXXX";
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
};

enum class transport_kind { unix_socket, tcp };
inline const char* name_of(transport_kind k) { return k == transport_kind::tcp ? "tcp" : "unix"; }

// A listener on a fresh address of the given kind: a socket in a private directory, or 127.0.0.1 port 0.
struct test_server {
    temp_dir dir;
    listener lis;

    explicit test_server(transport_kind k) {
        std::string text = k == transport_kind::tcp ? std::string("127.0.0.1:0")
                                                    : "unix:" + (dir.path() / "s.sock").string();
        auto ep = endpoint::parse(text);
        if (!ep) throw std::runtime_error("bad test endpoint: " + ep.error());
        auto l = listener::listen(*ep);
        if (!l) throw std::runtime_error("listen failed: " + l.error().message);
        lis = std::move(*l);
    }
    const endpoint& address() const { return lis.local(); }
};

// A connected client/server pair over a real socket of the given kind.
struct connected_pair {
    test_server server;
    stream client;
    stream accepted;

    explicit connected_pair(transport_kind k) : server(k) {
        auto c = stream::connect(server.address(), std::chrono::seconds(5));
        if (!c) throw std::runtime_error("connect failed: " + c.error().message);
        auto a = server.lis.accept(after(std::chrono::seconds(5)));
        if (!a) throw std::runtime_error("accept failed: " + a.error().message);
        client = std::move(*c);
        accepted = std::move(*a);
    }
};

}  // namespace vcuda::test
