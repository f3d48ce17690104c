// vcuda-server's core: accepts connections, runs HELLO, and gives each lane (connection) its own thread that
// verifies, dispatches and answers calls in order. Sessions end when their last lane ends.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/tls.hpp"
#include "common/transport.hpp"
#include "server/driver.hpp"
#include "server/session.hpp"
#include "vcuda_generated.h"

namespace vcuda::server {

struct message_reader;  // server/control_messages.hpp

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and the manager write GPU UUIDs.
std::string gpu_uuid_string(const CUuuid& u);
// The UUID a GPU has towards the manager (lease tokens, registration, heartbeats) under --gpu-identity TAG:
// one derived from its own UUID, the tag and its index (FNV-1a), shaped like a UUID; its own without a tag.
std::string gpu_identity_string(const CUuuid& u, const std::string& tag, size_t index);
// The GPU's utilization in percent over NVML's last sample period (server/handlers_nvml.cpp), for the
// manager's heartbeats; nothing when the host's NVML is missing or does not know the GPU.
std::optional<uint32_t> gpu_utilization(const CUuuid& u);

// The largest HELLO a server reads (header excluded): nothing else is allocated before a peer is
// authenticated.
inline constexpr uint32_t max_hello_bytes = 64u << 10;

class server {
  public:
    server(driver& drv, server_options opts) : drv_(drv), opts_(std::move(opts)) {}
    ~server();

    // Starts serving `l` on a thread of its own.
    void serve(listener l);
    // Stops accepting; live sessions are ended as their connections close.
    void stop();
    session_registry& sessions() { return sessions_; }
    // The UUID of GPU `index` towards the manager and in lease tokens (server_options::gpu_identities).
    std::string gpu_id(size_t index) const;
    // The index of the GPU whose gpu_id() is `id`, if this server has it.
    std::optional<size_t> gpu_index(const std::string& id) const;
    // Moves `sess`'s device `index` onto this server's GPU `gpu` (session::relocate, the manager's move to
    // another GPU of this server); its lease's claim of the old GPU becomes one of the new.
    CUresult relocate(const std::shared_ptr<session>& sess, size_t index, size_t gpu, std::string& why);
    // Connections being served now (lanes, bulk connections, HELLOs under way).
    uint32_t connections() const { return connections_.load(); }
    // Attached to a manager: the leases it reports alive on this server's GPUs (id, expiry), after every
    // heartbeat. A lease that was alive, or held a session, and is no longer reported was released or
    // expired: its tokens open no session from then on.
    void note_live_leases(
        const std::vector<std::pair<std::string, std::chrono::system_clock::time_point>>& alive);

    // --isolation process, in a worker process (`vcuda-server --worker-fd N`): serves the one session whose
    // id, key and grant the parent sends on `control_fd`, with the connections it hands over; returns the
    // process's exit status once the session has ended (server/isolation.cpp).
    static int run_worker(driver& drv, server_options opts, int control_fd);
    // A worker that cannot serve (its driver did not load): tells the session's client why; returns 1.
    static int refuse_worker(int control_fd, const std::string& why);
    // --isolation process, in the parent: the sessions' worker processes, for heartbeats, with what each
    // worker last said of its session (it says so every half second, and after a suspend or resume).
    struct worker_status {
        bool known = false;  // the worker has said anything yet
        bool suspended = false;
        int64_t idle_ms = 0;       // since the session's last call
        uint64_t memory_used = 0;  // on the GPU now
        std::string note;          // what came of the last suspend or resume
        std::string moved_to;      // the session moved there: it lives on there, not here
    };
    struct worker_session {
        uint64_t id = 0;
        int pid = 0;
        session_grant grant;
        std::string peer;
        int64_t opened_at_ms = 0;   // system clock
        bool local_client = false;  // its client came over a Unix socket (a move goes to one)
        worker_status status;
    };
    std::vector<worker_session> worker_sessions();
    // Asks session `id`'s worker to suspend (or resume) its session, as the manager asks of a session here;
    // its status tells what came of it. False when there is no such worker.
    bool ask_worker(uint64_t id, bool suspend);
    // Moves session `id`'s worker's session to `to`, as session::move_to does in thread mode: the worker
    // moves it, and says how it went (`note`: what the session's note says, or why not) within `wait`.
    CUresult move_worker_session(uint64_t id, const session::move_target& to, std::chrono::seconds wait,
                                 std::string& note);
    // Moves session `id`'s device on this server's GPU `from` to its GPU `to`, as relocate() does in thread
    // mode: the worker relocates it and says how it went; the session's grant and lease claim follow.
    CUresult relocate_worker_session(uint64_t id, size_t from, size_t to, std::chrono::seconds wait,
                                     std::string& note);
    // Ends a session served by a worker process (its lease is gone): the worker is sent SIGTERM.
    void end_worker_session(uint64_t id, const std::string& why);

  private:
    struct worker;  // server/isolation.cpp

