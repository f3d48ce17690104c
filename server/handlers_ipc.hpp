// What other parts of the server need of IPC between sessions (server/handlers_ipc.cpp): what a session's end
// or a device reset releases.
// runs on: lane threads; the session's release on the thread that ends it.
#pragma once

#include <cstdint>
#include <memory>

#include "server/session_tables.hpp"

namespace vcuda::server {

class call_context;
class session;

// A session's exports are withdrawn and what it opened is unmapped: for `device` (a reset)
// or every device. `mu` held, the device's context synchronized.
void release_ipc(session& s, size_t device);
// A stream-ordered allocation that is freed: its cuMemPoolExportPointer handle imports no more (sessions that
// imported it keep their import). `mu` held.
void withdraw_pointer_export(session& s, CUdeviceptr p);

}  // namespace vcuda::server
