// The manager's state machine: the inventory of servers and GPUs, the leases on them, placement,
// cordon/drain, heartbeat timeouts and lease expiry. Pure: no I/O, no threads, no clock of its own — every
// call that depends on time takes `now`, so tests drive it with a fake clock. The daemon
// (mgmt/daemon/service.hpp) puts a lock, the SQLite store and the wire around it.
//
// Placement (DESIGN.md, "Manager"): among the GPUs that may take the lease, the client's own host first, then
// best fit by memory (least memory left over after this lease), then least loaded (utilization, sessions).
// Shared GPUs are never over-committed: the quotas of the leases on a GPU add up to at most its memory.
// An exclusive lease takes a whole GPU that has no other lease. Cordoned GPUs, cordoned or draining servers
// and servers that are down take no new leases; leases already there keep running and can be renewed.
//
// Moves (`vcuda migrate`, drain, rebalancing): plan_move picks a target GPU for one lease device,
// request_move records it (the source server is asked through its heartbeat reply, active_leases_on),
// settle_moves reads the answer from the heartbeats and points the lease device at the new GPU, or leaves it
// where it was. runs on: the caller's thread; not thread-safe (the daemon serializes calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "mgmt/wire/types.hpp"

namespace vcuda::mgmt {

using time_ms = std::chrono::time_point<std::chrono::system_clock, std::chrono::milliseconds>;
inline int64_t to_unix_ms(time_ms t) { return t.time_since_epoch().count(); }
inline time_ms from_unix_ms(int64_t ms) { return time_ms(std::chrono::milliseconds(ms)); }

// An error the manager returns to a caller: `code` is stable (mgmt/PROTOCOL.md), `message` says what to do
// next.
struct mgmt_error {
    std::string code;
    std::string message;
};
template <class T>
using mgmt_result = result<T, mgmt_error>;

namespace errc {
inline constexpr const char* bad_request = "bad_request";
inline constexpr const char* unknown_method = "unknown_method";
inline constexpr const char* unauthenticated = "unauthenticated";  // no valid credential or signature
inline constexpr const char* forbidden = "forbidden";              // valid, but not allowed to do this
inline constexpr const char* unknown_server = "unknown_server";
inline constexpr const char* unknown_lease = "unknown_lease";
inline constexpr const char* no_capacity = "no_capacity";
inline constexpr const char* address_window_taken = "address_window_taken";  // server.register
inline constexpr const char* not_found = "not_found";
inline constexpr const char* internal = "internal";
}  // namespace errc

struct server_record {
    std::string id;
    std::string host;
    std::vector<std::string> endpoints;
    int32_t address_window = -1;  // -1: none (server_registration)
    bool cordoned = false;
    bool draining = false;
    bool down = false;
    time_ms registered_at{};
    time_ms last_heartbeat{};  // not persisted: a restarted manager gives every server a fresh timeout
    std::vector<session_report> sessions;  // from the last heartbeat; not persisted
};

struct gpu_record {
    gpu_description info;
    std::string server_id;
    bool cordoned = false;
    gpu_load load;  // from the last heartbeat; not persisted
    bool load_reported = false;
};

// A move of one of a lease's sessions to another GPU, asked for and not answered yet. While it is pending,
// the target GPU's server lists the lease too (so that it keeps the session it receives), and the target's
// memory counts the lease's quota (so that nothing else takes that room meanwhile).
struct pending_move {
    uint64_t seq = 0;     // the lease's move counter when it was asked for (active_lease.move_seq)
    std::string to_uuid;  // the target GPU
    time_ms asked_at{};
    std::string reason;  // who or what asked, for events: "asked by tenant admin ...", "drain of ...", ...
};

struct lease_device {
    std::string uuid;
    uint64_t memory_quota = 0;
    // Moves (not persisted, like the suspend counters): the last move asked for on this device, and the one
    // under way. A manager restart forgets a pending move: see README, "Operator moves".
    uint64_t move_seq = 0;
    time_ms move_asked_at{};
    std::optional<pending_move> move;
    // What the store keeps.
    bool operator==(const lease_device& o) const { return uuid == o.uuid && memory_quota == o.memory_quota; }
};

struct lease_record {
    std::string id;
    std::string client_host;
    int64_t pid = 0;
    std::string tenant;  // who holds it (the credential's tenant); empty for leases from before credentials
    bool exclusive = false;
    time_ms created_at{};
    time_ms expires_at{};
    std::vector<lease_device> devices;
    // Requests to suspend or resume its sessions (active_lease), and when the last suspend was asked for.
    // Not persisted: after a manager restart a suspended session stays so until its next call.
    uint64_t suspend_seq = 0;
    uint64_t resume_seq = 0;
    time_ms suspend_asked_at{};
    time_ms resume_asked_at{};
    // Moves: the counter each request takes the next value of, and when the lease last moved (rebalancing
    // leaves it where it is for a cooldown after that). Not persisted.
    uint64_t move_seq = 0;
    time_ms last_moved_at{};
};

struct state_config {
    std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(10);
    std::chrono::milliseconds lease_ttl = std::chrono::seconds(30);
    uint32_t max_gpus_per_lease = 64;
    // A move whose outcome no server has reported this long after it was asked for is given up (the lease
    // stays where it was). Long: a large session takes a while to copy (about 1.3 s per GiB today).
    std::chrono::milliseconds move_timeout = std::chrono::minutes(10);
};

// Everything the store keeps; load() takes it back after a restart.
struct state_snapshot {
    std::vector<server_record> servers;
    std::vector<gpu_record> gpus;
    std::vector<lease_record> leases;
};

// What a call changed, so the daemon can persist exactly that.
struct state_changes {
    std::vector<std::string> servers_put;      // server ids whose rows (and GPU rows) must be written
    std::vector<std::string> servers_deleted;  // server ids to delete (their GPUs moved elsewhere)
    std::vector<std::string> gpus_put;         // GPU uuids whose rows must be written
    std::vector<std::string> leases_put;       // lease ids to write
    std::vector<std::string> leases_deleted;   // lease ids to delete
    bool empty() const {
        return servers_put.empty() && servers_deleted.empty() && gpus_put.empty() && leases_put.empty() &&
               leases_deleted.empty();
    }
};

// The derived view of one GPU that listings and placement use.
struct gpu_view {
    const gpu_record* gpu = nullptr;
    const server_record* server = nullptr;
    uint64_t leased_memory = 0;
    uint32_t leases = 0;
    bool exclusive = false;  // held by an exclusive lease
    std::string state;       // up | down | cordoned | draining
};

class manager_state {
  public:
    explicit manager_state(state_config cfg, std::function<std::string()> new_id = {});

