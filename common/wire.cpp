#include "common/wire.hpp"

namespace vcuda {

void send_wire_error(frame_stream& s, wire_errc code, std::string_view message, uint64_t sequence) {
    flatbuffers::FlatBufferBuilder b(256);
    auto msg = b.CreateString(message.data(), message.size());
    b.Finish(wire::CreateError(b, static_cast<uint32_t>(code), msg));
    (void)s.send(make_frame(frame_kind::error, b, sequence), after(std::chrono::seconds(1)));
}

}  // namespace vcuda
