// Frame codec tests: header encoding and checks, metadata verification, and what a receiver does with
// truncated, oversized, lying-length and garbage frames (protocol/README.md describes the bytes).
// Run under the asan preset: a verifier that let a bad table through shows up as an out-of-bounds read in
// read_everything().
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "test_support.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

bytes header_bytes(const frame_header& h) {
    bytes out(frame_header_size);
    encode_header(h, out.data());
    return out;
}

template <class T>
void poke(bytes& b, size_t offset, T value) {
    std::memcpy(b.data() + offset, &value, sizeof value);
}

template <class T>
T peek(const bytes& b, size_t offset) {
    T v;
    std::memcpy(&v, b.data() + offset, sizeof v);
    return v;
}

// Position of a flatbuffers object inside its buffer.
size_t offset_in(const bytes& buf, const void* p) {
    return static_cast<size_t>(reinterpret_cast<const std::byte*>(p) - buf.data());
}

// What a receiver does with bytes that arrived: check the header, cut out exactly meta_len bytes (into a
// buffer of exactly that size, so ASan sees any read past it), verify, and only then read. Returns the wire
// error code (ok when the frame was accepted and read), or nullopt when the bytes end before the frame does.
std::optional<wire_errc> receive_from_bytes(std::span<const std::byte> data, const frame_limits& limits) {
    if (data.size() < frame_header_size) {
        auto h = check_header(data, limits);  // a short header must be refused, never read past
        REQUIRE_FALSE(h);
        return std::nullopt;
    }
    auto h = check_header(data.first(frame_header_size), limits);
    if (!h) return h.error().code;
    if (data.size() - frame_header_size < h->meta_len) return std::nullopt;
    bytes meta(data.begin() + frame_header_size, data.begin() + frame_header_size + h->meta_len);
    auto v = verify_metadata(static_cast<frame_kind>(h->kind), meta, limits);
    if (!v) return v.error().code;
    (void)read_everything(static_cast<frame_kind>(h->kind), meta);
    return wire_errc::ok;
}

constexpr std::array<frame_kind, 7> table_kinds = {
    frame_kind::hello, frame_kind::hello_reply,  frame_kind::call,      frame_kind::reply,
    frame_kind::error, frame_kind::mgmt_request, frame_kind::mgmt_reply};

}  // namespace

// ------------------------------------------------------------------ headers

TEST_CASE("frame header has the documented byte layout", "[unit][frame]") {
    frame_header h = header_for(frame_kind::call, 0x1122334455667788ull, 0x01020304, frame_flags::no_reply);
    h.meta_len = 0x10;
    h.payload_len = 0x0A0B0C0D0E0Full;
    const std::array<uint8_t, 40> expected = {
        0x56, 0x43, 0x44, 0x41,                          // magic "VCDA"
        0x01, 0x00,                                      // version 1
        0x03, 0x00,                                      // kind 3 = CALL
        0x01, 0x00, 0x00, 0x00,                          // flags: no_reply
        0x04, 0x03, 0x02, 0x01,                          // lane
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // sequence
        0x10, 0x00, 0x00, 0x00,                          // meta_len
        0x00, 0x00, 0x00, 0x00,                          // reserved
        0x0F, 0x0E, 0x0D, 0x0C, 0x0B, 0x0A, 0x00, 0x00,  // payload_len
    };
    bytes got = header_bytes(h);
    REQUIRE(std::memcmp(got.data(), expected.data(), expected.size()) == 0);
    REQUIRE(std::memcmp(got.data(), "VCDA", 4) == 0);
}

