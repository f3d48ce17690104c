// Peer access between the application's contexts (client/api_peer.cpp), for cuCtxDestroy to undo.
#pragma once

#include <cstdint>

namespace vcuda::client {
// The context `ctx` goes: the access it enabled, or that was enabled to it, goes with it (on the server too
// once no other context of the application wants it).
void forget_peer_access(uint64_t ctx);
}  // namespace vcuda::client
