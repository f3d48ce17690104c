// A session: what one client (a VM, a container, a process) holds on this server — its own CUDA context per
// GPU, its handle table, its device memory and quota, its cached images. Lanes (one per client thread, each
// its own connection and thread) run calls under it. The session ends when its last lane ends, and then
// releases everything it held.
// locks: `mu` guards the handles, memory and the tables of server/session_tables.hpp (globals, images,
// stream-ordered allocations, host regions, VMM, links); contexts are created once under it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/transport.hpp"
#include "server/bulk.hpp"
#include "server/deferred_copies.hpp"
#include "server/device_memory.hpp"
#include "server/device_output.hpp"
#include "server/driver.hpp"
#include "server/handle_table.hpp"
#include "server/host_window.hpp"
#include "server/ipc.hpp"
#include "server/jit.hpp"
#include "server/precopy.hpp"
#include "server/session_tables.hpp"
#include "vcuda_generated.h"

namespace vcuda::server {

// A session's key (the secret that lets lanes join it): 256 bits from the OS CSPRNG.
inline constexpr size_t session_key_bytes = 32;

struct server_options {
    uint64_t memory_quota = 0;  // bytes per GPU per session; 0 = the GPU's own memory
    uint64_t host_memory_quota =
        0;               // pinned host memory shared with a local client, bytes per session; 0 = none
    std::string secret;  // when set, every new session needs a token signed with it (mgmt/token.hpp)
    bool managed =
        false;  // the secret is the manager's: only lease tokens for this server's GPUs open sessions
    std::vector<uint32_t>
        allowed_uids;       // Unix sockets: only peers with these uids (SO_PEERCRED); empty = any
    bool shm_rings = true;  // frames of local (Unix socket) clients through shared-memory rings
    std::chrono::microseconds spin =
        default_spin();  // how long a lane thread spins for the next frame before it sleeps
    uint32_t bulk_streams =
        8;  // the most bulk connections one bulk set of a session may have; 0: striping off
    uint32_t max_sessions = 256;      // sessions open at once; a HELLO past it is refused with a message
    uint32_t max_connections = 1024;  // connections (lanes, bulk connections, HELLOs under way) at once
    // --isolation process: each session runs in a worker process of its own (server/isolation.hpp), started
    // as `/proc/self/exe --worker-fd 3` followed by `worker_args` (the options a worker needs).
    bool isolate = false;
    std::vector<std::string> worker_args;
    // --address-window N: where this server places sessions' memory (server/device_memory.hpp); null: where
    // the driver chooses. Shared by all sessions.
    std::shared_ptr<address_window> window;
    // The same for the pinned host pages shared with local clients (server/host_window.hpp).
    std::shared_ptr<host_window> host_addresses;
    // IPC between sessions (server/ipc.hpp): the registry of this process (--isolation thread), or the
    // parent's through the control socket (a worker). Null: IPC is not served.
    std::shared_ptr<ipc_broker> ipc;
    // --isolation process, in the parent: the registry its workers' brokers ask (server/isolation.cpp).
    std::shared_ptr<ipc_registry> ipc_exports;
    // --move-memory: how a moving session's device memory goes (server/session_transfer.cpp). share: to a
    // server on this host on the same GPU the physical memory itself, else pre-copied; precopy: always
    // pre-copied (copied while the application runs, then what changed); copy: copied while it is paused.
    enum class move_memory_mode { share, precopy, copy };
    move_memory_mode move_memory = move_memory_mode::share;
    // --move-copy-limit: the most bytes a move may copy while the session is paused (the application's VMM
    // allocations unless handed over, and device memory with --move-memory copy); a move past it is refused,
    // so that a pause never outlasts what a client waits for (a lane it opens meanwhile waits 5 s).
    uint64_t move_copy_limit = uint64_t{16} << 30;
    // --test-precopy-hold MS (tests): a pre-copied move waits this long between its pre-copy and its pause,
    // so that a test program can change memory in between.
    std::chrono::milliseconds test_precopy_hold{0};
    // --test-precopy-hold-until FILE (tests): ... or until FILE exists (60 s at most).
    std::string test_precopy_hold_until;
    // --test-suspend-every, in a worker process (--isolation process): its session is suspended that often
    // while no call runs (tests; the server process does the same for its own sessions).
    std::chrono::milliseconds test_suspend_every{0};
    // --suspend-graphs (the default; --no-suspend-graphs): a suspend keeps CUDA graphs
    // (server/graph_image.cpp) instead of being refused by them.
    bool suspend_graphs = true;
    // --gpu-identity TAG: the UUID each GPU (by index) has towards the manager and in lease tokens, so that
    // several servers on one physical GPU (tests, the software driver) are distinct GPUs to the manager.
    // Empty: each GPU's own UUID. NVML and the application still see the physical UUID.
    std::vector<std::string> gpu_identities;
};

struct session_image;  // server/session_image.hpp

// The largest description of a session moved between servers (names, handle slots, globals' contents), read
// once its sender was authorized; the memory itself comes in pieces after it.
inline constexpr uint32_t max_moved_state_bytes = 512u << 20;
// The most bytes of one pre-copied piece a receiver takes (server/precopy.hpp).
inline constexpr uint64_t max_precopy_piece = uint64_t{1} << 30;

// Events and their total duration, as a Prometheus summary's _count and _sum (server/metrics.cpp).
struct timed_count {
    std::atomic<uint64_t> count{0}, micros{0};
    void add(std::chrono::steady_clock::duration d) {
        count.fetch_add(1, std::memory_order_relaxed);
        micros.fetch_add(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count()),
            std::memory_order_relaxed);
    }
};