TEST_CASE("every frame kind round-trips through encode_header check_header and verify_metadata",
          "[unit][frame]") {
    const frame_limits limits;
    for (const auto& s : samples()) {
        INFO("kind " << to_string(s.kind));
        bytes payload = s.kind == frame_kind::call || s.kind == frame_kind::reply ? pattern(100, 3) : bytes{};
        frame_header h = header_for(s.kind, 0xABCDEF0123456789ull, 5,
                                    s.kind == frame_kind::call ? frame_flags::no_reply : 0);
        bytes wire_bytes = encode_frame(h, s.meta, payload);
        REQUIRE(wire_bytes.size() == frame_header_size + s.meta.size() + payload.size());

        auto got = check_header(std::span(wire_bytes).first(frame_header_size), limits);
        REQUIRE(got);
        CHECK(got->magic == frame_magic);
        CHECK(got->version == protocol_version);
        CHECK(got->kind == static_cast<uint16_t>(s.kind));
        CHECK(got->flags == h.flags);
        CHECK(got->lane == 5);
        CHECK(got->sequence == 0xABCDEF0123456789ull);
        CHECK(got->meta_len == s.meta.size());
        CHECK(got->reserved == 0);
        CHECK(got->payload_len == payload.size());

        bytes meta(wire_bytes.begin() + frame_header_size,
                   wire_bytes.begin() + frame_header_size + got->meta_len);
        REQUIRE(verify_metadata(s.kind, meta, limits));
        REQUIRE(std::equal(wire_bytes.end() - static_cast<ptrdiff_t>(payload.size()), wire_bytes.end(),
                           payload.begin()));
        CHECK(read_everything(s.kind, meta) == read_everything(s.kind, s.meta));
    }
}

TEST_CASE("decoded tables carry the values that were encoded", "[unit][frame]") {
    const frame_limits limits;
    SECTION("hello") {
        bytes m = hello_meta();
        REQUIRE(verify_metadata(frame_kind::hello, m, limits));
        auto* t = flatbuffers::GetRoot<wire::Hello>(m.data());
        CHECK(t->protocol_version() == protocol_version);
        CHECK(t->features() == features::all);
        CHECK(t->token()->str() == "lease-7f3a9c");
        CHECK(t->session_id() == 0x1122334455667788ull);
        REQUIRE(t->session_key()->size() == 32);
        CHECK(t->session_key()->Get(31) == 0xA5);
        CHECK(t->lane() == 7);
        CHECK(t->client_pid() == 4242);
        CHECK(t->client_host()->str() == "vm-17.example");
        REQUIRE(t->devices()->size() == 3);
        CHECK(t->devices()->Get(2) == 3);
    }
    SECTION("hello_reply") {
        bytes m = hello_reply_meta();
        REQUIRE(verify_metadata(frame_kind::hello_reply, m, limits));
        auto* t = flatbuffers::GetRoot<wire::HelloReply>(m.data());
        CHECK(t->features() == features::async_calls);
        REQUIRE(t->session_key()->size() == 32);
        CHECK(t->session_key()->Get(0) == 0x5A);
        CHECK(t->server_name()->str() == "gpu-host-1");
        CHECK(t->memory_quota() == uint64_t{8} << 30);
    }
    SECTION("call with args and blobs") {
        bytes m = call_meta();
        REQUIRE(verify_metadata(frame_kind::call, m, limits));
        auto* t = flatbuffers::GetRoot<wire::Call>(m.data());
        CHECK(t->op() == 1234);
        CHECK(t->device() == 0);
        REQUIRE(t->args()->size() == 3);
        CHECK(t->args()->Get(1) == uint64_t{1} << 63);
        CHECK(t->args()->Get(2) == ~uint64_t{0});
        REQUIRE(t->blobs()->size() == 3);
        CHECK(t->blobs()->Get(0)->bytes()->size() == 3);
        CHECK(t->blobs()->Get(1)->bytes()->size() == 0);
        REQUIRE(t->blobs()->Get(2)->bytes()->size() == 300);
        CHECK(t->blobs()->Get(2)->bytes()->Get(299) == static_cast<uint8_t>(299 * 7));
    }
    SECTION("reply") {
        bytes m = reply_meta();
        REQUIRE(verify_metadata(frame_kind::reply, m, limits));
        auto* t = flatbuffers::GetRoot<wire::Reply>(m.data());
        CHECK(t->result() == 1);
        CHECK(t->outs()->Get(0) == 0x7f0000001000ull);
        CHECK(t->blobs()->Get(0)->bytes()->Get(3) == 6);
        CHECK(t->detail()->str().find("INVALID_VALUE") != std::string::npos);
    }
    SECTION("error") {
        bytes m = error_meta();
        REQUIRE(verify_metadata(frame_kind::error, m, limits));
        auto* t = flatbuffers::GetRoot<wire::Error>(m.data());
        CHECK(static_cast<wire_errc>(t->code()) == wire_errc::verify_failed);
        CHECK(t->message()->str() == "metadata is not a valid call");
    }
    SECTION("mgmt request and reply") {
        bytes q = mgmt_request_meta(), r = mgmt_reply_meta();
        REQUIRE(verify_metadata(frame_kind::mgmt_request, q, limits));
        REQUIRE(verify_metadata(frame_kind::mgmt_reply, r, limits));
        CHECK(flatbuffers::GetRoot<wire::MgmtRequest>(q.data())->method()->str() == "lease.acquire");
        CHECK(flatbuffers::GetRoot<wire::MgmtReply>(r.data())->ok());
    }
    SECTION("goodbye carries no metadata") {
        REQUIRE(verify_metadata(frame_kind::goodbye, {}, limits));
        bytes junk = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
        auto v = verify_metadata(frame_kind::goodbye, junk, limits);
        REQUIRE_FALSE(v);
        CHECK(v.error().code == wire_errc::verify_failed);
    }
    SECTION("tables with every field absent take the schema defaults") {
        for (frame_kind k : table_kinds) {
            flatbuffers::FlatBufferBuilder b;
            b.Finish(flatbuffers::Offset<void>(b.EndTable(b.StartTable())));
            bytes m = to_bytes(b);
            INFO(to_string(k));
            REQUIRE(verify_metadata(k, m, limits));
            (void)read_everything(k, m);
        }
    }
}

