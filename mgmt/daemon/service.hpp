// The manager's request handler: authenticates the caller, decodes a JSON request, checks that the caller may
// make it, runs it against the core state under one lock, persists what changed, signs the lease tokens and
// encodes the reply. Transport-free, so tests call handle() directly with a fake clock;
// mgmt/daemon/server.hpp puts it on sockets.
//
// Who is who (mgmt/PROTOCOL.md, "Authentication"): a request signed with the shared secret comes from the
// cluster itself (a vcuda-server, or an operator on a host that holds the secret file); a tenant credential
// (`vcuda tokens create`) makes the caller that tenant, with operator rights if the credential has them.
// runs on: any thread; locks: mutex_ around the state and the store (calls are short; SQLite writes
// included).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "mgmt/core/rebalance.hpp"
#include "mgmt/core/state.hpp"
#include "mgmt/store/store.hpp"

namespace vcuda::mgmt {

struct service_config {
    state_config state;
    std::string secret;  // HMAC key for lease tokens, shared with the servers
    // Idle reclaim: a lease whose sessions had no call for this long is suspended (its GPU state saved by
    // the server, the GPU given back) and resumes at its next call. 0: off.
    std::chrono::milliseconds idle_suspend_after{0};
    // Rebalancing (vcuda-mgmt --rebalance, mgmt/core/rebalance.hpp): off unless set.
    std::optional<rebalance_config> rebalance;
};

// What the manager did and why, for `vcuda events` (kept in memory: the last max_events).
struct manager_event {
    int64_t at = 0;    // Unix ms
    std::string kind;  // suspend, resume, idle-reclaim, session, migrate, drain, rebalance, moved, not-moved
    std::string lease_id;
    std::string detail;
};

struct service_reply {
    bool ok = true;
    std::string body = "{}";  // JSON object; on error {"code": ...}
    std::string error;        // on error: what went wrong and what to do next
};

// Who made a request, once authenticated.
struct principal {
    enum class kind { anonymous, tenant, cluster };
    kind who = kind::anonymous;
    std::string tenant;         // for tenant: the credential's tenant
    std::string credential_id;  // for tenant: which credential
    bool is_operator = false;   // an operator credential, or the shared secret
    std::string describe() const;
};

class service {
  public:
    using clock_fn = std::function<time_ms()>;
    // `store` may be null (state in memory only: tests). `clock` defaults to the system clock.
    service(service_config cfg, std::unique_ptr<sqlite_store> store, clock_fn clock = {},
            std::function<std::string()> new_id = {});

    // Loads the stored state (call once, before serving).
    result<void, std::string> start();

    // `auth` is the request's auth field: a tenant credential, a shared-secret signature, or empty.
    service_reply handle(std::string_view method, std::string_view body, std::string_view auth = {});

    // Heartbeat timeouts and lease expiry; the daemon calls it about once a second.
    void tick();

    // The Prometheus exposition of the manager's state now (mgmt/daemon/metrics.hpp), for --metrics-listen.
    std::string metrics();

    time_ms now() const { return clock_(); }
    const service_config& config() const { return cfg_; }

  private:
    service_reply dispatch(std::string_view method, std::string_view body, time_ms now, const principal& who,
                           state_changes& changes);
    // Who sent the request; an error reply when the auth field is present but not valid.
    result<principal, service_reply> authenticate(std::string_view method, std::string_view body,
                                                  std::string_view auth, time_ms now);
    service_reply tokens(std::string_view method, const nlohmann::json& body, time_ms now,
                         const principal& who);
    std::string grant_json(const lease_record& l);
    bool persist(const state_changes& changes);

    service_config cfg_;
    std::unique_ptr<sqlite_store> store_;
    clock_fn clock_;
    std::mutex mutex_;
    manager_state state_;
    std::map<std::string, credential_record> credentials_;  // by id
    std::unordered_map<std::string, int64_t> nonces_;  // signed requests seen within the window, by nonce
    // Registrations refused for their address window, logged once each (the server retries): "host endpoints
    // W".
    std::set<std::string> refused_windows_;

    void event(time_ms now, std::string kind, std::string lease_id, std::string detail);
    // Moves: asks for one (event `kind` with `reason`), and records what came of those settled.
    mgmt_result<lease_record> ask_move(const manager_state::move_plan& plan, const std::string& kind,
                                       const std::string& reason, time_ms now);
    void note_move_outcomes(const std::vector<manager_state::move_outcome>& outcomes, time_ms now);
    // "GPU-… (host, srv-…)"
    std::string describe_gpu(const std::string& uuid) const;
    // Signs the lease token each move asked of a server presents to the target server.
    void sign_move_tokens(std::vector<active_lease>& leases, time_ms now) const;
    std::optional<rebalancer> rebalancer_;
    std::string last_standstill_;  // the last rebalancing decision that moved nothing, made an event
    // Events from a heartbeat's session reports: each new outcome of a suspend or resume (their notes).
    void note_session_changes(const server_record& before, const heartbeat& hb, time_ms now);
    static constexpr size_t max_events = 1000;
    std::deque<manager_event> events_;
    std::map<std::string, uint64_t> events_total_;  // by kind, since start (events_ keeps the last ones only)
};

}  // namespace vcuda::mgmt
