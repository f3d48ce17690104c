// The manager's request handler: decodes a JSON request, runs it against the core state under one lock,
// persists what changed, signs the lease tokens and encodes the reply. Transport-free, so tests call
// handle() directly with a fake clock; mgmt/daemon/server.hpp puts it on sockets.
// runs on: any thread; locks: mutex_ around the state and the store (calls are short; SQLite writes
// included).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "mgmt/core/state.hpp"
#include "mgmt/store/store.hpp"

namespace vcuda::mgmt {

struct service_config {
    state_config state;
    std::string secret;  // HMAC key for lease tokens, shared with the servers
};

struct service_reply {
    bool ok = true;
    std::string body = "{}";  // JSON object; on error {"code": ...}
    std::string error;        // on error: what went wrong and what to do next
};

class service {
  public:
    using clock_fn = std::function<time_ms()>;
    // `store` may be null (state in memory only: tests). `clock` defaults to the system clock.
    service(service_config cfg, std::unique_ptr<sqlite_store> store, clock_fn clock = {},
            std::function<std::string()> new_id = {});

    // Loads the stored state (call once, before serving).
    result<void, std::string> start();

    service_reply handle(std::string_view method, std::string_view body);

    // Heartbeat timeouts and lease expiry; the daemon calls it about once a second.
    void tick();

    time_ms now() const { return clock_(); }
    const service_config& config() const { return cfg_; }

  private:
    service_reply dispatch(std::string_view method, std::string_view body, time_ms now,
                           state_changes& changes);
    std::string grant_json(const lease_record& l);
    bool persist(const state_changes& changes);

    service_config cfg_;
    std::unique_ptr<sqlite_store> store_;
    clock_fn clock_;
    std::mutex mutex_;
    manager_state state_;
};

}  // namespace vcuda::mgmt