TEST_CASE("truncated headers are rejected", "[unit][frame]") {
    const frame_limits limits;
    bytes full = header_bytes(header_for(frame_kind::call));
    for (size_t n = 0; n < frame_header_size; ++n) {
        bytes cut(full.begin(),
                  full.begin() + static_cast<ptrdiff_t>(n));  // exact size: ASan sees a read past it
        INFO(n << " bytes");
        REQUIRE_FALSE(check_header(cut, limits));
    }
    bytes longer = full;
    longer.push_back(std::byte{0});
    REQUIRE_FALSE(check_header(longer, limits));
    REQUIRE(check_header(full, limits));
}

TEST_CASE("headers with bad fields are rejected with the matching error", "[unit][frame]") {
    const frame_limits limits;
    auto error_of = [&](const frame_header& h) {
        auto r = check_header(header_bytes(h), limits);
        REQUIRE_FALSE(r);
        CHECK_FALSE(r.error().message.empty());
        return r.error().code;
    };
    SECTION("magic") {
        for (size_t byte = 0; byte < 4; ++byte)
            for (int bit = 0; bit < 8; ++bit) {
                bytes b = header_bytes(header_for(frame_kind::call));
                b[byte] ^= std::byte(1u << bit);
                auto r = check_header(b, limits);
                REQUIRE_FALSE(r);
                CHECK(r.error().code == wire_errc::bad_magic);
            }
        frame_header h = header_for(frame_kind::call);
        h.magic = 0;
        CHECK(error_of(h) == wire_errc::bad_magic);
        h.magic = 0x56434441;  // the right letters in the wrong byte order
        CHECK(error_of(h) == wire_errc::bad_magic);
    }
    SECTION("version") {
        for (uint16_t v : {uint16_t{0}, uint16_t{2}, uint16_t{0x100}, uint16_t{0xFFFF}}) {
            frame_header h = header_for(frame_kind::call);
            h.version = v;
            CHECK(error_of(h) == wire_errc::bad_version);
        }
    }
    SECTION("kind") {
        for (uint16_t k : {uint16_t{0}, uint16_t{frame_kind_max + 1}, uint16_t{0x100}, uint16_t{0xFFFF}}) {
            frame_header h = header_for(frame_kind::call);
            h.kind = k;
            CHECK(error_of(h) == wire_errc::bad_kind);
        }
        for (uint16_t k = 1; k <= frame_kind_max; ++k) {
            frame_header h = header_for(static_cast<frame_kind>(k));
            CHECK(check_header(header_bytes(h), limits));
        }
    }
    SECTION("flags") {
        for (int bit = 0; bit < 32; ++bit) {
            frame_header h = header_for(frame_kind::call);
            h.flags = 1u << bit;
            if (h.flags & frame_flags::known)
                CHECK(check_header(header_bytes(h), limits));
            else
                CHECK(error_of(h) == wire_errc::bad_flags);
        }
    }
    SECTION("reserved") {
        for (uint32_t r : {1u, 0x80000000u, 0xFFFFFFFFu}) {
            frame_header h = header_for(frame_kind::call);
            h.reserved = r;
            CHECK(error_of(h) == wire_errc::bad_reserved);
        }
    }
}

