// Hand-written calls that need more than plain_call: explicit argument lists, bulk payloads both ways.
#pragma once

#include <initializer_list>

#include "client/state.hpp"

namespace vcuda::client {

// How a call travels: `sync` waits for the reply; `post` queues it (errors surface at the next sync call).
enum class mode { sync, post };

// Sends one op from the calling thread's lane with the current context's device; `pass_fd` >= 0 travels with
// a synchronous call (Unix sockets).
CUresult remote(op o, std::initializer_list<uint64_t> args, mode m = mode::sync, call_reply* reply = nullptr,
                std::span<const std::byte> payload = {},
                std::initializer_list<std::span<const std::byte>> blobs = {}, int pass_fd = -1);

// The server index of the current context's device, or -1.
int current_server_device();

// Memory locations as the server must see them: a device (client ordinal) becomes the server's index; only
// devices of the current session's server can be named (calls go there). Host locations pass unchanged where
// `host_ok` (queries: the NUMA ids the application knows came from the server); otherwise they, and other
// kinds, answer CUDA_ERROR_NOT_SUPPORTED, logged.
bool host_location(const CUmemLocation& loc);
CUresult server_location(CUmemLocation& loc, bool host_ok = false);

}  // namespace vcuda::client