// What happened in a session, counted where it happens with relaxed atomic adds (no lock on the call path),
// read by the metrics endpoint (server/metrics.cpp). The registry adds those of ended sessions to its own, so
// that the server's totals never go down.
struct session_counters {
    std::atomic<uint64_t> calls{0};  // calls its lanes received, allowed or not
    timed_count suspends;            // GPU state saved and given back (session::suspend)
    timed_count resumes;             // rebuilt (the next call, or an operator's resume)
    // Moves to another server (issue 18's live migration): count it here, with the pause the application saw.
    timed_count migrations;
    void add_to(session_counters& sum) const;
};

// What a session may use: which of the server's GPUs (by index) and how much memory on each.
struct session_grant {
    std::vector<size_t> gpus;  // empty = all
    // A moved session's device indices (the client's, kept from the server it came from) and the GPU of this
    // server each runs on here (place_moved, server/placement.hpp): a move may change the GPU's index.
    // Empty: each device index is the GPU of that index.
    std::map<size_t, size_t> placed;
    uint64_t memory_quota = 0;  // 0 = the server's default
    std::string lease_id;
    // Who opened it (server::authorize): sessions of one tenant may open each other's IPC handles
    // (server/ipc.hpp). "tenant:NAME" (a lease token of the manager's), "lease:ID" (one from before tenants
    // were in tokens), "token:DIGEST" (a shared token of `vcuda token create`), "uid:N" (a Unix socket's peer
    // without a secret), "anonymous" (loopback TCP without a secret).
    std::string tenant;
};

class session : public std::enable_shared_from_this<session> {
  public:
    // `key`: the secret a lane presents to join (session_key_bytes from the OS CSPRNG).
    session(uint64_t id, std::string key, driver& drv, const server_options& opts, const session_grant& grant,
            std::string peer);
    ~session();

