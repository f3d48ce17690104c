// The server's allowlist: every op it executes, with its handler. Generated from protocol/spec/driver.spec
// (server_dispatch.cpp in the build tree); an op absent from it is refused.
#pragma once

#include <cstddef>

#include "driver_table.hpp"
#include "ops.hpp"

namespace vcuda::server {

class call_context;

struct dispatch_entry {
    op id;
    const char* name;
    CUresult (*handler)(call_context&);
    bool async;         // queued by the client: errors are kept for its next synchronous call
    bool outside_gate;  // runs while its session is suspended (session::enter_call): spec annotation
};

extern const dispatch_entry dispatch_table[];
extern const size_t dispatch_table_size;

// The entry for an op id, or null when the op is not allowed.
const dispatch_entry* find_op(uint32_t id);

}  // namespace vcuda::server
