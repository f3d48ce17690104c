// The vcuda frame: a fixed 40-byte header, FlatBuffers metadata (protocol/vcuda.fbs), then a raw payload.
// protocol/README.md documents the bytes. Every received frame passes check_header() and verify_metadata()
// before anything reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "common/result.hpp"

namespace vcuda {

inline constexpr uint32_t frame_magic = 0x41444356;  // "VCDA" read as little-endian bytes
inline constexpr uint16_t protocol_version = 1;
inline constexpr size_t frame_header_size = 40;

enum class frame_kind : uint16_t {
    hello = 1,
    hello_reply = 2,
    call = 3,
    reply = 4,
    error = 5,
    goodbye = 6,
    mgmt_request = 7,
    mgmt_reply = 8,
    session_state = 9,  // a session moved from another server (server/session_transfer.cpp)
    state_piece = 10,   // ... and the bytes it holds
};
inline constexpr uint16_t frame_kind_max = 10;
std::string_view to_string(frame_kind k);

namespace frame_flags {
inline constexpr uint32_t no_reply = 1u
                                     << 0;  // asynchronous call: errors come back at the next synchronous one
inline constexpr uint32_t known = no_reply;
}  // namespace frame_flags

// Feature bits negotiated in HELLO.
namespace features {
inline constexpr uint64_t async_calls = 1u << 0;
inline constexpr uint64_t lanes = 1u << 1;
inline constexpr uint64_t all = async_calls | lanes;
// Asked for by a client on the same host; granted by a server that passes the rings' memfd with HELLO's reply
// (common/shm_ring.hpp). Not in `all`: it depends on the connection.
inline constexpr uint64_t shm_rings = 1u << 2;
// Striped bulk copies: a session may open extra bulk connections that carry the bytes of large copies as
// chunks (protocol/README.md, *Bulk connections*). Not in `all`: a server offers it only when it accepts
// them.
inline constexpr uint64_t bulk = 1u << 3;
}  // namespace features

// Wire layout, little-endian, no padding (static_asserts below).
struct frame_header {
    uint32_t magic = frame_magic;
    uint16_t version = protocol_version;
    uint16_t kind = 0;
    uint32_t flags = 0;
    uint32_t lane = 0;
    uint64_t sequence = 0;
    uint32_t meta_len = 0;
    uint32_t reserved = 0;
    uint64_t payload_len = 0;
};
static_assert(sizeof(frame_header) == frame_header_size);
static_assert(offsetof(frame_header, sequence) == 16 && offsetof(frame_header, payload_len) == 32);

struct frame_limits {
    uint32_t max_meta = 4u << 20;              // 4 MiB of metadata (parameter blocks, small buffers)
    uint64_t max_payload = uint64_t{1} << 30;  // 1 GiB of bulk bytes in one frame
    uint32_t max_depth = 16;                   // FlatBuffers verifier limits
    uint32_t max_tables = 1u << 20;
};

enum class wire_errc : uint32_t {
    ok = 0,
    bad_magic = 1,
    bad_version = 2,
    bad_kind = 3,
    bad_flags = 4,
    meta_too_large = 5,
    payload_too_large = 6,
    bad_reserved = 7,
    verify_failed = 8,    // metadata is not a valid table of the kind's type
    unexpected_kind = 9,  // a valid frame that is wrong at this point of the conversation
    not_allowed = 10,     // the op is not on the server's allowlist
    bad_arguments = 11,   // the op's arguments do not have the shape the op needs
    auth_failed = 12,
};
std::string_view to_string(wire_errc e);

struct wire_error {
    wire_errc code = wire_errc::ok;
    std::string message;
};

// Serializes a header into exactly frame_header_size bytes.
void encode_header(const frame_header& h, std::byte* out);

// Decodes and checks a header against the limits: magic, version, kind, flags, reserved, sizes.
result<frame_header, wire_error> check_header(std::span<const std::byte> bytes, const frame_limits& limits);

// Verifies that `meta` is a well-formed FlatBuffers table of the type that `kind` carries,
// within the limits. Nothing may read metadata that failed this.
result<void, wire_error> verify_metadata(frame_kind kind, std::span<const std::byte> meta,
                                         const frame_limits& limits);

}  // namespace vcuda