    uint64_t id() const { return id_; }
    const std::string& key() const { return key_; }
    const std::string& peer() const { return peer_; }
    driver& drv() { return *drv_; }
    const driver_table& api() const { return drv_->api(); }
    size_t device_count() const { return devices_.size(); }
    uint64_t quota(size_t device) const;
    // True when this session may use its device `device`. A session's device indices are the client's; each
    // runs on one of the server's GPUs (gpu_of), the GPU of the same index unless the session moved here from
    // a GPU of another index.
    bool allowed(size_t device) const { return device < devices_.size() && devices_[device].allowed; }
    // The server's GPU (an index of drv().gpus()) behind an allowed device index.
    size_t gpu_of(size_t device) const { return devices_[device].gpu; }
    // The allowed device index that runs on the server's GPU `gpu`, if any.
    std::optional<size_t> device_on(size_t gpu) const {
        for (size_t i = 0; i < devices_.size(); ++i)
            if (devices_[i].allowed && devices_[i].gpu == gpu) return i;
        return std::nullopt;
    }
    const std::string& lease_id() const { return lease_id_; }
    const std::string& tenant() const { return tenant_; }
    ipc_broker* ipc() const { return opts_.ipc.get(); }
    // Whether this session is the only one its process serves (a worker of --isolation process; the parent
    // serves none itself): the driver's process-wide rules are then the application's alone.
    bool alone_in_process() const { return opts_.isolate; }
    // --suspend-graphs: executable graphs' origins are kept (server/graph_image.cpp).
    // --suspend-graphs, or the session came here from a server with it, holding graphs: it keeps them as
    // there (executable graphs' clones, their nodes), so that they follow it through later moves.
    bool keeps_graphs() const { return opts_.suspend_graphs || carried_graphs_.load(); }
    // The server's address window (--address-window), or null (none).
    address_window* window() const { return opts_.window.get(); }

    // The session's context on `device`, created on first use. Null with `rc` set if creation failed.
    CUcontext context(size_t device, CUresult& rc);
    // The context of the session's first GPU: created on first use (context(), above) or only if it exists.
    // For calls that name no device but still need a context (parameter layouts of a CUkernel).
    CUcontext first_context(CUresult& rc);
    CUcontext existing_first_context();
    device_memory& memory(size_t device) { return *devices_[device].memory; }
    // The real CUdevice behind the session's device index.
    CUresult real_device(size_t device, CUdevice& out) const {
        if (device >= devices_.size() || !devices_[device].allowed) return CUDA_ERROR_INVALID_DEVICE;
        out = devices_[device].device;
        return CUDA_SUCCESS;
    }

    // The session's index of real device `real`; -1 when the session has no such device.
    int session_device(CUdevice real) const {
        for (size_t i = 0; i < devices_.size(); ++i)
            if (devices_[i].device == real) return static_cast<int>(i);
        return -1;
    }

    // What kernels printed that a suspend or a move flushed (its synchronize runs on no lane's thread): the
    // next reply of any lane here carries it (server/call_context.cpp, answer_moved in server/server.cpp).
    void hold_output(const std::string& printed);
    std::string take_held_output();  // cheap when there is none
    // While alive, what the driver writes on this thread is held for the client: the driver writes kernels'
    // printf on the thread of whichever call flushes it, and a suspend's save or a move's pre-copy calls the
    // driver on no lane's thread.
    class output_for_client {
      public:
        explicit output_for_client(session& s) : s_(s), capture_(printed_) {}
        ~output_for_client() { s_.hold_output(printed_); }
        output_for_client(const output_for_client&) = delete;
        output_for_client& operator=(const output_for_client&) = delete;

      private:
        session& s_;
        std::string printed_;
        device_output::capture capture_;  // after printed_: made after it, ended before it
    };

    // True when [p, p+n) is this session's memory on any of its GPUs (allocations or module globals).
    bool owns_range(CUdeviceptr p, size_t n);
    bool owns_range_locked(CUdeviceptr p, size_t n);  // the same, `mu` held
    // Gives back the allocations freed in stream order whose streams got past the free (`wait`: waits for
    // every one); `mu` held.
    void settle_stream_frees(bool wait);

