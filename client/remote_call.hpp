// Hand-written calls that need more than plain_call: explicit argument lists, bulk payloads both ways.
#pragma once

#include <initializer_list>

#include "client/state.hpp"

namespace vcuda::client {

// How a call travels: `sync` waits for the reply; `post` queues it (errors surface at the next sync call).
enum class mode { sync, post };

// Sends one op from the calling thread's lane with the current context's device.
CUresult remote(op o, std::initializer_list<uint64_t> args, mode m = mode::sync, call_reply* reply = nullptr,
                std::span<const std::byte> payload = {}, std::initializer_list<std::span<const std::byte>> blobs = {});

// The server index of the current context's device, or -1.
int current_server_device();

}  // namespace vcuda::client