TEST_CASE("metadata and payload lengths above the limits are rejected", "[unit][frame]") {
    SECTION("default limits") {
        const frame_limits limits;
        frame_header h = header_for(frame_kind::call);
        h.meta_len = limits.max_meta;
        CHECK(check_header(header_bytes(h), limits));
        h.meta_len = limits.max_meta + 1;
        auto r = check_header(header_bytes(h), limits);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == wire_errc::meta_too_large);
        h.meta_len = 0xFFFFFFFFu;
        CHECK_FALSE(check_header(header_bytes(h), limits));

        h = header_for(frame_kind::call);
        h.payload_len = limits.max_payload;
        CHECK(check_header(header_bytes(h), limits));
        for (uint64_t len : {limits.max_payload + 1, uint64_t{1} << 40, ~uint64_t{0}}) {
            h.payload_len = len;
            auto p = check_header(header_bytes(h), limits);
            REQUIRE_FALSE(p);
            CHECK(p.error().code == wire_errc::payload_too_large);
        }
    }
    SECTION("limits chosen by the receiver") {
        frame_limits limits;
        limits.max_meta = 100;
        limits.max_payload = 0;
        frame_header h = header_for(frame_kind::reply);
        h.meta_len = 101;
        CHECK_FALSE(check_header(header_bytes(h), limits));
        h.meta_len = 100;
        h.payload_len = 1;
        CHECK_FALSE(check_header(header_bytes(h), limits));
        h.payload_len = 0;
        CHECK(check_header(header_bytes(h), limits));
    }
}

// ------------------------------------------------------------------ metadata verification

TEST_CASE("metadata cut short of its table is rejected", "[unit][frame]") {
    // meta_len claims less than the real table: the table's own offsets then point past the end. Only the
    // alignment padding FlatBuffers leaves after the last object (under 8 bytes, read by nothing) may go.
    const frame_limits limits;
    for (const auto& s : samples()) {
        if (s.kind == frame_kind::goodbye) continue;
        INFO(to_string(s.kind));
        const uint64_t whole = read_everything(s.kind, s.meta);
        for (size_t n = 0; n < s.meta.size(); ++n) {
            bytes cut(s.meta.begin(), s.meta.begin() + static_cast<ptrdiff_t>(n));
            INFO("first " << n << " of " << s.meta.size() << " bytes");
            auto v = verify_metadata(s.kind, cut, limits);
            if (n + 8 <= s.meta.size()) {
                REQUIRE_FALSE(v);
                CHECK(v.error().code == wire_errc::verify_failed);
            } else if (v) {
                CHECK(read_everything(s.kind, cut) == whole);  // in bounds (ASan) and every value intact
            }
        }
    }
}