    // Pinned host memory shared with a client on this host (server/session_tables.hpp).
    host_regions host;  // under mu
    // Device-to-host copies the client left under way (server/deferred_copies.hpp).
    deferred_copies deferred;
    // Staging buffers of graph copies with the client's memory (charged to `host`'s quota).
    host_copy_buffers host_copies;
    // Unregisters and frees the retired staging buffers (`all`: every one, at the session's end), on a thread
    // that may call the driver (server/handlers_hostfn.cpp).
    void drop_host_copies(bool all);
    uint64_t host_quota() const { return opts_.host_memory_quota; }
    // Shared pinned host pages, placed in the server's host window when it has one: anywhere (null when no
    // room), at exactly `addr` (a moved session's pages), and gone again.
    void* map_host_pages(int fd, size_t size);
    bool map_host_pages_at(uintptr_t addr, int fd, size_t size);
    void unmap_host_pages(uintptr_t addr, size_t size);
    // Unregisters the pinned pages at `addr` from the driver, relaxed (a capture under way on this thread
    // must not keep them registered: pages mapped there later could not be registered again). A failure is
    // logged.
    void unregister_host_pages(uintptr_t addr);
    // True when [p, p+n) lies inside one of this session's host regions.
    bool owns_host(uintptr_t p, size_t n);
    // The copy mark of the region holding [p, p+n) (made now if it has none); null when no region holds it.
    std::shared_ptr<copy_mark> host_copy_mark(uintptr_t p, size_t n);
    void release_host_regions();

    // The virtual memory management API as the application uses it (server/handlers_vmm.cpp). Physical
    // allocations are handles (mem_handle) whose size is charged to the device's quota at creation.
    vmm_tables vmm;  // under mu
    // Stream-ordered allocations (server/handlers_pool.cpp).
    pool_allocations pools;  // under mu
    // Graph allocations (server/handlers_graph.cpp).
    graph_allocations graph_memory;
    // Conditional handles the session made (cuGraphConditionalHandleCreate): only those name conditional
    // nodes.
    std::unordered_set<uint64_t> conditional_handles;  // under mu
    // CUDA arrays, texture and surface objects (server/handlers_array.cpp).
    array_tables arrays;  // under mu
    // Executable graphs' origins, for a suspend (server/graph_image.cpp).
    graph_exec_origins graph_execs;  // under mu
    // IPC between sessions: what this one exported and opened (server/handlers_ipc.cpp).
    ipc_tables ipc_state;  // under mu
    void release_vmm();

    // Ends the session's use of `device` (context reset) or of everything (session end).
    void release_device(size_t device);
    void release_all();

    std::mutex mu;
    handle_table handles;
    module_globals globals;  // under mu
    image_cache images;      // under mu
    module_origins origins;  // under mu
    event_ages event_times;  // under mu
    link_states links;       // under mu
    // Green contexts (server/handlers_green.cpp): each handle's CUcontext (cuCtxFromGreenCtx), in which the
    // calls that name it run (Call.green_ctx, ctx_event). Under mu.
    std::map<uint64_t, CUcontext> green_contexts;
    // Green context `id`'s CUcontext; nullptr when the session has no such green context. Takes mu.
    CUcontext green_context(uint64_t id);

