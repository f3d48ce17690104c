// --isolation process: each session runs in a worker process of its own, so that a driver crash or a context
// that a device-side assert poisoned (CUDA_ERROR_ASSERT, which then fails every later context creation in
// that process) ends that tenant's session only.
//
// The parent (the server that listens) accepts connections, reads and checks HELLO, authenticates (tokens,
// leases, --allow-uid, --max-sessions) and never makes a context. For a new session it chooses the id and
// key, starts `/proc/self/exe --worker-fd 3 OPTIONS` (posix_spawn: fork and exec, so the worker's driver
// starts fresh whatever the parent's cuInit did) with one end of a SOCK_SEQPACKET socket pair as descriptor
// 3, and sends it the session (id, key, grant); then every connection of that session — its first lane, and
// every lane or bulk connection that joins with the right key — goes to the worker with SCM_RIGHTS together
// with the HELLO bytes already read. The worker serves them exactly as the server does in thread mode
// (server::serve_hello: shared-memory rings, HELLO_REPLY, lanes as threads) and exits when its session ends.
// The parent reaps it, logs how it ended, and forgets the session (its --max-sessions slot, its lease claim).
//
// Messages on the socket pair (one datagram each, host byte order; both ends are the same binary):
//   session:    u32 1, u64 id, u64 memory quota, u32 key length, key, u32 lease id length, lease id,
//               u32 GPU count, u64 GPU index..., u32 tenant length, tenant, u64 the server's IPC instance id,
//               u32 1 when another server moves the session here (its id and key come with its state)
// and from the worker, IPC requests (server/ipc.cpp: deposit, withdraw, fetch), which a thread of the parent
// serves per worker from its registry, for that worker's session and tenant.
//   connection: u32 2, u32 peer length, peer description, u32 HELLO length, HELLO frame bytes, u32 length
//               and the bytes the parent read after HELLO (a moving server does not wait for an answer); the
//               connection's descriptor rides along (SCM_RIGHTS).
// Moves (server/session_transfer.cpp) work as in thread mode, inside the worker: the parent passes the
// manager's request on (msg_move) and waits for the outcome; a session moved here gets a worker of its own,
// which tells the parent the session's id and key once its state has named them (msg_adopted), and goes on
// only when the parent has taken them (msg_adopt_answer: an id already served here is refused).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <thread>

#include "common/log.hpp"
#include "common/random.hpp"
#include "common/thread_name.hpp"
#include "common/wire.hpp"
#include "server/control_messages.hpp"
#include "server/ipc.hpp"
#include "server/server.hpp"

extern char** environ;

namespace vcuda::server {

namespace {

constexpr uint32_t msg_session = 1, msg_connection = 2;
// Suspend and resume, from the parent (the manager asked); the worker's status, to the parent.
constexpr uint32_t msg_suspend = 3, msg_resume = 4, msg_status = 5;
// A move, from the parent (str address, str token); its outcome, to the parent (u32 result, str note). A
// session moved here: its id, key and client, to the parent, once the moved state named them (u64 id, str
// key, str client).
constexpr uint32_t msg_move = 6, msg_move_result = 7, msg_adopted = 8;
// The parent's answer to msg_adopted (u32 1: the session is routed to this worker; 0: refused, its id is
// taken).
constexpr uint32_t msg_adopt_answer = 9;
// The address window's runs, which the parent keeps for all its workers (server/device_memory.hpp): a take
// (u64 base, size, alignment; answer u64 address, 0 for none), a give-back (u64 address, size) and a claim
// (u64 base, address, size; answer u32 1 when taken). After the IPC requests' 10-12 (server/ipc.cpp).
constexpr uint32_t msg_window_take = 13, msg_window_give_back = 14, msg_window_claim = 15;
// A move of the session's device from one GPU of this server to another (u64 from, u64 to: GPU indices), from
// the parent; its outcome comes back as msg_move_result.
constexpr uint32_t msg_relocate = 16;
// A session moved here that the worker named (msg_adopted) and then did not take (its state could not be
// rebuilt), to the parent, before the worker answers the sender; the parent frees its id and answers with
// msg_adopt_answer.
constexpr uint32_t msg_adopt_given_up = 17;

// A worker's window runs, asked of its parent.
address_window::shared_runs parent_window_runs(int control_fd) {
    auto ask = [control_fd](const message_writer& m) {
        std::vector<std::byte> reply;
        std::vector<int> fds;
        std::string why;
        if (!ask_parent(control_fd, m.bytes, -1, reply, fds, why)) {
            VCUDA_LOG_WARN("address window: {}", why);
            reply.clear();
        }
        for (int fd : fds) ::close(fd);
        return reply;
    };
    address_window::shared_runs r;
    r.take = [ask](uint64_t base, uint64_t size, uint64_t align) -> uint64_t {
        message_writer m;
        m.u32(msg_window_take);
        m.u64(base);
        m.u64(size);
        m.u64(align);
        auto reply = ask(m);
        message_reader a{reply};
        const uint64_t at = a.u64();
        return a.ok ? at : 0;
    };
    r.give_back = [control_fd](uint64_t at, uint64_t size) {
        message_writer m;
        m.u32(msg_window_give_back);
        m.u64(at);
        m.u64(size);
        send_message(control_fd, m.bytes, -1);
    };
    r.claim = [ask](uint64_t base, uint64_t at, uint64_t size) {
        message_writer m;
        m.u32(msg_window_claim);
        m.u64(base);
        m.u64(at);
        m.u64(size);
        auto reply = ask(m);
        message_reader a{reply};
        return a.u32() == 1 && a.ok;
    };
    return r;
}

std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited (status " + std::to_string(WEXITSTATUS(status)) + ")";
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char* name = sigabbrev_np(sig);
        return "was killed by signal " + std::to_string(sig) +
               (name ? std::string(" (SIG") + name + ")" : "");
    }
    return "ended (wait status " + std::to_string(status) + ")";
}

}  // namespace