TEST_CASE("tables whose offsets point out of bounds are rejected", "[unit][frame]") {
    const frame_limits limits;
    auto rejected = [&](frame_kind k, const bytes& m) { return !verify_metadata(k, m, limits); };

    SECTION("root offset") {
        for (const auto& s : samples()) {
            if (s.kind == frame_kind::goodbye) continue;
            const uint32_t size = static_cast<uint32_t>(s.meta.size());
            for (uint32_t root : {size, size - 2, size + 4, 0x7FFFFFFCu, 0xFFFFFFFCu, 2u}) {
                bytes m = s.meta;
                poke<uint32_t>(m, 0, root);
                INFO(to_string(s.kind) << " root offset " << root);
                CHECK(rejected(s.kind, m));
            }
        }
    }
    SECTION("vtable offset") {
        for (const auto& s : samples()) {
            if (s.kind == frame_kind::goodbye) continue;
            const uint32_t table = peek<uint32_t>(s.meta, 0);
            for (int32_t soff :
                 {int32_t(table) + 1000, -int32_t(s.meta.size()) * 2, INT32_MIN, INT32_MAX, 1}) {
                bytes m = s.meta;
                poke<int32_t>(m, table, soff);
                INFO(to_string(s.kind) << " vtable soffset " << soff);
                CHECK(rejected(s.kind, m));
            }
        }
    }
    SECTION("vtable entries that point fields past the end") {
        for (const auto& s : samples()) {
            if (s.kind == frame_kind::goodbye) continue;
            INFO(to_string(s.kind));
            const uint32_t table = peek<uint32_t>(s.meta, 0);
            const size_t vtable = table - peek<int32_t>(s.meta, table);
            const uint16_t vsize = peek<uint16_t>(s.meta, vtable);
            int fields = 0;
            for (size_t slot = vtable + 4; slot < vtable + vsize; slot += 2) {
                if (peek<uint16_t>(s.meta, slot) == 0) continue;  // field absent
                bytes m = s.meta;
                poke<uint16_t>(m, slot, 0xFFF8);
                INFO("field slot " << (slot - vtable - 4) / 2);
                CHECK(rejected(s.kind, m));
                ++fields;
            }
            CHECK(fields > 0);
            bytes m = s.meta;
            poke<uint16_t>(m, vtable, 0xFFFE);  // the vtable's own size, past the end
            CHECK(rejected(s.kind, m));
            // The table's byte size in the vtable is not used to read anything; a wrong one is harmless.
            m = s.meta;
            poke<uint16_t>(m, vtable + 2, 0xFFFC);
            if (!rejected(s.kind, m)) (void)read_everything(s.kind, m);
        }
    }
    SECTION("vector length past the end") {
        bytes base = call_meta();
        auto* t = flatbuffers::GetRoot<wire::Call>(base.data());
        const size_t len_at = offset_in(base, t->args());
        for (uint32_t n : {4u + uint32_t(base.size()) / 8, 0x1FFFFFFFu, 0xFFFFFFFFu}) {
            bytes m = base;
            poke<uint32_t>(m, len_at, n);
            INFO("args length " << n);
            CHECK(rejected(frame_kind::call, m));
        }
        // a Blob's byte vector inside the vector of tables
        const size_t blob_len_at = offset_in(base, t->blobs()->Get(2)->bytes());
        bytes m = base;
        poke<uint32_t>(m, blob_len_at, 0x7FFFFFFFu);
        CHECK(rejected(frame_kind::call, m));
        // the offset from the vector of blobs to one blob
        const size_t first_blob_ref = offset_in(base, t->blobs()) + 4;
        m = base;
        poke<uint32_t>(m, first_blob_ref, 0x7FFFFFF0u);
        CHECK(rejected(frame_kind::call, m));
    }
    SECTION("string length past the end and a missing terminator") {
        bytes base = hello_meta();
        auto* t = flatbuffers::GetRoot<wire::Hello>(base.data());
        const size_t len_at = offset_in(base, t->token());
        const uint32_t real_len = peek<uint32_t>(base, len_at);
        for (uint32_t n : {uint32_t(base.size()), 0x7FFFFFFFu, 0xFFFFFFFFu}) {
            bytes m = base;
            poke<uint32_t>(m, len_at, n);
            CHECK(rejected(frame_kind::hello, m));
        }
        bytes m = base;
        m[len_at + 4 + real_len] = std::byte{'!'};  // overwrite the NUL the verifier insists on
        CHECK(rejected(frame_kind::hello, m));
    }
    SECTION("field offset from the table to a string") {
        bytes base = error_meta();
        auto* t = flatbuffers::GetRoot<wire::Error>(base.data());
        // the uoffset stored in the table's message field
        const size_t field_at = offset_in(
            base, reinterpret_cast<const flatbuffers::Table*>(t)->GetAddressOf(wire::Error::VT_MESSAGE));
        for (uint32_t off : {uint32_t(base.size()), 0x80000000u, 0xFFFFFFFCu}) {
            bytes m = base;
            poke<uint32_t>(m, field_at, off);
            CHECK(rejected(frame_kind::error, m));
        }
    }
}