    // ---- Suspend and resume (server/session_image.cpp): the session's GPU state saved to this server's
    // memory and the GPU given back, then rebuilt at the same addresses, under the same handles. Every call a
    // lane runs is inside the gate: enter_call() waits while a suspend or resume is under way and resumes a
    // suspended session first (the application's next call brings its state back); its error when that failed
    // (`why` says why). Lanes call leave_call() when the call is done.
    CUresult enter_call(std::string& why);
    void leave_call();
    // Closes the gate, waits up to `wait` for the calls running to end (else CUDA_ERROR_NOT_READY), drains
    // the GPU, saves the state and releases it. CUDA_ERROR_NOT_SUPPORTED when the session holds what cannot
    // be rebuilt yet (`why` names it); nothing changes then.
    CUresult suspend(std::chrono::milliseconds wait, std::string& why);
    // Rebuilds a suspended session now (an operator's resume) rather than at its next call.
    CUresult resume(std::string& why);
    // Moves device `index` onto this server's GPU `gpu` (the manager's move to another GPU of this server): a
    // suspend, the device pointed at that GPU, the rebuild there; the session's device index, addresses and
    // handles stay. On a failed rebuild the device goes back where it was and is rebuilt there. `why` says
    // why not (what suspend refuses, a GPU another of its devices is on).
    CUresult relocate(size_t index, size_t gpu, std::chrono::milliseconds wait, std::string& why);
    bool suspended() const { return suspended_.load(); }
    // Changes at each rebuild: a lane's context cache is stale then.
    uint64_t epoch() const { return epoch_.load(); }
    // The manager's suspend and resume requests this session has acted on (mgmt active_lease counters;
    // `baseline` false until the first heartbeat reply set them), and what came of the last suspend or
    // resume, for heartbeats and `vcuda events`.
    std::atomic<uint64_t> suspend_seq_seen{0}, resume_seq_seen{0};
    // The manager's move requests (active_lease.move_seq) this session has taken up (the outcome is reported
    // apart, by server/main.cpp, since a session that moved soon ends here).
    std::atomic<uint64_t> move_seq_seen{0};
    std::atomic<bool> seqs_known{false};
    int64_t opened_at_ms() const { return opened_at_ms_; }
    std::string note() {
        std::lock_guard lock(gate_mu_);
        return note_;
    }
    // When a call last entered the gate (for idle reclaim).
    std::chrono::steady_clock::time_point last_call() const {
        return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_call_.load()));
    }

    // ---- Moving to another server (server/session_transfer.cpp). move_to() closes the gate, saves the state
    // (as suspend) and sends it to the server at `to`, which rebuilds it under the same id, key, handles and
    // device addresses; from then on every call to this session here is answered with where it went
    // (moved()), and the client joins it there. On failure the session stays here, suspended: its next call
    // rebuilds it. CUDA_ERROR_NOT_SUPPORTED names what cannot move yet.
    struct move_target {
        endpoint where;
        std::string address;  // as clients write it: the moved reply tells them
        std::string token;    // authorizes the new session there as a client's token would
    };
    CUresult move_to(const move_target& to, std::chrono::milliseconds wait, std::string& why);
    bool moved() const { return moved_.load(); }
    std::string moved_to() {
        std::lock_guard lock(gate_mu_);
        return moved_to_;
    }
    // On the receiving server, in a new session made with the state's id and key: takes the state and the
    // pieces that follow it on `fs` (with what was pre-copied before the state, in `pre`), and rebuilds the
    // session. On failure the caller removes the session.
    CUresult take_moved_state(const wire::SessionState& st, frame_stream& fs, precopy_store& pre,
                              std::string& why);
    // The last call lane `lane` ran in this session (here or, for a moved session, where it was before).
    uint64_t progress_of(uint32_t lane);
    // A moved session's client joined it with its lane 0, the lane its process keeps until it exits.
    std::atomic<bool> first_lane_here{false};
    bool local_client = false;  // opened over a Unix socket (set once, before its first call)

    // Host functions (cuLaunchHostFunc) run in the client: the driver's callback waits here until the client
    // has run it (server/handlers_hostfn.cpp). Stopped at session end so that no callback waits for ever.
    void host_func_started(uint64_t id, bool in_graph);
    // Waits for a started one (`in_graph`: captured into a graph, so it runs again); false once stopped, or
    // once `client_gone` (looked at every 100 ms) says the client that waits for it has gone (its process
    // ended: nothing else would end this wait).
    bool host_func_next(uint64_t& id, bool& in_graph, const std::function<bool()>& client_gone = {});
    // Host functions captured into graphs: the driver calls them at every launch of the graph, so they live
    // as long as the session (server/handlers_hostfn.cpp).
    struct kept_host_func {
        virtual ~kept_host_func() = default;
    };
    void keep_host_func(std::unique_ptr<kept_host_func> f) {
        std::lock_guard lock(hf_mu_);
        hf_kept_.push_back(std::move(f));
    }
    void host_func_done(uint64_t id);
    void host_func_wait(uint64_t id);  // in the driver's callback: until done or stopped
    void stop_host_funcs();

    // CUDA user objects (server/handlers_hostfn.cpp), by the client's id: the driver's object and how many
    // references the application holds. The session holds one driver reference while the application holds
    // any; the driver's destructor forgets the entry and hands the id to the client's host-function thread,
    // which runs the application's destructor. A call naming an object the application holds no reference
    // of is refused, so that no driver call names an object that may be gone.
    struct user_object {
        CUuserObject obj = nullptr;  // null while being made
        uint64_t refs = 0;
    };
    std::mutex user_objects_mu;  // never held across a driver call that may run a destructor
    std::map<uint64_t, user_object> user_objects;
    void release_user_objects();  // at the session's end: the session's references

    // Progress of each lane (the last call number it has run, or started for a call that blocks), so that a
    // call depending on another lane's call (Call.after_lane/after_seq) waits for it.
    void lane_progress(uint32_t lane, uint64_t seq);
    void lane_gone(uint32_t lane);
    // Waits until `lane` has run call `seq`; false when the lane is gone, the session ends, or `client_gone`
    // (looked at every 100 ms: the waiting lane's own client closed) says so first.
    bool wait_for_lane(uint32_t lane, uint64_t seq, const std::function<bool()>& client_gone = {});

    session_counters counters;
    std::atomic<int> lanes{0};  // connections: lanes and bulk connections; the session ends at 0
    std::atomic<int> call_lanes{
        0};  // lanes only: at 0 the client is gone, and its bulk connections are closed
    // Striped copies: the rendezvous of the session's bulk connections and lanes (server/bulk.hpp).
    bulk_hub& bulk() { return *bulk_; }
    // Lanes register their connections so the session can be ended from outside (its lease was released or
    // expired): end() shuts them down and the lanes' threads then release everything as on a disconnect.
    void attach(frame_stream* fs);
    void detach(frame_stream* fs);
    void end(const std::string& why);

  private:
    struct device_slot {
        size_t gpu = 0;  // drv().gpus() index
        CUdevice device = 0;
        CUcontext ctx = nullptr;
        std::unique_ptr<device_memory> memory;
        bool allowed = true;
    };

    // Each allowed device's memory is made reachable from its peers among the session's other GPUs. Caller
    // holds `mu` (or the session is not shared yet).
    void set_peers();
    // Makes one of the session's contexts current and waits for its GPU work (host regions and VMM mappings
    // are released under any context). The caller holds `mu`.
    void synchronize_any_context();

    CUcontext context_locked(size_t device, CUresult& rc);  // context(), `mu` held

    // server/session_image.cpp. With gate_mu_ held (`lock`), the gate open and the session suspended: closes
    // the gate, waits for the calls that slipped in to back off, rebuilds, opens the gate again.
    CUresult rebuild_through_gate(std::unique_lock<std::mutex>& lock, std::string& why);
    // With gate_mu_ held (`lock`): closes the gate for a suspend or a move once no other holds it, and waits
    // up to `wait` for the calls running to end; CUDA_ERROR_NOT_READY (the gate open again) when they do not.
    CUresult close_gate(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds wait, std::string& why);
    // With the gate closed and no call running:
    // `memory`: how device memory is kept (device_memory::save_mode). With save_mode::none nothing is
    // released: the contents stay on the GPU for a pre-copied move to read, which releases them once the
    // target has them.
    CUresult save_and_release(std::string& why,
                              device_memory::save_mode memory = device_memory::save_mode::copy);
    CUresult rebuild(std::string& why);
    // Gives the GPU objects back to the driver (contexts, their streams, events, modules, the memory's
    // physical part); handles and reservations stay. `mu` held.
    void release_gpu_state();
    // The application's VMM use in a suspend (server/vmm_image.cpp), `mu` held: its physical allocations'
    // contents and its mappings' access saved; given back (reservations stay); made again, copied back and
    // mapped at the same addresses. `what` says what failed. With save_mode::descriptor (a move to a server
    // on the same GPU) an allocation the driver made exportable is handed over as a descriptor, not copied.
    CUresult save_vmm(session_image& img, std::string& why, device_memory::save_mode memory);
    void release_vmm_physical();
    CUresult rebuild_vmm(const session_image& img, std::string& what);
    // A move's target, `mu` held: the moved session's VMM bookkeeping, its reservations claimed in the
    // address window at the same addresses and its allocations charged to the quota; the image gets room for
    // the allocations' contents, which rebuild_vmm makes again at the resume.
    CUresult take_moved_vmm(const wire::SessionState& st, session_image& img, std::string& why);
    // A move's target: physical memory handed over for device `i` must be this server's GPU there, the one
    // the sender named (MovedDevice.gpu_uuid); else CUDA_ERROR_PEER_ACCESS_UNSUPPORTED with `why` (the
    // sender then copies it).
    CUresult check_handed_over_gpu(const wire::SessionState& st, size_t i, const char* what,
                                   std::string& why);
    // CUDA arrays and mipmapped arrays in a suspend (server/array_image.cpp), `mu` held: contents saved,
    // arrays destroyed (handles and quota charges stay), made again with their descriptors and filled; a
    // move's target takes their table entries and contents from the moved state.
    CUresult save_arrays(session_image& img, std::string& why);
    void release_arrays();
    CUresult rebuild_arrays(const session_image& img, std::string& what);
    CUresult take_moved_arrays(const wire::SessionState& st, session_image& img, std::string& why);
    // Texture and surface objects in a suspend or a move (server/array_image.cpp), `mu` held: why they cannot
    // be made again at the values kernels hold (empty: they can); made again at those values, after the
    // arrays and memory they read; a move's target takes their table from the moved state.
    std::string objects_blocker() const;
    // Waits up to `limit` for the GPU work the session's calls have queued so far (server/session_image.cpp),
    // `mu` held; NOT_READY with the reason when it is still running then. wait_for_drain: until a wait that
    // was given up on has ended (the session's end, before its contexts go).
    CUresult drain_within(std::chrono::milliseconds limit, std::string& why);
    void wait_for_drain();
    CUresult rebuild_objects(std::string& what);
    CUresult take_moved_objects(const wire::SessionState& st, std::string& why);
    // CUDA graphs and executable graphs in a suspend (server/graph_image.cpp), `mu` held: each graph read
    // through the driver (nodes, their parameters, edges), each executable graph's clone too; destroyed (ids
    // stay); made again node by node, each node id standing for its new node, executable graphs instantiated
    // again from their clones. What cannot be made again (host, memory, conditional nodes, a capture under
    // way) refuses the suspend with the reason.
    CUresult save_graphs(session_image& img, std::string& why);
    // A move's graphs (server/graph_image.cpp): the image's, and the ones a received state holds, checked.
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::MovedGraph>>> moved_graphs(
        flatbuffers::FlatBufferBuilder& b, const session_image& img);
    CUresult take_moved_graphs(const wire::SessionState& st, session_image& img, std::string& why);
    void release_graphs();
    CUresult rebuild_graphs(const session_image& img, std::string& what);

    uint64_t id_;
    std::string key_;
    driver* drv_;
    server_options opts_;
    std::string peer_;
    std::string lease_id_;
    std::string tenant_;
    std::vector<device_slot> devices_;
    std::unique_ptr<bulk_hub> bulk_;
    std::mutex lanes_mu_;
    std::vector<frame_stream*> streams_;
    bool ending_ = false;  // under lanes_mu_
    std::mutex progress_mu_;
    std::condition_variable progress_cv_;
    std::unordered_map<uint32_t, uint64_t> progress_;  // lane -> last call run; erased when the lane is gone
    std::unordered_set<uint32_t> gone_lanes_;
    std::mutex hf_mu_;
    std::condition_variable hf_cv_;
    std::deque<std::pair<uint64_t, bool>> hf_started_;      // (id, in a graph)
    std::vector<std::unique_ptr<kept_host_func>> hf_kept_;  // freed with the session, after its graphs
    std::unordered_set<uint64_t> hf_done_;
    bool hf_stopped_ = false;
    int progress_waiters_ = 0;

    // The gate (enter_call/leave_call): calls running, and whether a suspend or resume holds it closed.
    std::atomic<int> active_{0};
    std::atomic<bool> closed_{false};
    std::atomic<bool> carried_graphs_{false};  // keeps_graphs
    std::atomic<bool> suspended_{false};
    struct drain_state {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;  // under mu
        CUresult rc = CUDA_SUCCESS;
    };
    std::shared_ptr<drain_state> drain_;  // the last synchronize a suspend or a move started; under `mu`
    std::mutex held_output_mu_;
    std::string held_output_;  // under held_output_mu_
    std::atomic<bool> has_held_output_{false};
    // Kernels' output the driver's own thread wrote, when this is the process's only session; after the
    // members hold_output uses, so that it goes before them.
    device_output::claimant printf_claimant_{
        [this](std::string_view text) { hold_output(std::string(text)); }};
    std::atomic<uint64_t> epoch_{0};
    // A session that has had no call yet (or was just moved here) is idle since it was made.
    std::atomic<std::chrono::steady_clock::rep> last_call_{
        std::chrono::steady_clock::now().time_since_epoch().count()};
    std::mutex gate_mu_;
    std::condition_variable gate_cv_;
    std::unique_ptr<session_image> image_;  // while suspended
    std::atomic<bool> moved_{false};
    std::string moved_to_;  // under gate_mu_
    // The connection the state went over, kept open while this session lives here: the receiving server
    // keeps the session for the client until its lane 0 joins there, or until this closes (the client gone).
    std::unique_ptr<frame_stream> moved_link_;
    // move_to's steps. open_move_link: the connection to the target, HELLO sent. precopy_memory: with the
    // gate open, every mapping's pieces sent as pre-copied, their digests noted in `record`. send_state, with
    // the gate closed: the state and its pieces (those unchanged since `record`, if any, without their
    // bytes), then the receiver's answer.
    class piece_reader;
    std::unique_ptr<frame_stream> open_move_link(const move_target& to, std::string& why);
    CUresult precopy_memory(frame_stream& fs, const move_target& to, precopy_record& record,
                            std::string& why);
    CUresult send_state(std::unique_ptr<frame_stream> fs, const move_target& to, const precopy_record* record,
                        std::string& why);
    std::atomic<bool> moving_{false};  // a move_to is under way (another is refused)
    uint64_t unchanged_bytes_ = 0;     // the last send_state's pieces sent as unchanged (for its note)
    std::string note_;                 // under gate_mu_
    std::string rebuilt_note_;         // the last rebuild's outcome, written by rebuild()
    int64_t opened_at_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();  // Unix ms, as the manager's request times
};

