// What the memory ops share with the stream-ordered ones (server/handlers_pool.cpp).
#pragma once

#include "server/call_context.hpp"

namespace vcuda::server {

// Frees `p`, an allocation (cuMemAlloc) of the current device's memory, and withdraws its IPC handle; the
// caller has made sure that nothing in flight still uses it. The allocator's answer when `p` is none.
CUresult free_device_allocation(call_context& cx, device_memory& mem, CUdeviceptr p);

}  // namespace vcuda::server