    const state_config& config() const { return cfg_; }

    // Replaces the whole state with a stored snapshot (manager start). Servers get a fresh heartbeat timeout
    // from `now`; leases get at least one TTL from `now`, since their clients could not renew while the
    // manager was away.
    void load(state_snapshot snap, time_ms now);
    state_snapshot snapshot() const;

    // A server (re)announces itself and its GPUs. The same host + endpoints keeps its server id (and cordon
    // flags); GPUs are keyed by UUID, so a GPU keeps its cordon flag and its leases when its server
    // re-registers. A server asking for the address window another server holds is refused
    // (address_window_taken, naming the free ones), even when that server is down: its sessions keep their
    // addresses wherever they go. A server that chose its window itself (address_window_auto) is given a
    // free one instead: the window its record had, else the lowest; the record says which.
    mgmt_result<std::string> register_server(const server_registration& reg, time_ms now,
                                             state_changes& changes);
    // Records load; a server that was down is up again. unknown_server when the id is not known (register
    // again).
    mgmt_result<heartbeat_reply> heartbeat(const mgmt::heartbeat& hb, time_ms now, state_changes& changes);

    // `tenant` owns the lease: only it (or an operator) may renew or release it (mgmt/daemon/service.cpp).
    mgmt_result<lease_record> acquire(const lease_request& req, time_ms now, state_changes& changes,
                                      const std::string& tenant = {});
    mgmt_result<lease_record> renew(const std::string& lease_id, time_ms now, state_changes& changes);
    mgmt_result<lease_record> release(const std::string& lease_id, state_changes& changes);

    // Asks the servers of the lease to suspend (`resume` false) or resume its sessions, at their next
    // heartbeat.
    mgmt_result<lease_record> request_suspend(const std::string& lease_id, bool resume, time_ms now);
    // Idle reclaim: every lease whose sessions on the server `server_id` all had no call for `idle_after`,
    // none suspended, and no suspend asked for within `idle_after`, is asked to suspend. Returns their ids.
    std::vector<std::string> reclaim_idle(const std::string& server_id, std::chrono::milliseconds idle_after,
                                          time_ms now);