// All live sessions of this server, for lanes that join one and for operators' queries.
class session_registry {
  public:
    std::shared_ptr<session> create(driver& drv, const server_options& opts, const session_grant& grant,
                                    const std::string& peer);
    // A session whose id and key were chosen elsewhere (--isolation process: by the parent server, which
    // hands the session's connections to this worker process; a session moved here from another server).
    // Null when a session with that id is already here.
    std::shared_ptr<session> adopt(uint64_t id, std::string key, driver& drv, const server_options& opts,
                                   const session_grant& grant, const std::string& peer);
    // Sessions, for heartbeats: (lease id, GPU memory held per server GPU).
    template <class F>
    void for_each(F&& f) {
        std::lock_guard lock(mu_);
        for (auto& [id, s] : sessions_) f(*s);
    }
    // The live sessions now, for work that may take long per session (suspends).
    std::vector<std::shared_ptr<session>> snapshot() {
        std::lock_guard lock(mu_);
        std::vector<std::shared_ptr<session>> out;
        out.reserve(sessions_.size());
        for (auto& [id, s] : sessions_) out.push_back(s);
        return out;
    }
    // The session `id` when `key` is its key (compared in constant time); null otherwise.
    std::shared_ptr<session> find(uint64_t id, std::string_view key);
    // Forgets session `id` if it is `which` (a session that moved away and came back has a new object by
    // then, which stays).
    void remove(uint64_t id, const session* which);
    // A session that moved away and is coming back (`key` its key): the old object, which only waits for its
    // client's last connections to go, leaves the registry so that the new one can take its id. False when
    // `id` is another session's, or one that has not moved away.
    bool forget_moved_away(uint64_t id, std::string_view key);
    size_t size();
    // The counters of every session this registry has held, live and ended, added into `sum`.
    void add_counters(session_counters& sum);

  private:
    std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<session>> sessions_;
    session_counters ended_;  // under mu_: those of sessions removed
};

}  // namespace vcuda::server