struct server::worker {
    uint64_t id = 0;
    std::string key;
    session_grant grant;
    std::string peer;
    pid_t pid = -1;
    int control = -1;  // the parent's end of the socket pair
    int64_t opened_at_ms = 0;
    bool local_client = false;
    // A session another server moves here: `id` is a placeholder until the worker names the session.
    bool incoming = false;
    std::mutex send_mu;
    std::mutex status_mu;
    worker_status status;                        // under status_mu
    std::map<uint64_t, uint64_t> window_ranges;  // under the server's window_mu_: what it took, start -> size
    std::condition_variable move_cv;             // with status_mu
    std::optional<std::pair<CUresult, std::string>> moved;  // under status_mu: a move's outcome
    bool ended = false;                                     // under status_mu: the worker is gone
    std::string stopped_because;  // under the server's open_mu_: why this server sent it SIGTERM, if it did
    ~worker() {
        if (control >= 0) ::close(control);
    }
};

// ---------------------------------------------------------------- parent

void server::hand_over(frame_stream& fs, const frame& hello, const std::string& peer) {
    auto* h = root_of<wire::Hello>(hello);
    // A client waits for HELLO_REPLY before it sends anything else; a server moving a session here sends
    // its state right after HELLO: what was read of it goes to the worker with the connection.
    if (fs.raw().buffered() > 0 && !h->adopt()) {
        send_wire_error(fs, wire_errc::unexpected_kind, "frames sent before HELLO_REPLY");
        return;
    }
    std::shared_ptr<worker> w;
    if (h->session_id() == 0) {  // a new session, or one that another server moves here (`adopt`)
        session_grant grant;
        if (!authorize(*h, grant, fs, peer)) return;
        std::lock_guard lock(open_mu_);
        if (!admit(grant, workers_.size(), fs, peer)) return;
        w = std::make_shared<worker>();
        do w->id = os_random_u64() & 0x7fffffffffffffffULL;
        while (w->id == 0 || workers_.count(w->id));
        w->key = os_random_bytes(session_key_bytes);
        w->grant = grant;
        w->peer =
            h->adopt() ? "a session moved from " + peer : peer + " pid " + std::to_string(h->client_pid());
        w->local_client = fs.raw().is_local();
        w->incoming = h->adopt();
        w->opened_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();

        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
            std::string why = std::strerror(errno);
            drop_lease_claim(grant.lease_id, grant.gpus, 0);
            VCUDA_LOG_ERROR("{}: session refused: no socket pair for its worker process ({})", peer, why);
            send_wire_error(fs, wire_errc::not_allowed,
                            "the server could not start a worker process: " + why);
            return;
        }
        w->control = sv[0];
        int child_end = sv[1];
        if (child_end <= 3) {  // dup2 onto itself would keep close-on-exec
            int moved = ::fcntl(child_end, F_DUPFD_CLOEXEC, 10);
            ::close(child_end);
            child_end = moved;
        }
        std::vector<std::string> args = {"vcuda-server", "--worker-fd", "3"};
        args.insert(args.end(), opts_.worker_args.begin(), opts_.worker_args.end());
        // The window now: the manager may have given another than the one chosen at start.
        args.insert(args.end(),
                    {"--address-window", opts_.window ? std::to_string(opts_.window->index()) : "none"});
        std::vector<char*> argv;
        argv.reserve(args.size() + 1);
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, child_end, 3);
        posix_spawn_file_actions_addclosefrom_np(&fa, 4);  // the parent's sockets stay the parent's
        pid_t pid = -1;
        int rc =
            child_end < 0 ? errno : ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (child_end >= 0) ::close(child_end);
        if (rc != 0) {
            drop_lease_claim(grant.lease_id, grant.gpus, 0);
            VCUDA_LOG_ERROR("{}: session refused: cannot start a worker process ({})", peer,
                            std::strerror(rc));
            send_wire_error(fs, wire_errc::not_allowed,
                            std::string("the server could not start a worker process: ") + std::strerror(rc));
            return;
        }
        w->pid = pid;
        workers_[w->id] = w;
        if (!grant.lease_id.empty()) lease_sessions_[{grant.lease_id, grant.gpus.front()}] = w->id;
        message_writer m;
        m.u32(msg_session);
        m.u64(w->id);
        m.u64(grant.memory_quota);
        m.str(w->key);
        m.str(grant.lease_id);
        m.u32(static_cast<uint32_t>(grant.gpus.size()));
        for (size_t g : grant.gpus) m.u64(g);
        m.str(grant.tenant);
        m.u64(opts_.ipc ? opts_.ipc->instance() : 0);
        m.u32(w->incoming ? 1 : 0);
        send_message(w->control, m.bytes, -1);  // a worker that is gone already is reaped below
        std::thread([this, w] {
            name_this_thread("vc-reap");
            reap(w);
        }).detach();
        std::thread([this, w] {
            name_this_thread("vc-worker-ipc");
            serve_worker(w);
        }).detach();
        if (w->incoming)
            VCUDA_LOG_INFO("{}: a moved session comes to worker pid {}", peer, pid);
        else
            VCUDA_LOG_INFO("session {} opened by {} (host {}): worker pid {}", w->id, w->peer,
                           h->client_host() ? h->client_host()->str() : "?", pid);
    } else {
        const auto* key = h->session_key();
        std::string_view given =
            key ? std::string_view(reinterpret_cast<const char*>(key->data()), key->size())
                : std::string_view();
        {
            std::lock_guard lock(open_mu_);
            auto it = workers_.find(h->session_id());
            if (it != workers_.end() && equal_constant_time(it->second->key, given)) w = it->second;
        }
        if (!w) {
            VCUDA_LOG_WARN("{}: refused a join of session {}: unknown session or wrong key", peer,
                           h->session_id());
            send_wire_error(fs, wire_errc::auth_failed, "unknown session or wrong session secret");
            return;
        }
    }
    message_writer m;
    m.u32(msg_connection);
    m.str(peer);
    auto bytes = frame_bytes(hello);
    m.u32(static_cast<uint32_t>(bytes.size()));
    m.raw(bytes.data(), bytes.size());
    auto ahead = fs.raw().take_buffered();
    m.u32(static_cast<uint32_t>(ahead.size()));
    m.raw(ahead.data(), ahead.size());
    bool sent;
    {
        std::lock_guard lock(w->send_mu);
        sent = send_message(w->control, m.bytes, fs.raw().native_handle());
    }
    if (!sent) {  // the worker has ended (its session too): as for a join of a session that has ended
        VCUDA_LOG_WARN("{}: session {} has ended; its connection was closed", peer, w->id);
        send_wire_error(fs, wire_errc::auth_failed, "unknown session or wrong session secret");
    }
    // The parent's copy of the connection closes with `fs`; the worker serves its own.
}

