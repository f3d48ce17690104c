// Helpers to build and read the FlatBuffers tables of protocol/vcuda.fbs inside frames.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstring>
#include <span>

#include "common/transport.hpp"
#include "vcuda_generated.h"

namespace vcuda {

// The finished bytes of a builder, as a span (valid while the builder lives and is not reset).
inline std::span<const std::byte> builder_bytes(const flatbuffers::FlatBufferBuilder& b) {
    return {reinterpret_cast<const std::byte*>(b.GetBufferPointer()), b.GetSize()};
}

// A plain struct (a driver descriptor) as a byte vector of a table, and back: exactly one T, else false.
template <class T>
flatbuffers::Offset<flatbuffers::Vector<uint8_t>> struct_vector(flatbuffers::FlatBufferBuilder& b,
                                                                const T& v) {
    return b.CreateVector(reinterpret_cast<const uint8_t*>(&v), sizeof v);
}
template <class T>
bool vector_as(const flatbuffers::Vector<uint8_t>* v, T& out) {
    if (!v || v->size() != sizeof(T)) return false;
    std::memcpy(&out, v->data(), sizeof(T));
    return true;
}

// The root table of a received, verified frame. Only call after frame_stream::receive() accepted it.
template <class Table>
const Table* root_of(const frame& f) {
    return flatbuffers::GetRoot<Table>(f.meta.data());
}

inline outgoing_frame make_frame(frame_kind kind, const flatbuffers::FlatBufferBuilder& b,
                                 uint64_t sequence = 0, uint32_t lane = 0, uint32_t flags = 0,
                                 std::span<const std::byte> payload = {}) {
    outgoing_frame f;
    f.header.kind = static_cast<uint16_t>(kind);
    f.header.sequence = sequence;
    f.header.lane = lane;
    f.header.flags = flags;
    f.meta = builder_bytes(b);
    f.payload = payload;
    return f;
}

// Sends a protocol-level Error frame (best effort: the peer may already be gone).
void send_wire_error(frame_stream& s, wire_errc code, std::string_view message, uint64_t sequence = 0);

}  // namespace vcuda
