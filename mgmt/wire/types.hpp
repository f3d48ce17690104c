// The messages of the manager protocol as plain structs (mgmt/PROTOCOL.md gives their JSON). Shared by the
// client (lease requests), the server (registration, heartbeats) and the manager itself.
// Times on the wire are Unix milliseconds (wall clock), since they cross machines and manager restarts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vcuda::mgmt {

// ---- lease.acquire / lease.renew
struct lease_hints {
    bool same_host = false;  // all GPUs of the lease on one host
    std::string model;       // only GPUs whose name contains this (case-insensitive), e.g. "H100"
    bool exclusive = false;  // whole GPUs, shared with nobody
};

struct lease_request {
    std::string client_host;      // the client's host name; GPUs on this host are preferred
    int64_t pid = 0;              // for operators: which process holds the lease
    uint32_t gpus = 1;            // how many GPUs
    uint64_t memory_per_gpu = 0;  // bytes per GPU (the vGPU size); 0 = the whole GPU
    lease_hints hints;
};

struct device_grant {
    std::vector<std::string> server_endpoints;  // where the vcuda-server serving this GPU listens
    std::string host;                           // that server's host
    uint32_t gpu_index = 0;                     // the GPU's ordinal on that server
    std::string uuid;                           // the GPU's UUID
    std::string name;                           // the GPU's model name
    uint64_t memory_quota = 0;                  // bytes this lease may allocate on it
    std::string token;                          // present it to the server when opening the session
};

struct lease_grant {
    std::string lease_id;
    int64_t expires_at = 0;  // Unix ms; renew well before
    int64_t ttl_ms = 0;      // the manager's lease lifetime: renew every ttl/3
    std::vector<device_grant> devices;
};

// ---- server.register / server.heartbeat
struct gpu_description {
    uint32_t index = 0;
    std::string uuid;
    std::string name;
    uint64_t memory = 0;  // bytes
    uint32_t sms = 0;
    std::string driver_version;
};

// How many address windows a server may be given (0 to count-1; server/window_runs.hpp checks its own).
inline constexpr int32_t address_window_count = 64;

struct server_registration {
    std::string host;
    std::vector<std::string> endpoints;  // addresses clients connect to, e.g. "10.0.0.5:7300"
    std::vector<gpu_description> gpus;
    // The server's address window (vcuda-server --address-window; server/device_memory.hpp), -1: none. Two
    // servers in one window hand out the same device addresses: the manager registers only one of them.
    int32_t address_window = -1;
    // The server chose its window itself (--address-window auto) and takes another that the manager names in
    // its reply when this one is taken, rather than be refused.
    bool address_window_auto = false;
};

struct gpu_load {
    std::string uuid;
    uint32_t utilization = 0;  // percent, 0-100
    uint64_t memory_used = 0;  // bytes in use on the GPU (all processes)
    uint32_t sessions = 0;     // vcuda sessions on it
};

struct session_report {
    std::string session_id;
    std::string lease_id;  // empty when the session has no lease (server without a manager token)
    std::string gpu_uuid;
    std::string client;  // the client's address
    uint64_t memory_used = 0;
    // Suspend and resume (the manager asks through active_lease's request counters): the session's state,
    // how long since its last call, the last request of each kind the server acted on, and what came of the
    // last one ("suspended: 812 MiB saved in 120 ms", "not suspended: ...").
    bool suspended = false;
    int64_t idle_ms = 0;
    uint64_t suspend_seq = 0;
    uint64_t resume_seq = 0;
    std::string note;
    // Moves (active_lease's move_* fields): the last move request the server has finished for this session
    // (its outcome is `note`: "moved to ADDR: ..., paused N ms" or "not moved: why"), and where the session
    // went when it moved (empty while it lives here). A session that moved is reported once more by the
    // server it left, with moved_to set, so that the manager learns the outcome.
    uint64_t move_seq = 0;
    std::string moved_to;
};

struct heartbeat {
    std::string server_id;
    std::vector<gpu_load> gpus;
    std::vector<session_report> sessions;  // optional: what `vcuda sessions` shows
    // The server's address window, as registered (-1: none). A record that differs (a manager upgraded from
    // one that did not store windows) makes the server register again, where the window rule applies.
    int32_t address_window = -1;
};

// What the heartbeat reply tells a server: the leases that are alive on its GPUs. A session whose lease is
// not in this list (released, expired) should be closed and its memory freed.
struct active_lease {
    std::string lease_id;
    std::string uuid;
    uint64_t memory_quota = 0;
    int64_t expires_at = 0;
    // Requests to suspend or resume the lease's sessions, counted: a server acts on each once (a counter past
    // the one its session reports), so a request is neither lost nor repeated across heartbeats.
    uint64_t suspend_seq = 0;
    uint64_t resume_seq = 0;
    // When the last of each was asked for (Unix ms): a session opened before that is one it is meant for,
    // even when the session first hears of the counters after the request.
    int64_t suspend_asked_at = 0;
    int64_t resume_asked_at = 0;
    // A request to move the lease's session on this GPU (`uuid`) to another server (`vcuda migrate`, a drain,
    // the manager's rebalancing), counted like the others: the server acts once on a move_seq past the one
    // its session reports, while move_to_uuid is set (it is cleared once the manager has the outcome). The
    // session goes to the first of move_to_endpoints of its client's transport kind (a Unix socket for a
    // client on one, else TCP), presenting move_token (a lease token for move_to_uuid).
    uint64_t move_seq = 0;
    int64_t move_asked_at = 0;
    std::string move_to_uuid;
    std::vector<std::string> move_to_endpoints;
    std::string move_token;
};

struct heartbeat_reply {
    std::vector<active_lease> leases;
    int64_t heartbeat_interval_ms = 0;  // how often the manager wants heartbeats
};

}  // namespace vcuda::mgmt
