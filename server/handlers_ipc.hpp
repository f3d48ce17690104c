// What other parts of the server need of IPC between sessions (server/handlers_ipc.cpp): events shared in
// this process (thread mode) for the event handlers, and what a session's end or a device reset releases.
// runs on: lane threads; the session's release on the thread that ends it.
#pragma once

#include <cstdint>
#include <memory>

#include "server/session_tables.hpp"

namespace vcuda::server {

class call_context;
class session;

// The membership of event `id` of the calling session in a shared event, or null when it is a plain event.
std::shared_ptr<event_member> shared_member(call_context& cx, uint64_t id);
// The event a wait, query or synchronization of a shared event uses: the latest recorded (null: none, which
// is complete).
std::shared_ptr<event_member> latest_of(const event_member& m);
// `m` was recorded: it is the shared event's latest now.
void recorded(const std::shared_ptr<event_member>& m);
// The session's event of membership `m` is about to be destroyed (`m` is the last reference the session had):
// if it is the latest, its work is waited for and the shared event has none; and when this
// returns no other session uses it (those that took it as the latest a moment before are waited for, up to
// 2 s).
void leave_shared_event(const std::shared_ptr<event_member>& m, const driver_table& d);

// A session's exports are withdrawn, what it opened is unmapped, its memberships left: for `device` (a reset)
// or every device. `mu` held, the device's context synchronized.
void release_ipc(session& s, size_t device);

}  // namespace vcuda::server