    void accept_loop(listener* l);
    // After HELLO was read and checked: opens or joins the session and serves the connection (a lane, or a
    // bulk connection) until it ends.
    void serve_hello(frame_stream& fs, const frame& hello, const std::string& peer);
    // --isolation process (server/isolation.cpp). In the parent: opens a new session in a worker process of
    // its own, or checks a join's key, and hands the connection with its HELLO to the session's worker.
    void hand_over(frame_stream& fs, const frame& hello, const std::string& peer);
    // In a worker: the session the parent opened, made on its client's first connection (null, the client
    // told why, when it was made already).
    std::shared_ptr<session> adopt_session(const wire::Hello& h, const std::string& peer);
    void reap(const std::shared_ptr<worker>& w);
    // Parent: the worker of a session moved here named it (msg_adopted): its connections are routed by that
    // id and key from now on. A malformed or duplicate id stops the worker.
    void adopt_moved_worker(const std::shared_ptr<worker>& w, uint64_t id, std::string key, std::string peer,
                            bool ok);
    // Parent: that worker's moved session was not taken after all (msg_adopt_given_up): its id is free at
    // once, before the sender hears the refusal and may offer it again; the worker is an incoming one again
    // until it ends.
    void give_up_moved_worker(const std::shared_ptr<worker>& w);
    // Parent: a worker's request of the address window (server/device_memory.hpp shared_runs), answered on
    // the socket that came with it. False when `type` is not one.
    bool serve_window_request(worker& w, uint32_t type, message_reader& r, std::vector<int>& fds);
    // Sends `request` (a move or a relocation) to session `id`'s worker and waits up to `wait` for its
    // outcome (msg_move_result); the worker's record (null when it is gone) for the caller to update.
    CUresult ask_worker_outcome(uint64_t id, const std::vector<std::byte>& request, std::chrono::seconds wait,
                                std::string& note, std::shared_ptr<worker>& w);
    // Serves the IPC requests of worker `w` until it ends (server/ipc.hpp).
    void serve_worker(const std::shared_ptr<worker>& w);
    // `over_limit`: this connection is past --max-connections: it is only told so, and closed. `tls`: the
    // listener's, when it speaks TLS: the handshake comes first, on this connection's thread.
    void run_connection(stream s, bool over_limit, const tls_context* tls);
    void run_lane(const std::shared_ptr<session>& sess, frame_stream& fs, uint32_t lane_number);
    // A connection that held `sess` is done with it: the last one ends the session and releases it.
    void leave_session(const std::shared_ptr<session>& sess);
    // HELLO with `adopt`: another server moves a session here (server/session_transfer.cpp). Authorized as a
    // new session; rebuilt before the answer; kept for its client to join. In a worker process the parent
    // authorized and admitted it already: `granted` is what it granted.
    void receive_moved(frame_stream& fs, const wire::Hello& h, const std::string& peer,
                       const session_grant* granted = nullptr);
    // Decides what a new session may use: the GPUs it asks for, or — when the server is attached to a manager
    // — exactly the GPU and memory its lease token grants. False with `refusal` set when it may not open.
    bool authorize(const wire::Hello& h, session_grant& grant, std::string& refusal);
    // authorize(), telling a refused client why (and logging it).
    bool authorize(const wire::Hello& h, session_grant& grant, frame_stream& fs, const std::string& peer);
    // open_mu_ held. A lease token opens one session per GPU of its lease, and none once the lease is gone:
    // false with `refusal` set, else the (lease, GPU) is taken until drop_lease_claim.
    bool claim_lease(const session_grant& grant, std::string& refusal);
    // open_mu_ held. Frees what claim_lease took for `session_id` (0: a claim no session was made for).
    void drop_lease_claim(const std::string& lease_id, const std::vector<size_t>& gpus, uint64_t session_id);
    // open_mu_ held. Session `session_id`'s claim of (lease, GPU `from`) becomes one of GPU `to` (a
    // relocation).
    void move_lease_claim(const std::string& lease_id, size_t from, size_t to, uint64_t session_id);
    // open_mu_ held. Admits a new session when `open` sessions (or worker processes) are open: its lease
    // claimed and --max-sessions respected. False after telling the client why (and logging it); nothing is
    // taken then.
    bool admit(const session_grant& grant, size_t open, frame_stream& fs, const std::string& peer);

    driver& drv_;
    server_options opts_;
    session_registry sessions_;
    std::vector<std::unique_ptr<listener>> listeners_;
    std::vector<std::thread> acceptors_;
    std::atomic<bool> stopping_{false};
    std::atomic<uint32_t> connections_{0};  // threads serving a connection (accepted, not yet closed)
    std::mutex open_mu_;                    // a session count check and the creation it allows, together
    // Under open_mu_: (lease id, GPU index) -> the session open with that lease token (0 while it opens).
    std::map<std::pair<std::string, size_t>, uint64_t> lease_sessions_;
    std::map<std::string, std::chrono::system_clock::time_point>
        live_leases_;                                                        // as last reported: id -> expiry
    std::map<std::string, std::chrono::system_clock::time_point> released_;  // id -> when its tokens expire
    // --isolation process. Parent, under open_mu_: session id -> its worker process.
    std::map<uint64_t, std::shared_ptr<worker>> workers_;
    // Worker, under open_mu_: the session the parent opened, until its first connection makes it; and what
    // to do once it has ended (the worker exits).
    std::optional<std::pair<uint64_t, std::string>> adopt_id_key_;
    session_grant adopt_grant_;
    std::function<void()> on_session_end_;
    // Worker of a moved-in session: its id, key and client, once the moved state named them (the parent
    // routes the client's connections by them from then on). False: the parent refused it (that id is taken
    // there).
    std::function<bool(uint64_t, const std::string&, const std::string&)> on_session_adopted_;
    // The same worker: the session it named is not taken after all; returns once the parent has freed its id.
    std::function<void()> on_adopted_refused_;
    // Parent: the address window's runs its workers share (serve_window_request), started at the common
    // range's base the first worker reports.
    std::mutex window_mu_;
    window_runs worker_window_;
    uint64_t worker_window_base_ = 0;
};

}  // namespace vcuda::server