    // ---- moves (`vcuda migrate`, drain, rebalancing)
    // Which lease device `lease_or_session` names: a lease id (a lease of one GPU), or a session id as the
    // servers report it (`vcuda sessions`). Returns the lease id and the device's position in the lease.
    mgmt_result<std::pair<std::string, size_t>> find_lease_device(const std::string& lease_or_session) const;
    struct move_plan {
        std::string lease_id;
        size_t device = 0;  // position in the lease
        std::string from_uuid;
        std::string to_uuid;
    };
    // Where device `device` of `lease_id` can go: `to` is a GPU uuid, a server id, a server host, or empty
    // (any GPU). A target is up (not cordoned, draining or down), not the GPU the session is on (of any
    // index, on any server, its own too: the session keeps its device index, placed on that GPU), and has
    // room for the lease's quota (a whole free GPU for an exclusive lease). Among several: best fit by
    // memory, then least loaded, as placement. not_found / no_capacity / bad_request say why nothing fits.
    mgmt_result<move_plan> plan_move(const std::string& lease_id, size_t device, const std::string& to) const;
    // Records the request: the source server acts at its next heartbeat (active_lease's move fields).
    mgmt_result<lease_record> request_move(const move_plan& plan, std::string reason, time_ms now);
    // What came of a move: reported by the server it left (moved or not, with its note), given up after
    // move_timeout, or found where it went when its old server is down.
    struct move_outcome {
        std::string lease_id;
        std::string from_uuid;
        std::string to_uuid;
        bool moved = false;
        std::string note;    // the server's words ("moved to ...: 32 MiB of GPU state, paused 80 ms")
        std::string reason;  // the request's
        std::chrono::milliseconds took{0};
    };
    // Sessions reported by a server's heartbeat (`hb`, already recorded by heartbeat()): settles the moves
    // they answer. A moved lease's device is on the target GPU from then on; a move that failed is
    // forgotten (the lease stays where it was).
    std::vector<move_outcome> settle_moves(const mgmt::heartbeat& hb, time_ms now, state_changes& changes);
    // Every device of every lease with a move under way.
    size_t moves_pending() const;

    // `target`: a GPU uuid, a server id or a server host (every server on it). Returns the GPUs and servers
    // changed.
    struct cordon_result {
        std::vector<std::string> gpus;     // uuids
        std::vector<std::string> servers;  // server ids
    };
    mgmt_result<cordon_result> cordon(const std::string& target, bool on, state_changes& changes);
    // Drain: no new leases on the server(s) of `host_or_id`; existing leases run out. Returns the server ids.
    mgmt_result<std::vector<std::string>> drain(const std::string& host_or_id, state_changes& changes);

    // Marks servers that missed heartbeats down and drops expired leases.
    struct tick_result {
        std::vector<std::string> servers_down;
        std::vector<lease_record> leases_expired;
        std::vector<move_outcome> moves_given_up;  // no outcome within move_timeout
    };
    tick_result tick(time_ms now, state_changes& changes);

    // ---- views
    const std::map<std::string, server_record>& servers() const { return servers_; }
    const std::map<std::string, gpu_record>& gpus() const { return gpus_; }
    const std::map<std::string, lease_record>& leases() const { return leases_; }
    const server_record* server_of_gpu(const std::string& uuid) const;
    gpu_view view(const gpu_record& g) const;
    // GPUs in listing order: host, then index.
    std::vector<gpu_view> gpu_views() const;
    uint32_t leases_on_server(const std::string& server_id) const;
    // up | cordoned | draining (leases still on it) | drained | down, as `vcuda servers` shows it.
    std::string server_state(const server_record& s) const;
    // The leases on a server's GPUs, with the moves asked of it (move_token left empty: the daemon signs
    // it), and the leases on their way to it (pending moves whose target is one of its GPUs).
    std::vector<active_lease> active_leases_on(const std::string& server_id) const;
    // Where a server's sessions can reach another server: its endpoints, without Unix sockets when the two
    // are on different hosts.
    std::vector<std::string> endpoints_from(const server_record& target, const server_record* source) const;

  private:
    std::string make_id(const char* prefix);
    std::vector<const server_record*> servers_matching(const std::string& host_or_id) const;

    state_config cfg_;
    std::function<std::string()> new_id_;
    uint64_t counter_ = 0;
    std::map<std::string, server_record> servers_;  // by id
    std::map<std::string, gpu_record> gpus_;        // by uuid
    std::map<std::string, lease_record> leases_;    // by id
};

}  // namespace vcuda::mgmt
