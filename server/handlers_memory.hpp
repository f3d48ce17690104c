// What the memory ops share with the stream-ordered ones (server/handlers_pool.cpp).
#pragma once

#include "server/call_context.hpp"

namespace vcuda::server {

// The IPC handle of the session's allocation at p opens no more (memory others opened stays theirs until
// they close it); `mu` held. At every free, also one in stream order, whose memory goes back later and may
// then be another allocation's.
void withdraw_memory_export(session& s, CUdeviceptr p);

}  // namespace vcuda::server
