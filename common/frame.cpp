#include "common/frame.hpp"

#include <flatbuffers/flatbuffers.h>

#include <bit>

#include "vcuda_generated.h"

namespace vcuda {

std::string_view to_string(frame_kind k) {
    switch (k) {
        case frame_kind::hello:
            return "hello";
        case frame_kind::hello_reply:
            return "hello_reply";
        case frame_kind::call:
            return "call";
        case frame_kind::reply:
            return "reply";
        case frame_kind::error:
            return "error";
        case frame_kind::goodbye:
            return "goodbye";
        case frame_kind::mgmt_request:
            return "mgmt_request";
        case frame_kind::mgmt_reply:
            return "mgmt_reply";
        case frame_kind::session_state:
            return "session_state";
        case frame_kind::state_piece:
            return "state_piece";
    }
    return "unknown";
}

std::string_view to_string(wire_errc e) {
    switch (e) {
        case wire_errc::ok:
            return "ok";
        case wire_errc::bad_magic:
            return "bad magic";
        case wire_errc::bad_version:
            return "unsupported protocol version";
        case wire_errc::bad_kind:
            return "unknown frame kind";
        case wire_errc::bad_flags:
            return "unknown frame flags";
        case wire_errc::meta_too_large:
            return "metadata larger than the limit";
        case wire_errc::payload_too_large:
            return "payload larger than the limit";
        case wire_errc::bad_reserved:
            return "reserved header field not zero";
        case wire_errc::verify_failed:
            return "metadata failed verification";
        case wire_errc::unexpected_kind:
            return "frame kind not expected here";
        case wire_errc::not_allowed:
            return "operation not allowed";
        case wire_errc::bad_arguments:
            return "malformed operation arguments";
        case wire_errc::auth_failed:
            return "authentication failed";
    }
    return "unknown error";
}

void encode_header(const frame_header& h, std::byte* out) {
    // The struct's layout is the wire layout on little-endian hosts (x86-64, aarch64), checked at compile
    // time.
    static_assert(std::endian::native == std::endian::little, "vcuda frames are little-endian");
    std::memcpy(out, &h, sizeof h);
}

namespace {
wire_error make_error(wire_errc c, std::string msg) { return wire_error{c, std::move(msg)}; }
}  // namespace

result<frame_header, wire_error> check_header(std::span<const std::byte> bytes, const frame_limits& limits) {
    if (bytes.size() != frame_header_size)
        return unexpected{make_error(wire_errc::bad_arguments, "header must be exactly 40 bytes")};
    frame_header h;
    std::memcpy(&h, bytes.data(), sizeof h);
    if (h.magic != frame_magic) return unexpected{make_error(wire_errc::bad_magic, "not a vcuda frame")};
    if (h.version != protocol_version)
        return unexpected{make_error(wire_errc::bad_version,
                                     "peer speaks protocol version " + std::to_string(h.version) +
                                         ", this build speaks " + std::to_string(protocol_version))};
    if (h.kind == 0 || h.kind > frame_kind_max)
        return unexpected{make_error(wire_errc::bad_kind, "frame kind " + std::to_string(h.kind))};
    if (h.flags & ~frame_flags::known)
        return unexpected{make_error(wire_errc::bad_flags, "unknown flag bits")};
    if (h.reserved != 0) return unexpected{make_error(wire_errc::bad_reserved, "reserved field set")};
    if (h.meta_len > limits.max_meta)
        return unexpected{
            make_error(wire_errc::meta_too_large, std::to_string(h.meta_len) + " bytes of metadata")};
    if (h.payload_len > limits.max_payload)
        return unexpected{
            make_error(wire_errc::payload_too_large, std::to_string(h.payload_len) + " bytes of payload")};
    return h;
}

result<void, wire_error> verify_metadata(frame_kind kind, std::span<const std::byte> meta,
                                         const frame_limits& limits) {
    auto* data = reinterpret_cast<const uint8_t*>(meta.data());
    if (kind == frame_kind::goodbye) {  // carries no table: anything in its metadata is a malformed frame
        if (!meta.empty())
            return unexpected{make_error(wire_errc::verify_failed, "goodbye carries no metadata")};
        return {};
    }
    if (meta.size() < sizeof(flatbuffers::uoffset_t))
        return unexpected{make_error(wire_errc::verify_failed, "metadata shorter than a table offset")};
    flatbuffers::Verifier v(data, meta.size(), limits.max_depth, limits.max_tables);
    bool ok = false;
    switch (kind) {
        case frame_kind::hello:
            ok = v.VerifyBuffer<wire::Hello>(nullptr);
            break;
        case frame_kind::hello_reply:
            ok = v.VerifyBuffer<wire::HelloReply>(nullptr);
            break;
        case frame_kind::call:
            ok = v.VerifyBuffer<wire::Call>(nullptr);
            break;
        case frame_kind::reply:
            ok = v.VerifyBuffer<wire::Reply>(nullptr);
            break;
        case frame_kind::error:
            ok = v.VerifyBuffer<wire::Error>(nullptr);
            break;
        case frame_kind::goodbye:
            ok = true;
            break;
        case frame_kind::mgmt_request:
            ok = v.VerifyBuffer<wire::MgmtRequest>(nullptr);
            break;
        case frame_kind::mgmt_reply:
            ok = v.VerifyBuffer<wire::MgmtReply>(nullptr);
            break;
        case frame_kind::session_state:
            ok = v.VerifyBuffer<wire::SessionState>(nullptr);
            break;
        case frame_kind::state_piece:
            ok = v.VerifyBuffer<wire::StatePiece>(nullptr);
            break;
    }
    if (!ok)
        return unexpected{make_error(wire_errc::verify_failed,
                                     std::string("metadata is not a valid ") + std::string(to_string(kind)))};
    return {};
}

}  // namespace vcuda