TEST_CASE("verification limits on depth and table count hold", "[unit][frame]") {
    // A Call with many Blob tables: fine with the defaults, refused by a receiver that allows fewer tables.
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<wire::Blob>> blobs;
    for (int i = 0; i < 200; ++i)
        blobs.push_back(wire::CreateBlob(b, b.CreateVector(std::vector<uint8_t>{uint8_t(i)})));
    auto bl = b.CreateVector(blobs);
    b.Finish(wire::CreateCall(b, 1, 0, 0, bl));
    bytes m = to_bytes(b);

    frame_limits limits;
    REQUIRE(verify_metadata(frame_kind::call, m, limits));
    limits.max_tables = 50;
    CHECK_FALSE(verify_metadata(frame_kind::call, m, limits));
    limits = {};
    limits.max_depth = 1;  // Call -> blobs -> Blob is deeper than that
    CHECK_FALSE(verify_metadata(frame_kind::call, m, limits));
}

TEST_CASE("garbage metadata is rejected and never read out of bounds", "[unit][frame]") {
    const frame_limits limits;
    size_t tried = 0;
    for (uint64_t seed = 1; seed <= 400; ++seed) {
        std::mt19937_64 rng(seed);
        // short buffers (the header words themselves) and longer ones
        const size_t n = seed % 4 == 0 ? rng() % 16 : rng() % 2048;
        bytes junk = random_bytes(rng, n);
        for (frame_kind k : table_kinds) {
            INFO("seed " << seed << " length " << n << " kind " << to_string(k));
            auto v = verify_metadata(k, junk, limits);
            if (v) (void)read_everything(k, junk);  // should not happen, and must be safe if it does
            CHECK_FALSE(v);
            ++tried;
        }
        // the same garbage behind a valid header, as a receiver sees it
        bytes framed = encode_frame(header_for(frame_kind::call), junk, {});
        auto r = receive_from_bytes(framed, limits);
        REQUIRE(r.has_value());
        CHECK(*r == wire_errc::verify_failed);
    }
    CHECK(tried == 400 * table_kinds.size());
}

TEST_CASE("metadata of one kind verified as another is safe to read", "[unit][frame]") {
    // Tables carry no type tag, so a Hello may well pass as a Call; what must hold is that whatever passes is
    // inside the buffer.
    const frame_limits limits;
    for (const auto& s : samples())
        for (frame_kind k : table_kinds) {
            if (s.kind == frame_kind::goodbye) continue;
            if (verify_metadata(k, s.meta, limits)) (void)read_everything(k, s.meta);
        }
    SUCCEED("no out-of-bounds read");
}

// ------------------------------------------------------------------ lying lengths on a real stream