void server::reap(const std::shared_ptr<worker>& w) {
    int status = 0;
    pid_t r;
    do r = ::waitpid(w->pid, &status, 0);
    while (r < 0 && errno == EINTR);
    std::string stopped_because;
    {
        std::lock_guard lock(open_mu_);
        if (auto it = workers_.find(w->id); it != workers_.end() && it->second == w) workers_.erase(it);
        drop_lease_claim(w->grant.lease_id, w->grant.gpus, w->incoming ? 0 : w->id);
        stopped_because = w->stopped_because;
    }
    {
        std::lock_guard lock(w->status_mu);
        w->ended = true;
    }
    w->move_cv.notify_all();
    std::string how =
        r < 0 ? std::string("could not be waited for: ") + std::strerror(errno) : describe_status(status);
    if (r >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        VCUDA_LOG_INFO("session {}: worker pid {} {}", w->id, w->pid, how);
    else if (r >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM && !stopped_because.empty())
        VCUDA_LOG_INFO("session {}: worker pid {} {}, as this server asked ({})", w->id, w->pid, how,
                       stopped_because);
    else
        VCUDA_LOG_WARN(
            "session {}: worker pid {} {}: that session ({}) has ended and its connections are closed; other "
            "sessions are not affected",
            w->id, w->pid, how, w->peer);
}

void server::serve_worker(const std::shared_ptr<worker>& w) {
    std::vector<std::byte> m;
    std::vector<int> fds;
    while (receive_message(w->control, m, fds) == 1) {
        if (message_reader r{m}; r.u32() == msg_status) {
            worker_status st;
            st.suspended = r.u32() != 0;
            st.idle_ms = static_cast<int64_t>(r.u64());
            st.memory_used = r.u64();
            st.note = r.str();
            st.moved_to = r.str();
            st.known = r.ok;
            for (int fd : fds) ::close(fd);
            if (st.known) {
                std::lock_guard lock(w->status_mu);
                // A moved session stays moved: a status sent just before the move's outcome does not undo it.
                if (st.moved_to.empty()) st.moved_to = w->status.moved_to;
                w->status = std::move(st);
            }
            continue;
        }
        if (message_reader r{m}; r.u32() == msg_move_result) {
            auto rc = static_cast<CUresult>(r.u32());
            std::string note = r.str();
            for (int fd : fds) ::close(fd);
            if (r.ok) {
                std::lock_guard lock(w->status_mu);
                w->moved.emplace(rc, std::move(note));
            }
            w->move_cv.notify_all();
            continue;
        }
        if (message_reader r{m}; serve_window_request(*w, r.u32(), r, fds)) continue;
        if (message_reader r{m}; r.u32() == msg_adopt_given_up) {
            for (int fd : fds) ::close(fd);
            give_up_moved_worker(w);
            continue;
        }
        if (message_reader r{m}; r.u32() == msg_adopted) {
            const uint64_t id = r.u64();
            std::string key = r.str();
            std::string peer = r.str();
            for (int fd : fds) ::close(fd);
            adopt_moved_worker(w, id, std::move(key), std::move(peer), r.ok);
            continue;
        }
        if (!opts_.ipc_exports || !serve_ipc_request(*opts_.ipc_exports, w->id, w->grant.tenant, m, fds)) {
            VCUDA_LOG_WARN("session {}: an unknown message from its worker pid {} was ignored", w->id,
                           w->pid);
            for (int fd : fds) ::close(fd);
        }
    }
    // The worker has ended (or closed its end): what its session exported goes with it, and its addresses
    // go back to the window, unless its session moved away (kept then, for it alone, should it come back).
    if (opts_.ipc_exports) opts_.ipc_exports->drop_owner(w->id);
    bool moved;
    {
        std::lock_guard lock(w->status_mu);
        moved = !w->status.moved_to.empty();
    }
    std::lock_guard lock(window_mu_);
    for (auto [at, size] : w->window_ranges)
        if (moved)
            worker_window_.keep(at, size);
        else
            worker_window_.give_back(at, size);
    w->window_ranges.clear();
}

bool server::serve_window_request(worker& w, uint32_t type, message_reader& r, std::vector<int>& fds) {
    if (type != msg_window_take && type != msg_window_give_back && type != msg_window_claim) return false;
    unique_fd answer(type != msg_window_give_back && !fds.empty() ? fds[0] : -1);
    for (size_t i = answer.get() >= 0 ? 1 : 0; i < fds.size(); ++i) ::close(fds[i]);
    fds.clear();
    std::lock_guard lock(window_mu_);
    // The common range is where every process's driver put it: the first worker's base is the others' too.
    auto started = [&](uint64_t base) {
        if (!opts_.window || base == 0) return false;
        if (worker_window_base_ == 0) {
            opts_.window->note_used();
            worker_window_.start(base, opts_.window->index());
            worker_window_base_ = base;
        }
        return worker_window_base_ == base;
    };
    message_writer reply;
    if (type == msg_window_take) {
        const uint64_t base = r.u64(), size = r.u64(), align = r.u64();
        const bool fits = r.ok && size > 0 && align > 0 && (align & (align - 1)) == 0;
        const uint64_t at = fits && started(base) ? worker_window_.take(size, align) : 0;
        if (at) w.window_ranges[at] = size;
        reply.u64(at);
    } else if (type == msg_window_claim) {
        const uint64_t base = r.u64(), at = r.u64(), size = r.u64();
        const bool taken = r.ok && size > 0 && started(base) && worker_window_.claim(at, size);
        if (taken) w.window_ranges[at] = size;
        reply.u32(taken ? 1 : 0);
    } else {
        const uint64_t at = r.u64(), size = r.u64();
        if (auto it = w.window_ranges.find(at); r.ok && it != w.window_ranges.end() && it->second == size) {
            worker_window_.give_back(at, size);
            w.window_ranges.erase(it);
        }
    }
    if (answer.get() >= 0) send_message(answer.get(), reply.bytes);
    return true;
}

std::vector<server::worker_session> server::worker_sessions() {
    std::lock_guard lock(open_mu_);
    std::vector<worker_session> out;
    for (auto& [id, w] : workers_) {
        std::lock_guard status(w->status_mu);
        if (w->incoming) continue;  // not a session here yet
        out.push_back({id, w->pid, w->grant, w->peer, w->opened_at_ms, w->local_client, w->status});
    }
    return out;
}

bool server::ask_worker(uint64_t id, bool suspend) {
    std::shared_ptr<worker> w;
    {
        std::lock_guard lock(open_mu_);
        auto it = workers_.find(id);
        if (it == workers_.end()) return false;
        w = it->second;
    }
    message_writer m;
    m.u32(suspend ? msg_suspend : msg_resume);
    std::lock_guard lock(w->send_mu);
    return send_message(w->control, m.bytes, -1);
}

void server::adopt_moved_worker(const std::shared_ptr<worker>& w, uint64_t id, std::string key,
                                std::string peer, bool ok) {
    std::unique_lock lock(open_mu_);
    auto answer = [&](bool taken) {
        message_writer m;
        m.u32(msg_adopt_answer);
        m.u32(taken ? 1 : 0);
        std::lock_guard send(w->send_mu);
        send_message(w->control, m.bytes, -1);
    };
    if (!w->incoming || id == 0 || key.size() != session_key_bytes || !ok || workers_.count(id)) {
        VCUDA_LOG_WARN("{}: the moved session {} is refused: {}", w->peer, id,
                       workers_.count(id) ? "a session with that id is here already" : "malformed");
        lock.unlock();
        answer(false);  // its worker refuses the session and ends
        return;
    }
    workers_.erase(w->id);
    // The lease claim the parent took for it (admit) is the session's now.
    if (!w->grant.lease_id.empty()) lease_sessions_[{w->grant.lease_id, w->grant.gpus.front()}] = id;
    w->id = id;
    w->key = std::move(key);
    w->peer = std::move(peer);
    w->incoming = false;
    workers_[id] = w;
    VCUDA_LOG_INFO("session {} ({}): served by worker pid {}", id, w->peer, w->pid);
    lock.unlock();
    answer(true);
}

void server::give_up_moved_worker(const std::shared_ptr<worker>& w) {
    {
        std::lock_guard lock(open_mu_);
        if (auto it = workers_.find(w->id); !w->incoming && it != workers_.end() && it->second == w) {
            VCUDA_LOG_INFO("session {} was not taken by worker pid {}: its id is free again", w->id, w->pid);
            workers_.erase(it);
            drop_lease_claim(w->grant.lease_id, w->grant.gpus, w->id);
            do w->id = os_random_u64() & 0x7fffffffffffffffULL;
            while (w->id == 0 || workers_.count(w->id));
            w->incoming = true;
            workers_[w->id] = w;
        }
    }
    message_writer m;
    m.u32(msg_adopt_answer);
    m.u32(1);
    std::lock_guard send(w->send_mu);
    send_message(w->control, m.bytes, -1);
}

CUresult server::ask_worker_outcome(uint64_t id, const std::vector<std::byte>& request,
                                    std::chrono::seconds wait, std::string& note,
                                    std::shared_ptr<worker>& w) {
    {
        std::lock_guard lock(open_mu_);
        if (auto it = workers_.find(id); it != workers_.end()) w = it->second;
    }
    if (!w) {
        note = "the session has ended";
        return CUDA_ERROR_NOT_FOUND;
    }
    {
        std::lock_guard lock(w->status_mu);
        w->moved.reset();
    }
    {
        std::lock_guard lock(w->send_mu);
        if (!send_message(w->control, request, -1)) {
            note = "its worker process is gone";
            return CUDA_ERROR_NOT_FOUND;
        }
    }
    std::unique_lock lock(w->status_mu);
    if (!w->move_cv.wait_for(lock, wait, [&] { return w->moved.has_value() || w->ended; })) {
        note = "its worker process did not say how it went within " + std::to_string(wait.count()) + " s";
        return CUDA_ERROR_NOT_READY;
    }
    if (!w->moved) {
        note = "its worker process ended meanwhile";
        return CUDA_ERROR_NOT_FOUND;
    }
    note = w->moved->second;
    return w->moved->first;
}

CUresult server::move_worker_session(uint64_t id, const session::move_target& to, std::chrono::seconds wait,
                                     std::string& note) {
    message_writer m;
    m.u32(msg_move);
    m.str(to.address);
    m.str(to.token);
    std::shared_ptr<worker> w;
    CUresult rc = ask_worker_outcome(id, m.bytes, wait, note, w);
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(w->status_mu);
        w->status.moved_to = to.address;
    }
    return rc;
}