TEST_CASE("a frame_stream refuses frames whose lengths lie", "[unit][frame]") {
    auto [rd, wr] = socket_pair();
    frame_stream in{stream(rd)};
    const bytes meta = call_meta();
    const bytes payload = pattern(64, 9);

    SECTION("meta_len shorter than the table") {
        bytes f = encode_frame(header_for(frame_kind::call), meta, payload);
        poke<uint32_t>(f, 24, static_cast<uint32_t>(meta.size() - 8));
        REQUIRE(write_raw(wr, f));
        auto r = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::protocol);
    }
    SECTION("meta_len longer than the table: the stream loses step and the next header is refused") {
        bytes f = encode_frame(header_for(frame_kind::call, 1), meta, {});
        poke<uint32_t>(f, 24, static_cast<uint32_t>(meta.size() + frame_header_size));
        bytes next = encode_frame(header_for(frame_kind::call, 2), meta, payload);
        REQUIRE(write_raw(wr, f));
        REQUIRE(write_raw(wr, next));
        ::close(wr);
        wr = -1;
        // The first frame swallows the second one's header; its table still verifies (it is all there) but
        // the second frame can never come out intact.
        auto first = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        if (first) {
            CHECK(first->header.sequence == 1);
            auto second = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
            REQUIRE_FALSE(second);
            CHECK((second.error().code == transport_errc::protocol ||
                   second.error().code == transport_errc::peer_lost));
        }
    }
    SECTION("payload_len longer than what comes: peer_lost when the sender goes") {
        bytes f = encode_frame(header_for(frame_kind::call), meta, payload);
        poke<uint64_t>(f, 32, payload.size() + 1000);
        REQUIRE(write_raw(wr, f));
        ::close(wr);
        wr = -1;
        auto r = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::peer_lost);
    }
    SECTION("payload_len longer than what comes: timeout while the sender stalls") {
        bytes f = encode_frame(header_for(frame_kind::call), meta, payload);
        poke<uint64_t>(f, 32, payload.size() + 1000);
        REQUIRE(write_raw(wr, f));
        auto r = in.receive(after(std::chrono::seconds(2)), std::chrono::milliseconds(50));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::timeout);
    }
    SECTION("payload_len shorter than the payload: the rest is refused as a header") {
        bytes f = encode_frame(header_for(frame_kind::call), meta, payload);
        poke<uint64_t>(f, 32, 16);
        REQUIRE(write_raw(wr, f));
        auto first = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        REQUIRE(first);
        CHECK(first->payload.size() == 16);
        auto second = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        REQUIRE_FALSE(second);
        CHECK(second.error().code == transport_errc::protocol);
    }
    SECTION("meta_len above the receiver's limit is refused before anything is allocated or read") {
        frame_header h = header_for(frame_kind::call);
        h.meta_len = in.limits().max_meta + 1;
        bytes hb = header_bytes(h);
        REQUIRE(write_raw(wr, hb));
        auto r = in.receive(after(std::chrono::seconds(2)), std::chrono::seconds(2));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == transport_errc::protocol);
    }
    if (wr >= 0) ::close(wr);
}

// ------------------------------------------------------------------ fuzz

namespace {

struct fuzz_stats {
    size_t cases = 0, accepted = 0, rejected = 0, incomplete = 0;
};

// Feeds `data` through a real frame_stream over a socket pair: the writer sends everything and goes, the
// reader takes frames until it gets an error. Every frame that comes out must be whole and safe to read.
void through_stream(std::span<const std::byte> data, const frame_limits& limits, fuzz_stats& st) {
    auto [rd, wr] = socket_pair();
    frame_stream in{stream(rd), limits};
    REQUIRE(write_raw(wr, data));  // small frames: the socket buffer takes them whole
    ::close(wr);
    for (int frames = 0;; ++frames) {
        auto r = in.receive(after(std::chrono::seconds(5)), std::chrono::seconds(5));
        if (!r) {
            const auto code = r.error().code;
            REQUIRE((code == transport_errc::protocol || code == transport_errc::peer_lost));
            if (code == transport_errc::peer_lost) {
                auto again = in.receive(after(std::chrono::seconds(1)), std::chrono::seconds(1));
                REQUIRE_FALSE(again);
                REQUIRE(again.error().code == transport_errc::closed);
            }
            break;
        }
        REQUIRE(r->meta.size() == r->header.meta_len);
        REQUIRE(r->payload.size() == r->header.payload_len);
        (void)read_everything(r->kind(), r->meta);
        REQUIRE(frames < 64);
    }
    ++st.cases;
}

void check_and_verify(std::span<const std::byte> data, const frame_limits& limits, fuzz_stats& st) {
    auto r = receive_from_bytes(data, limits);
    if (!r)
        ++st.incomplete;
    else if (*r == wire_errc::ok)
        ++st.accepted;
    else
        ++st.rejected;
}

}  // namespace

TEST_CASE("mutated and truncated frames are rejected or read safely", "[unit][fuzz][frame]") {
    // Small limits keep the reader from allocating large buffers for the lengths mutations invent.
    frame_limits limits;
    limits.max_meta = 64 << 10;
    limits.max_payload = 64 << 10;
    fuzz_stats direct, streamed;
    std::mt19937_64 rng(0x5EED);

    for (const auto& s : samples()) {
        INFO("kind " << to_string(s.kind));
        const bytes payload = pattern(s.kind == frame_kind::call ? 24 : 0, 1);
        const bytes valid = encode_frame(header_for(s.kind, 77, 3), s.meta, payload);
        REQUIRE(receive_from_bytes(valid, limits) == std::optional(wire_errc::ok));

        // every byte, several ways
        for (size_t i = 0; i < valid.size(); ++i)
            for (uint8_t how :
                 {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}, static_cast<uint8_t>(rng() | 1)}) {
                bytes m = valid;
                m[i] ^= std::byte{how};
                INFO("byte " << i << " ^ " << int(how));
                check_and_verify(m, limits, direct);
                through_stream(m, limits, streamed);
            }
        // every truncation
        for (size_t n = 0; n < valid.size(); ++n) {
            std::span<const std::byte> cut(valid.data(), n);
            bytes exact(cut.begin(), cut.end());
            INFO("first " << n << " bytes");
            auto r = receive_from_bytes(exact, limits);
            if (s.kind != frame_kind::call || n < frame_header_size + s.meta.size())
                CHECK(r !=
                      std::optional(wire_errc::ok));  // a cut frame is incomplete or refused, never accepted
            through_stream(exact, limits, streamed);
        }
        // random multi-byte damage, then a random-length cut
        for (int round = 0; round < 300; ++round) {
            bytes m = valid;
            const int hits = 1 + static_cast<int>(rng() % 8);
            for (int h = 0; h < hits; ++h) m[rng() % m.size()] = static_cast<std::byte>(rng());
            m.resize(rng() % (m.size() + 1));
            check_and_verify(m, limits, direct);
            through_stream(m, limits, streamed);
        }
    }
    // a batch of frames, damaged at random, through one stream
    for (int round = 0; round < 200; ++round) {
        bytes batch;
        for (const auto& s : samples()) {
            bytes f = encode_frame(header_for(s.kind, round), s.meta, {});
            batch.insert(batch.end(), f.begin(), f.end());
        }
        batch[rng() % batch.size()] = static_cast<std::byte>(rng());
        through_stream(batch, limits, streamed);
    }
    INFO("direct: " << direct.accepted << " accepted, " << direct.rejected << " rejected, "
                    << direct.incomplete << " incomplete; streamed cases: " << streamed.cases);
    CHECK(direct.rejected > 1000);  // both outcomes were exercised: damage that breaks the frame and damage
    CHECK(direct.accepted > 0);     // that only changes values (payload bytes, scalars, padding)
    CHECK(streamed.cases > 5000);
}