CUresult server::relocate_worker_session(uint64_t id, size_t from, size_t to, std::chrono::seconds wait,
                                         std::string& note) {
    message_writer m;
    m.u32(msg_relocate);
    m.u64(from);
    m.u64(to);
    std::shared_ptr<worker> w;
    CUresult rc = ask_worker_outcome(id, m.bytes, wait, note, w);
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(open_mu_);
        std::replace(w->grant.gpus.begin(), w->grant.gpus.end(), from, to);
        move_lease_claim(w->grant.lease_id, from, to, id);
    }
    return rc;
}

void server::end_worker_session(uint64_t id, const std::string& why) {
    std::lock_guard lock(open_mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    VCUDA_LOG_WARN("session {} ended: {}; its worker pid {} is stopped", id, why, it->second->pid);
    it->second->stopped_because = why;
    ::kill(it->second->pid, SIGTERM);
}

// ---------------------------------------------------------------- worker

std::shared_ptr<session> server::adopt_session(const wire::Hello& h, const std::string& peer) {
    std::shared_ptr<session> sess;
    {
        std::lock_guard lock(open_mu_);
        if (adopt_id_key_)
            sess = sessions_.adopt(adopt_id_key_->first, std::move(adopt_id_key_->second), drv_, opts_,
                                   adopt_grant_, peer + " pid " + std::to_string(h.client_pid()));
        adopt_id_key_.reset();
    }
    if (!sess) return nullptr;
    sess->handles.set_tag(h.handle_tag());
    VCUDA_LOG_INFO("session {} opened by {} (host {}) in worker pid {}", sess->id(), sess->peer(),
                   h.client_host() ? h.client_host()->str() : "?", ::getpid());
    return sess;
}

int server::refuse_worker(int control_fd, const std::string& why) {
    // The session's first connection is told why before the worker ends (else it would only see it close).
    std::vector<std::byte> m;
    for (int i = 0, fd = -1; i < 2 && receive_message(control_fd, m, fd) == 1; ++i) {
        if (fd < 0) continue;
        frame_stream fs{stream(fd)};
        send_wire_error(fs, wire_errc::not_allowed,
                        "the server's worker process for this session failed: " + why);
        break;
    }
    return 1;
}

int server::run_worker(driver& drv, server_options opts, int control_fd) {
    ::signal(SIGPIPE, SIG_IGN);
    std::vector<std::byte> m;
    int fd = -1;
    if (receive_message(control_fd, m, fd) != 1) {
        VCUDA_LOG_ERROR("worker pid {}: no session from the server on descriptor {}", ::getpid(), control_fd);
        return 1;
    }
    if (fd >= 0) ::close(fd);
    message_reader r{m};
    uint64_t id = 0, instance = 0;
    std::string key;
    session_grant grant;
    bool incoming = false;  // another server moves the session here
    if (r.u32() == msg_session) {
        id = r.u64();
        grant.memory_quota = r.u64();
        key = r.str();
        grant.lease_id = r.str();
        uint32_t n = r.u32();
        for (uint32_t i = 0; i < n && r.ok && i < 1024; ++i)
            grant.gpus.push_back(static_cast<size_t>(r.u64()));
        grant.tenant = r.str();
        instance = r.u64();
        incoming = r.u32() != 0;
    } else {
        r.ok = false;
    }
    if (!r.ok || id == 0) {
        VCUDA_LOG_ERROR("worker pid {}: the server's first message is not a session", ::getpid());
        return 1;
    }
    opts.isolate = true;  // HELLOs without a session id are the adopted session's
    // IPC handles go through the parent, which holds every session's exports.
    opts.ipc = make_worker_broker(instance, control_fd);
    opts.ipc_exports.reset();
    // Addresses come from the window the parent keeps for all its workers.
    if (opts.window) opts.window->share_runs(parent_window_runs(control_fd));
    server srv(drv, opts);
    if (!incoming) srv.adopt_id_key_.emplace(id, std::move(key));
    srv.adopt_grant_ = grant;
    // A moved-in session goes on only once the parent routes its connections here (the main loop below
    // takes the answer).
    struct adopt_answer_box {
        std::mutex mu;
        std::condition_variable cv;
        std::optional<bool> taken;
    } adopt_answer;
    srv.on_session_adopted_ = [control_fd, &adopt_answer](uint64_t sid, const std::string& skey,
                                                          const std::string& peer) {
        message_writer a;
        a.u32(msg_adopted);
        a.u64(sid);
        a.str(skey);
        a.str(peer);
        if (!send_message(control_fd, a.bytes, -1)) return false;
        std::unique_lock lock(adopt_answer.mu);
        adopt_answer.cv.wait_for(lock, std::chrono::seconds(10),
                                 [&] { return adopt_answer.taken.has_value(); });
        return adopt_answer.taken.value_or(false);
    };
    srv.on_adopted_refused_ = [control_fd, &adopt_answer] {
        message_writer a;
        a.u32(msg_adopt_given_up);
        std::unique_lock lock(adopt_answer.mu);
        adopt_answer.taken.reset();
        if (!send_message(control_fd, a.bytes, -1)) return;
        adopt_answer.cv.wait_for(lock, std::chrono::seconds(10),
                                 [&] { return adopt_answer.taken.has_value(); });
    };
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    std::atomic<bool> ended{false};
    srv.on_session_end_ = [&] {
        ended = true;
        char b = 1;
        [[maybe_unused]] auto k = ::write(wake[1], &b, 1);
    };
    // What the parent reports of the session to the manager: its status, every half second and after each
    // suspend or resume the parent asked for.
    auto send_status = [&srv, control_fd] {
        auto all = srv.sessions().snapshot();
        if (all.empty()) return;
        session& s = *all.front();
        message_writer st;
        st.u32(msg_status);
        st.u32(s.suspended() ? 1 : 0);
        st.u64(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - s.last_call())
                                         .count()));
        uint64_t used = 0;
        {
            std::lock_guard lock(s.mu);
            for (size_t i = 0; i < s.device_count(); ++i)
                if (s.allowed(i)) used += s.memory(i).resident();
        }
        st.u64(used);
        st.str(s.note());
        st.str(s.moved() ? s.moved_to() : std::string());
        send_message(control_fd, st.bytes, -1);
    };
    // The outcome of a move or a relocation the parent asked for.
    auto answer = [control_fd](CUresult rc, const std::string& note) {
        message_writer a;
        a.u32(msg_move_result);
        a.u32(static_cast<uint32_t>(rc));
        a.str(note);
        send_message(control_fd, a.bytes, -1);
    };
    // A move or a relocation of the worker's session, `op(session, why)`, on a thread of its own (the
    // client's calls go on until it pauses them), answered with its outcome.
    auto mobility_thread = [&srv, answer, send_status](const char* what, auto op) {
        try {
            std::thread([&srv, answer, send_status, op] {
                name_this_thread("vc-mobility");
                auto all = srv.sessions().snapshot();
                std::string why = "the session has not opened here yet";
                CUresult rc = CUDA_ERROR_NOT_FOUND;
                if (!all.empty()) rc = op(all.front(), why);
                answer(rc, rc == CUDA_SUCCESS ? all.front()->note() : why);
                send_status();
            }).detach();
        } catch (const std::system_error& e) {
            answer(CUDA_ERROR_OPERATING_SYSTEM, std::string("no thread for the ") + what + ": " + e.what());
        }
    };
    auto suspend_or_resume = [&srv, send_status](bool suspend) {
        for (auto& sp : srv.sessions().snapshot()) {
            std::string why;
            if ((suspend ? sp->suspend(std::chrono::seconds(5), why) : sp->resume(why)) != CUDA_SUCCESS)
                VCUDA_LOG_WARN("session {}: the manager asked for a {}; not done: {}", sp->id(),
                               suspend ? "suspend" : "resume", why);
        }
        send_status();
    };
    bool parent_gone = false;
    auto gone_at = std::chrono::steady_clock::now();
    auto status_at = gone_at, suspend_at = gone_at;
    while (!ended) {
        pollfd p[2] = {{parent_gone ? -1 : control_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
        int k = ::poll(p, 2, 100);
        if (ended) break;
        const auto now = std::chrono::steady_clock::now();
        if (!parent_gone && now - status_at >= std::chrono::milliseconds(500)) {
            status_at = now;
            send_status();
        }
        if (opts.test_suspend_every.count() > 0 && now - suspend_at >= opts.test_suspend_every) {
            suspend_at = now;
            for (auto& sp : srv.sessions().snapshot())
                if (std::string why; sp->suspend(std::chrono::milliseconds(0), why) != CUDA_SUCCESS)
                    VCUDA_LOG_DEBUG("session {} not suspended: {}", sp->id(), why);
        }
        if (parent_gone) {
            // The server process ended: as in thread mode, its sessions end with it. Connections still open
            // were shut down; a session that never got one ends here.
            if (srv.sessions().size() == 0 ||
                std::chrono::steady_clock::now() - gone_at > std::chrono::seconds(30))
                break;
            continue;
        }
        if (k <= 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int got = receive_message(control_fd, m, fd);
        if (got != 1) {
            parent_gone = true;
            gone_at = std::chrono::steady_clock::now();
            srv.sessions().for_each(
                [](session& s) { s.end("the vcuda-server process it belonged to ended"); });
            continue;
        }
        message_reader c{m};
        const uint32_t type = c.u32();
        if (type == msg_adopt_answer) {
            if (fd >= 0) ::close(fd);
            const bool taken = c.u32() == 1 && c.ok;
            {
                std::lock_guard lock(adopt_answer.mu);
                adopt_answer.taken = taken;
            }
            adopt_answer.cv.notify_all();
            continue;
        }
        if (type == msg_move) {  // on a thread too: the client's calls go on until the move pauses them
            if (fd >= 0) ::close(fd);
            std::string address = c.str(), token = c.str();
            auto ep = endpoint::parse(address);
            if (!c.ok || !ep) {
                answer(CUDA_ERROR_INVALID_VALUE, "a malformed move request");
                continue;
            }
            mobility_thread("move", [to = session::move_target{*ep, address, token}](
                                        const std::shared_ptr<session>& sp, std::string& why) {
                return sp->move_to(to, std::chrono::seconds(5), why);
            });
            continue;
        }
        if (type == msg_relocate) {  // on a thread, as a move
            if (fd >= 0) ::close(fd);
            const uint64_t from = c.u64(), to = c.u64();
            if (!c.ok) {
                answer(CUDA_ERROR_INVALID_VALUE, "a malformed relocation request");
                continue;
            }
            mobility_thread(
                "relocation", [&srv, from, to](const std::shared_ptr<session>& sp, std::string& why) {
                    return srv.relocate(sp, sp->device_on(from).value_or(sp->device_count()), to, why);
                });
            continue;
        }
        if (type == msg_suspend || type == msg_resume) {  // on a thread: connections go on being taken
            if (fd >= 0) ::close(fd);
            try {
                std::thread([suspend_or_resume, suspend = type == msg_suspend] {
                    name_this_thread("vc-mobility");
                    suspend_or_resume(suspend);
                }).detach();
            } catch (const std::system_error& e) {
                VCUDA_LOG_WARN("session {}: no thread for the manager's request ({})", id, e.what());
            }
            continue;
        }
        std::string peer;
        uint32_t len = 0;
        bool ok = type == msg_connection;
        std::span<const std::byte> hello_bytes, ahead;
        if (ok) {
            peer = c.str();
            len = c.u32();
            ok = c.ok && c.bytes.size() >= len && fd >= 0;
        }
        if (ok) {
            hello_bytes = c.bytes.first(len);
            c.bytes = c.bytes.subspan(len);
            const uint32_t n = c.u32();
            ok = c.ok && c.bytes.size() == n;
            ahead = c.bytes;
        }
        frame_limits hello_limits;
        hello_limits.max_meta = max_hello_bytes;
        hello_limits.max_payload = 0;
        auto hello =
            ok ? frame_from_bytes(hello_bytes, hello_limits)
               : transport_result<frame>(unexpected{transport_error{transport_errc::protocol, "malformed"}});
        if (!hello) {
            VCUDA_LOG_ERROR("session {}: a malformed connection message from the server ({})", id,
                            hello.error().message);
            if (fd >= 0) ::close(fd);
            continue;
        }
        stream s(fd);
        s.set_peer_description(peer);
        if (!s.put_back(ahead)) {
            VCUDA_LOG_ERROR(
                "session {}: a connection came with {} bytes read ahead, more than a stream holds", id,
                ahead.size());
            continue;
        }
        try {
            std::thread([&srv, st = std::move(s), hf = std::move(*hello), peer, &grant]() mutable {
                name_this_thread("vc-conn");
                frame_stream fs(std::move(st));
                const auto* h = root_of<wire::Hello>(hf);
                if (!h->adopt()) {
                    srv.serve_hello(fs, hf, peer);
                    return;
                }
                srv.receive_moved(fs, *h, peer, &grant);
                // A moved session that was not taken leaves nothing to serve: the worker ends.
                if (srv.sessions().size() == 0 && srv.on_session_end_) srv.on_session_end_();
            }).detach();
        } catch (const std::system_error& e) {
            VCUDA_LOG_WARN("session {}: cannot start a thread for a connection ({}); it was closed", id,
                           e.what());
        }
    }
    // The session has released everything (session::release_all ran before on_session_end_); lane threads
    // may still be closing their sockets: the process ends without running destructors under them.
    vcuda::log::get()->flush();
    std::fflush(nullptr);
    ::_exit(0);
}

}  // namespace vcuda::server
