#include "server/server.hpp"

#include <algorithm>
#include <array>
#include <chrono>

#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "common/wire.hpp"
#include "mgmt/token.hpp"
#include "server/call_context.hpp"
#include "server/device_output.hpp"
#include "server/dispatch.hpp"
#include "server/placement.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

namespace vcuda::server {

const dispatch_entry* find_op(uint32_t id) {
    static const auto index = [] {
        std::array<const dispatch_entry*, op_id_limit> t{};
        for (size_t i = 0; i < dispatch_table_size; ++i)
            t[static_cast<uint32_t>(dispatch_table[i].id)] = &dispatch_table[i];
        return t;
    }();
    return id < index.size() ? index[id] : nullptr;
}

server::~server() { stop(); }

void server::serve(listener l) {
    listeners_.push_back(std::make_unique<listener>(std::move(l)));
    listener* lp = listeners_.back().get();
    acceptors_.emplace_back([this, lp] { accept_loop(lp); });
}

void server::stop() {
    if (stopping_.exchange(true)) return;
    for (auto& l : listeners_) l->close();
    for (auto& t : acceptors_)
        if (t.joinable()) t.join();
}

namespace {

// At most one log line per `every` for a condition that can repeat thousands of times a second (descriptor
// exhaustion, a flood of connections): the line says how many were not logged.
class log_limiter {
  public:
    explicit log_limiter(std::chrono::seconds every) : every_(every) {}
    // True when a line may be written now; `held_back` is then the number of calls since the last line.
    bool allow(uint64_t& held_back) {
        std::lock_guard lock(mu_);
        auto now = std::chrono::steady_clock::now();
        if (now < next_) {
            ++held_back_;
            return false;
        }
        next_ = now + every_;
        held_back = held_back_;
        held_back_ = 0;
        return true;
    }

  private:
    std::mutex mu_;
    std::chrono::seconds every_;
    std::chrono::steady_clock::time_point next_{};
    uint64_t held_back_ = 0;
};

// Connections past --max-connections are told why on a thread of their own, up to this many at once; past
// that they are closed at once (a flood must not turn into threads).
constexpr uint32_t refusal_threads = 16;

}  // namespace

void server::accept_loop(listener* l) {
    log_limiter accept_log(std::chrono::seconds(10)), limit_log(std::chrono::seconds(10));
    std::chrono::milliseconds backoff{0};
    while (!stopping_) {
        auto s = l->accept();
        if (!s) {
            if (s.error().code == transport_errc::closed) return;
            // Out of descriptors (EMFILE/ENFILE) or memory: the connection stays in the backlog and poll()
            // says readable again at once. Waiting (10 ms, doubling to 1 s) keeps this loop from spinning.
            backoff = std::clamp(backoff * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
            if (uint64_t held; accept_log.allow(held))
                VCUDA_LOG_WARN(
                    "accept on {}: {}{}; retrying in {} ms (raise the descriptor limit, `ulimit -n`, or "
                    "lower "
                    "--max-connections)",
                    l->local().to_string(), s.error().message,
                    held ? fmt::format(" ({} more failures since the last report)", held) : "",
                    backoff.count());
            std::this_thread::sleep_for(backoff);
            continue;
        }
        backoff = std::chrono::milliseconds(0);
        const uint32_t n = ++connections_;
        const bool over = n > opts_.max_connections;
        if (over && n > opts_.max_connections + refusal_threads) {
            --connections_;
            if (uint64_t held; limit_log.allow(held))
                VCUDA_LOG_WARN("{}: closed at once: {} connections are open (--max-connections {}){}",
                               s->peer_description(), n - 1, opts_.max_connections,
                               held ? fmt::format("; {} more since the last report", held) : "");
            continue;  // the stream's destructor closes it
        }
        try {
            std::thread([this, over, st = std::move(*s), tls = l->tls()]() mutable {
                name_this_thread("vc-conn");
                run_connection(std::move(st), over, tls.get());
                --connections_;
            }).detach();
        } catch (const std::system_error& e) {  // no thread to be had: the connection is closed
            --connections_;
            if (uint64_t held; limit_log.allow(held))
                VCUDA_LOG_WARN("cannot start a thread for a connection ({}); it was closed", e.what());
        }
    }
}

void server::run_connection(stream s, bool over_limit, const tls_context* tls) {
    std::string peer = s.peer_description();
    // Nothing is allocated on an unauthenticated peer's word past a small bound: HELLO (metadata only, no
    // payload) fits in 64 KiB, and a header announcing more is refused before anything is read or allocated.
    frame_limits hello_limits;
    hello_limits.max_meta = max_hello_bytes;
    hello_limits.max_payload = 0;
    frame_stream fs(std::move(s), hello_limits);
    if (tls) {
        if (auto t = accept_tls(fs, *tls, after(std::chrono::seconds(over_limit ? 2 : 10))); !t) {
            VCUDA_LOG_WARN("{}: connection refused: {}", peer, t.error().message);
            return;
        }
        if (auto who = fs.raw().tls_peer_subject(); !who.empty())
            VCUDA_LOG_DEBUG("{}: TLS client certificate {}", peer, who);
    }
    auto hello = fs.receive(after(std::chrono::seconds(over_limit ? 2 : 10)), std::chrono::seconds(10));
    if (!hello) {
        VCUDA_LOG_DEBUG("{}: no valid HELLO ({})", peer, hello.error().message);
        if (hello.error().code == transport_errc::protocol)
            send_wire_error(fs, wire_errc::verify_failed,
                            "not a valid HELLO of at most " + std::to_string(max_hello_bytes >> 10) +
                                " KiB: " + hello.error().message);
        return;
    }
    fs.set_limits(frame_limits{});
    if (over_limit) {
        VCUDA_LOG_WARN("{}: connection refused: {} connections are open (--max-connections {})", peer,
                       connections_.load() - 1, opts_.max_connections);
        send_wire_error(
            fs, wire_errc::not_allowed,
            "this vcuda-server is at its limit of " + std::to_string(opts_.max_connections) +
                " connections (--max-connections): retry later, or ask its operator to raise the limit");
        return;
    }
    if (hello->kind() != frame_kind::hello) {
        send_wire_error(fs, wire_errc::unexpected_kind, "the first frame must be HELLO");
        return;
    }
    auto* h = root_of<wire::Hello>(*hello);
    if (h->protocol_version() != protocol_version) {
        send_wire_error(fs, wire_errc::bad_version,
                        "this server speaks protocol version " + std::to_string(protocol_version));
        return;
    }
    if (!opts_.allowed_uids.empty() && fs.raw().is_local()) {
        ucred cred{};
        socklen_t len = sizeof cred;
        bool known = ::getsockopt(fs.raw().native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
        if (!known || std::find(opts_.allowed_uids.begin(), opts_.allowed_uids.end(), cred.uid) ==
                          opts_.allowed_uids.end()) {
            std::string who = known ? "uid " + std::to_string(cred.uid) : "a peer of unknown uid";
            VCUDA_LOG_WARN("{}: refused {} (not in --allow-uid)", peer, who);
            send_wire_error(fs, wire_errc::auth_failed,
                            "this vcuda-server's socket admits only some users (--allow-uid), and " + who +
                                " is not one of them: ask its operator to add it");
            return;
        }
    }
    if (h->bulk_set() != 0 && h->session_id() == 0) {
        send_wire_error(fs, wire_errc::unexpected_kind, "a bulk connection joins a session that is open");
        return;
    }
    if (opts_.isolate) {
        hand_over(fs, *hello, peer);  // to the session's worker process (server/isolation.cpp)
        return;
    }
    if (h->adopt()) {
        receive_moved(fs, *h, peer);
        return;
    }
    serve_hello(fs, *hello, peer);
}

void server::serve_hello(frame_stream& fs, const frame& hello, const std::string& peer) {
    auto* h = root_of<wire::Hello>(hello);
    const bool bulk = h->bulk_set() != 0;
    std::shared_ptr<session> sess;
    if (h->session_id() == 0 && opts_.isolate) {  // a worker: the session the parent opened for this client
        if (!(sess = adopt_session(*h, peer))) return;
    } else if (h->session_id() == 0) {
        session_grant grant;
        if (!authorize(*h, grant, fs, peer)) return;
        {
            std::lock_guard lock(open_mu_);
            if (!admit(grant, sessions_.size(), fs, peer)) return;
            sess = sessions_.create(drv_, opts_, grant, peer + " pid " + std::to_string(h->client_pid()));
            if (!grant.lease_id.empty()) lease_sessions_[{grant.lease_id, grant.gpus.front()}] = sess->id();
        }
        sess->handles.set_tag(h->handle_tag());
        sess->local_client = fs.raw().is_local();
        VCUDA_LOG_INFO("session {} opened by {} (host {})", sess->id(), sess->peer(),
                       h->client_host() ? h->client_host()->str() : "?");
    } else {
        const auto* key = h->session_key();
        sess = sessions_.find(h->session_id(),
                              key ? std::string_view(reinterpret_cast<const char*>(key->data()), key->size())
                                  : std::string_view());
        if (!sess) {
            VCUDA_LOG_WARN("{}: refused a join of session {}: unknown session or wrong key", peer,
                           h->session_id());
            send_wire_error(fs, wire_errc::auth_failed, "unknown session or wrong session secret");
            return;
        }
    }
    ++sess->lanes;
    if (!bulk) ++sess->call_lanes;
    if (!bulk && h->lane() == 0) sess->first_lane_here = true;
    bulk_hub::connection* bulk_conn = nullptr;
    if (bulk) {
        std::string why = "this server takes no bulk connections (--bulk-streams 0)";
        if (opts_.bulk_streams > 0) bulk_conn = sess->bulk().join(h->bulk_set(), opts_.bulk_streams, fs, why);
        if (!bulk_conn) {
            VCUDA_LOG_WARN("session {}: bulk connection from {} refused: {}", sess->id(), peer, why);
            send_wire_error(fs, wire_errc::not_allowed, why);
        }
    }
    // Frames through shared-memory rings when the client asked and shares this host.
    std::unique_ptr<shm_rings> rings;
    int rings_fd = -1;
    if (!bulk && (h->features() & features::shm_rings) && fs.raw().is_local() && opts_.shm_rings) {
        auto r = shm_rings::create(shm_rings::default_ring_bytes, rings_fd);
        if (r)
            rings = std::move(*r);
        else
            VCUDA_LOG_WARN("{}: no shared-memory rings ({}); frames go through the socket", peer, r.error());
    }
    flatbuffers::FlatBufferBuilder b(128);
    const uint64_t feats =
        features::all | (rings ? features::shm_rings : 0) | (opts_.bulk_streams ? features::bulk : 0);
    // The quota in force (a lease's or a token's, else the server's), 0 when the session may use the whole
    // GPU.
    uint64_t quota = 0;
    for (size_t d = 0; d < sess->device_count(); ++d)
        if (sess->allowed(d)) {
            if (sess->quota(d) < drv_.gpus()[sess->gpu_of(d)].total_memory) quota = sess->quota(d);
            break;
        }
    auto key = b.CreateVector(reinterpret_cast<const uint8_t*>(sess->key().data()), sess->key().size());
    auto name = b.CreateString("vcuda-server");
    wire::HelloReplyBuilder rb(b);
    rb.add_protocol_version(protocol_version);
    rb.add_features(feats);
    rb.add_session_id(sess->id());
    rb.add_server_name(name);
    rb.add_memory_quota(quota);
    rb.add_bulk_streams(opts_.bulk_streams);
    rb.add_session_key(key);
    b.Finish(rb.Finish());
    bool greeted = (!bulk || bulk_conn) &&
                   fs.send(make_frame(frame_kind::hello_reply, b), after(std::chrono::seconds(10)), rings_fd)
                       .has_value();
    if (rings_fd >= 0) close(rings_fd);
    if (greeted && rings)
        fs.raw().attach_rings(std::move(rings), opts_.spin);
    else
        fs.raw().set_spin(opts_.spin);
    sess->attach(&fs);
    if (bulk_conn) {
        sess->bulk().serve(bulk_conn);  // also when the reply could not be sent: it releases the connection
    } else if (greeted) {
        run_lane(sess, fs, h->lane());
        sess->lane_gone(h->lane());
    }
    sess->detach(&fs);
    // The client's lanes are gone (the process ended): its bulk connections are closed too.
    if (!bulk && --sess->call_lanes == 0) sess->bulk().close("the client's lanes ended");
    leave_session(sess);
}

void server::leave_session(const std::shared_ptr<session>& sess) {
    if (--sess->lanes != 0) return;
    auto t0 = std::chrono::steady_clock::now();
    uint64_t held = 0;
    size_t handles;
    {
        std::lock_guard lock(sess->mu);
        for (size_t d = 0; d < sess->device_count(); ++d) held += sess->memory(d).mapped();
        handles = sess->handles.size();
    }
    sessions_.remove(sess->id(), sess.get());
    if (!sess->lease_id().empty()) {
        std::lock_guard lock(open_mu_);
        for (size_t d = 0; d < sess->device_count(); ++d)
            if (sess->allowed(d)) drop_lease_claim(sess->lease_id(), {sess->gpu_of(d)}, sess->id());
    }
    sess->release_all();
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    if (sess->moved())
        VCUDA_LOG_INFO("session {} ({}): its last connection here closed; it lives on at {}", sess->id(),
                       sess->peer(), sess->moved_to());
    else
        VCUDA_LOG_INFO("session {} ended ({}): released {} MiB of GPU memory and {} handles in {} ms",
                       sess->id(), sess->peer(), held >> 20, handles, ms);
    if (on_session_end_) on_session_end_();
}

bool server::authorize(const wire::Hello& h, session_grant& grant, std::string& refusal) {
    if (h.devices())
        for (int32_t d : *h.devices()) {
            if (d < 0 || static_cast<size_t>(d) >= drv_.gpus().size()) {
                refusal = "this server has no GPU " + std::to_string(d);
                return false;
            }
            grant.gpus.push_back(static_cast<size_t>(d));
        }
    // Without a secret the server listens only where the operator allowed that (loopback, a Unix socket, or
    // --insecure: see main.cpp): its own defaults apply.
    if (opts_.secret.empty()) return true;
    std::string token = h.token() ? h.token()->str() : "";
    if (token.empty()) {
        refusal = opts_.managed
                      ? "this server is attached to a manager: a lease token is required (run the program "
                        "with vcuda run --manager ADDR)"
                      : "this server requires a token: run the program with `vcuda run --token TOKEN` or set "
                        "VCUDA_TOKEN "
                        "(the server's operator makes one with `vcuda token create --secret-file FILE`)";
        return false;
    }
    auto claims = mgmt::verify_token(opts_.secret, token, std::chrono::system_clock::now());
    if (!claims) {
        refusal = (opts_.managed ? "lease token rejected: " : "token rejected: ") + claims.error();
        return false;
    }
    if (claims->gpu_uuid == mgmt::any_gpu) {  // `vcuda token create`: any GPU the client asks for
        if (opts_.managed || !claims->lease_id.empty()) {
            refusal =
                "this server is attached to a manager and takes its lease tokens only, not tokens made with "
                "`vcuda token create`: run the program with vcuda run --manager ADDR";
            return false;
        }
        grant.memory_quota = claims->memory_quota;
        grant.tenant = "token:" + mgmt::token_fingerprint(token);
        return true;
    }
    for (size_t i = 0; i < drv_.gpus().size(); ++i) {
        if (gpu_id(i) == claims->gpu_uuid) {
            grant.gpus = {i};
            grant.memory_quota = claims->memory_quota;
            grant.lease_id = claims->lease_id;
            grant.tenant = claims->tenant.empty() ? "lease:" + claims->lease_id : "tenant:" + claims->tenant;
            return true;
        }
    }
    refusal = "lease token is for GPU " + claims->gpu_uuid + ", which this server does not have";
    return false;
}

bool server::claim_lease(const session_grant& grant, std::string& refusal) {
    if (grant.lease_id.empty()) return true;
    auto now = std::chrono::system_clock::now();
    std::erase_if(released_, [&](auto& r) { return r.second < now; });  // their tokens have expired anyway
    if (released_.count(grant.lease_id)) {
        refusal = "lease " + grant.lease_id +
                  " was released or has expired: its tokens open no session; get a new "
                  "lease from the manager (vcuda run --manager ADDR)";
        return false;
    }
    auto key = std::make_pair(grant.lease_id, grant.gpus.front());
    if (lease_sessions_.count(key)) {
        refusal = "lease " + grant.lease_id + " already has a session open on this GPU (session " +
                  std::to_string(lease_sessions_[key]) +
                  "): a lease token opens one session per GPU of its lease; "
                  "end that program first, or lease another GPU";
        return false;
    }
    lease_sessions_[key] = 0;  // taken; the session's id once it exists
    return true;
}

namespace {
bool refuse_session(frame_stream& fs, const std::string& peer, const std::string& refusal) {
    VCUDA_LOG_WARN("{}: session refused: {}", peer, refusal);
    send_wire_error(fs, wire_errc::auth_failed, refusal);
    return false;
}
}  // namespace

bool server::authorize(const wire::Hello& h, session_grant& grant, frame_stream& fs,
                       const std::string& peer) {
    std::string refusal;
    if (!authorize(h, grant, refusal)) return refuse_session(fs, peer, refusal);
    if (grant.tenant.empty()) {  // no credential: the local peer's user, else nobody in particular
        ucred cred{};
        socklen_t len = sizeof cred;
        grant.tenant = fs.raw().is_local() && ::getsockopt(fs.raw().native_handle(), SOL_SOCKET, SO_PEERCRED,
                                                           &cred, &len) == 0
                           ? "uid:" + std::to_string(cred.uid)
                           : "anonymous";
    }
    return true;
}

bool server::admit(const session_grant& grant, size_t open, frame_stream& fs, const std::string& peer) {
    std::string refusal;
    if (!claim_lease(grant, refusal)) return refuse_session(fs, peer, refusal);
    if (open >= opts_.max_sessions) {
        drop_lease_claim(grant.lease_id, grant.gpus, 0);
        VCUDA_LOG_WARN("{}: session refused: {} sessions are open (--max-sessions {})", peer, open,
                       opts_.max_sessions);
        send_wire_error(
            fs, wire_errc::not_allowed,
            "this vcuda-server is at its limit of " + std::to_string(opts_.max_sessions) +
                " sessions (--max-sessions): retry later, or ask its operator to raise the limit");
        return false;
    }
    return true;
}

std::optional<size_t> server::gpu_index(const std::string& id) const {
    for (size_t i = 0; i < drv_.gpus().size(); ++i)
        if (gpu_id(i) == id) return i;
    return std::nullopt;
}

CUresult server::relocate(const std::shared_ptr<session>& sess, size_t index, size_t gpu, std::string& why) {
    if (!sess->allowed(index)) {
        why = "it has no device " + std::to_string(index);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    const size_t from = sess->gpu_of(index);
    CUresult rc = sess->relocate(index, gpu, std::chrono::seconds(5), why);
    if (rc == CUDA_SUCCESS) {
        std::lock_guard lock(open_mu_);
        move_lease_claim(sess->lease_id(), from, gpu, sess->id());
    }
    return rc;
}

void server::move_lease_claim(const std::string& lease_id, size_t from, size_t to, uint64_t session_id) {
    if (lease_id.empty()) return;
    drop_lease_claim(lease_id, {from}, session_id);
    lease_sessions_[{lease_id, to}] = session_id;
}

void server::drop_lease_claim(const std::string& lease_id, const std::vector<size_t>& gpus,
                              uint64_t session_id) {
    if (lease_id.empty()) return;
    for (size_t g : gpus) {
        auto it = lease_sessions_.find({lease_id, g});
        if (it != lease_sessions_.end() && it->second == session_id) lease_sessions_.erase(it);
    }
}

void server::note_live_leases(
    const std::vector<std::pair<std::string, std::chrono::system_clock::time_point>>& alive) {
    std::lock_guard lock(open_mu_);
    std::map<std::string, std::chrono::system_clock::time_point> now_alive(alive.begin(), alive.end());
    // Leases this server knew alive (reported, or holding a session) that the manager no longer has:
    // released, expired, or moved to another server. Their tokens are refused until they would have expired
    // anyway (a lease's expiry only grows; a move token lives mgmt::move_token_life at least). A lease listed
    // again (it moves back here) is alive again.
    const auto now = std::chrono::system_clock::now();
    auto forget_at = now + std::chrono::hours(24);
    for (auto& [id, until] : live_leases_)
        if (!now_alive.count(id)) released_[id] = std::max(until, now + mgmt::move_token_life);
    for (auto& [id, until] : now_alive) released_.erase(id);
    for (auto& [key, sid] : lease_sessions_)
        if (!now_alive.count(key.first) && !live_leases_.count(key.first))
            released_.emplace(key.first, forget_at);
    live_leases_ = std::move(now_alive);
}

std::string gpu_uuid_string(const CUuuid& u) {
    const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
    char s[64];
    std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    return s;
}

std::string gpu_identity_string(const CUuuid& u, const std::string& tag, size_t index) {
    if (tag.empty()) return gpu_uuid_string(u);
    // Two FNV-1a 64-bit hashes (different offsets) of the UUID, the tag and the index: 128 bits.
    std::string text = gpu_uuid_string(u) + "/" + tag + "/" + std::to_string(index);
    auto fnv = [&](uint64_t h) {
        for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
        return h;
    };
    const uint64_t hi = fnv(0xcbf29ce484222325ull), lo = fnv(0x84222325cbf29ce4ull);
    CUuuid out{};
    for (int i = 0; i < 8; ++i) {
        out.bytes[i] = static_cast<char>(hi >> (56 - 8 * i));
        out.bytes[8 + i] = static_cast<char>(lo >> (56 - 8 * i));
    }
    return gpu_uuid_string(out);
}

std::string server::gpu_id(size_t index) const {
    if (index < opts_.gpu_identities.size() && !opts_.gpu_identities[index].empty())
        return opts_.gpu_identities[index];
    return index < drv_.gpus().size() ? gpu_uuid_string(drv_.gpus()[index].uuid) : std::string();
}

namespace {
// A call to a session that moved to another server: a posted one is dropped (its client keeps it and sends it
// again there), a synchronous one is answered with where the session went and the last call this lane ran
// here, with what the lane still owed the client (an earlier posted call's error, what kernels printed).
bool answer_moved(session& sess, frame_stream& fs, const frame& f, lane_state& lane, uint64_t ran) {
    if (f.header.flags & frame_flags::no_reply) return true;
    flatbuffers::FlatBufferBuilder b(256);
    std::string detail;
    if (lane.pending_error != CUDA_SUCCESS)
        detail = "an earlier asynchronous call failed: " + lane.pending_detail;
    auto& printed = lane.device_output;
    if (std::string held = sess.take_held_output(); !held.empty()) printed.insert(0, held);
    auto output = printed.empty()
                      ? 0
                      : b.CreateVector(reinterpret_cast<const uint8_t*>(printed.data()), printed.size());
    b.Finish(wire::CreateReply(b, lane.pending_error, 0, 0, detail.empty() ? 0 : b.CreateString(detail),
                               output, b.CreateString(sess.moved_to()), ran));
    printed.clear();
    lane.pending_error = CUDA_SUCCESS;
    lane.pending_detail.clear();
    return fs.send(make_frame(frame_kind::reply, b, f.header.sequence), after(std::chrono::seconds(10)))
        .has_value();
}
}  // namespace

void server::run_lane(const std::shared_ptr<session>& sess, frame_stream& fs, uint32_t lane_number) {
    auto& d = sess->api();
    uint64_t ran = sess->progress_of(lane_number);  // the last call this lane ran (where it ran before, too)
    // A lane that follows its moved session from another thread sends all the posted frames it kept; those
    // the old server ran are left out here.
    const uint64_t ran_before = ran;
    staging_pool pool(d);
    lane_state lane;
    lane.stream = &fs;
    device_output::capture printed(lane.device_output);  // this thread is the lane's for its whole life
    lane.staging = &pool;
    // However the lane ends: if the session's contexts went since this lane last ran a call (it moved away,
    // was suspended, or another thread reset a device), the pool's events and registrations went with them
    // and must not reach the driver again, nor may this thread keep a destroyed context current.
    struct contexts_check {
        session& sess;
        lane_state& lane;
        staging_pool& pool;
        const driver_table& d;
        ~contexts_check() {
            if (sess.epoch() == lane.epoch) return;
            pool.contexts_changed();
            d.cuCtxSetCurrent(nullptr);
        }
    } at_end{*sess, lane, pool, d};
    staging_pool::buffer* staged = nullptr;
    // Host-to-device payloads land straight in a pinned staging buffer when they fit one.
    payload_sink sink = [&](const frame_header& h, const std::vector<std::byte>& meta) -> std::byte* {
        staged = nullptr;
        if (h.kind != static_cast<uint16_t>(frame_kind::call) || h.payload_len > staging_pool::buffer_size)
            return nullptr;
        auto* call = flatbuffers::GetRoot<wire::Call>(meta.data());
        if (call->op() != static_cast<uint32_t>(op::copy_htod)) return nullptr;
        staged = pool.take();
        return staged ? static_cast<std::byte*>(staged->data) : nullptr;
    };
    frame f;  // reused, so that receiving a call allocates nothing
    constexpr size_t payload_kept = 1u << 20;
    for (;;) {
        if (f.payload.capacity() > payload_kept) std::vector<std::byte>().swap(f.payload);
        if (auto r = fs.receive_into(f, never, std::chrono::seconds(60), sink); !r) {
            if (staged) pool.give_back(staged, nullptr);
            if (r.error().code == transport_errc::protocol) {
                VCUDA_LOG_WARN("session {} lane {}: bad frame ({}); closing the lane", sess->id(),
                               lane_number, r.error().message);
                send_wire_error(fs, wire_errc::verify_failed, r.error().message);
            }
            return;
        }
        if (f.kind() == frame_kind::goodbye) return;
        if (f.kind() != frame_kind::call) {
            send_wire_error(fs, wire_errc::unexpected_kind, "expected a CALL frame");
            return;
        }
        if (f.header.sequence <= ran_before && (f.header.flags & frame_flags::no_reply)) {
            if (staged) pool.give_back(staged, nullptr);
            staged = nullptr;
            continue;
        }
        auto* call = root_of<wire::Call>(f);
        sess->counters.calls.fetch_add(1, std::memory_order_relaxed);  // the only cost metrics add to a call
        if (sess->moved()) {
            if (staged) pool.give_back(staged, nullptr);
            staged = nullptr;
            if (!answer_moved(*sess, fs, f, lane, ran)) return;
            continue;
        }
        if (call->after_seq() != 0 && call->after_lane() != lane_number &&
            !sess->wait_for_lane(call->after_lane(), call->after_seq(),
                                 [&] { return fs.raw().peer_gone() || sess->moved(); })) {
            if (fs.raw().peer_gone()) {  // the client closed while its call waited: nobody wants the answer
                VCUDA_LOG_DEBUG("session {} lane {}: the client left while a call waited for lane {}",
                                sess->id(), lane_number, call->after_lane());
                if (staged) pool.give_back(staged, nullptr);
                return;
            }
            VCUDA_LOG_DEBUG("session {} lane {}: lane {} ended before its call {}; going on", sess->id(),
                            lane_number, call->after_lane(), call->after_seq());
        }
        // A call that blocks until the GPU is done counts as run once it starts, so that other threads' calls
        // that come after it in time do not wait for the GPU too (they would not with the real driver).
        const bool blocks = call->op() == static_cast<uint32_t>(op::ctx_synchronize) ||
                            call->op() == static_cast<uint32_t>(op::cuStreamSynchronize) ||
                            call->op() == static_cast<uint32_t>(op::cuEventSynchronize);
        if (blocks) sess->lane_progress(lane_number, f.header.sequence);
        call_context cx(*sess, lane, *call, f, staged);
        staged = nullptr;
        CUresult rc;
        bool moved_now = false;  // the session moved while this call waited: it did not run
        const dispatch_entry* entry = find_op(call->op());
        if (!entry) {
            rc = cx.fail(CUDA_ERROR_NOT_SUPPORTED,
                         "op " + std::to_string(call->op()) + " is not allowed by this server");
            VCUDA_LOG_WARN("session {}: refused op {}", sess->id(), call->op());
        } else if (const bool gated = !entry->outside_gate;
                   gated && (rc = sess->enter_call(lane.pending_detail)) != CUDA_SUCCESS) {
            // A suspended session that could not be brought back: the call fails with why.
            moved_now = sess->moved();
            if (!moved_now) rc = cx.fail(rc, lane.pending_detail);
            lane.pending_detail.clear();
        } else {
            if (sess->epoch() != lane.epoch) {  // the session was rebuilt: its contexts are new
                lane.epoch = sess->epoch();
                lane.current_device = -2;
                pool.contexts_changed();
            }
            // The caller's current device: its session context becomes current on this thread. A call that
            // names none (the client thread has no context: library loads, kernel lookups) runs under the
            // session's first context when it has one, never under whatever this thread had before; it is
            // looked up again each time, since another lane may make that context meanwhile.
            int dev = call->device();
            rc = CUDA_SUCCESS;
            if (dev < 0) {
                d.cuCtxSetCurrent(sess->existing_first_context());
                lane.current_device = -2;
            } else if (dev != lane.current_device) {
                if (!sess->allowed(static_cast<size_t>(dev))) {
                    rc = cx.fail(CUDA_ERROR_INVALID_DEVICE, "no such device in this session");
                } else {
                    CUcontext ctx = sess->context(dev, rc);
                    if (ctx) d.cuCtxSetCurrent(ctx);
                }
                lane.current_device = rc == CUDA_SUCCESS ? dev : -2;
            }
            // A green context's call runs in it (server/handlers_green.cpp); the next call sets its own.
            if (const uint64_t green = call->green_ctx(); green != 0 && rc == CUDA_SUCCESS) {
                lane.current_device = -2;
                if (CUcontext ctx = sess->green_context(green))
                    d.cuCtxSetCurrent(ctx);
                else
                    rc = cx.fail(CUDA_ERROR_INVALID_CONTEXT, "no such green context in this session");
            }
            if (rc == CUDA_SUCCESS) rc = entry->handler(cx);
            // A synchronization gives the memory a served pool's frees gave back (server/handlers_pool.cpp)
            // to the session, as the driver's pools release what they keep past their threshold there, and
            // not before: CuPy's tests check that cudaMalloc cannot have it until then.
            if (rc == CUDA_SUCCESS && blocks && gated &&
                sess->pools.maybe_pending.load(std::memory_order_relaxed)) {
                std::lock_guard lock(sess->mu);
                sess->settle_stream_frees(false);
            }
            if (gated) sess->leave_call();
            // A wait outside the gate (the next host function) ended by the move: its client asks again
            // there.
            if (!gated && rc != CUDA_SUCCESS && !cx.replied && sess->moved()) moved_now = true;

            VCUDA_LOG_TRACE("session {} lane {}: {} -> {}", sess->id(), lane_number, entry->name,
                            static_cast<int>(rc));
        }
        if (cx.staged() && cx.staged()->busy)
            pool.give_back(cx.staged(), nullptr);  // the handler did not use it
        if (moved_now) {
            if (!answer_moved(*sess, fs, f, lane, ran)) return;
            continue;
        }
        ran = f.header.sequence;
        if (!blocks) sess->lane_progress(lane_number, f.header.sequence);
        if (cx.queued()) {
            if (rc != CUDA_SUCCESS && lane.pending_error == CUDA_SUCCESS) {
                lane.pending_error = rc;
                lane.pending_detail = std::string(entry ? entry->name : "op") + ": " + cx.detail;
                VCUDA_LOG_DEBUG("session {}: queued {} failed with {} ({})", sess->id(),
                                entry ? entry->name : "op", static_cast<int>(rc), cx.detail);
            }
            continue;
        }
        if (cx.replied) continue;
        // An earlier queued call failed: this call answers that failure. It still ran (frees, destroys and
        // host function completions must; what a successful creation made stays the session's until it ends).
        // Not the client's own collection of deferred copies: the application never sees that answer, so the
        // failure waits for its next call (and the copies collected are not thrown away).
        if (rc == CUDA_SUCCESS && lane.pending_error != CUDA_SUCCESS &&
            call->op() != static_cast<uint32_t>(op::deferred_collect) &&
            call->op() != static_cast<uint32_t>(op::deferred_wait)) {
            rc = cx.fail(lane.pending_error, "an earlier asynchronous call failed: " + lane.pending_detail);
            lane.pending_error = CUDA_SUCCESS;
            lane.pending_detail.clear();
            cx.outs.clear();
            cx.out_blobs.clear();
            cx.reply_payload.clear();
        }
        if (!send_reply(cx, rc)) return;
    }
}

void server::receive_moved(frame_stream& fs, const wire::Hello& h, const std::string& peer,
                           const session_grant* granted) {
    session_grant grant;
    if (granted)
        grant = *granted;
    else if (!authorize(h, grant, fs, peer))
        return;
    frame_limits state_limits;
    state_limits.max_meta = max_moved_state_bytes;
    state_limits.max_payload = max_precopy_piece;
    fs.set_limits(state_limits);
    // Pre-copied memory first, if the sender pre-copies (server/precopy.hpp): pieces straight into place, as
    // much as the session may hold here.
    uint64_t room = 0;
    for (const auto& g : drv_.gpus()) {
        const uint64_t quota = grant.memory_quota ? grant.memory_quota : opts_.memory_quota;
        room += quota ? std::min<uint64_t>(quota, g.total_memory) : g.total_memory;
    }
    precopy_store pre(room);
    std::string precopy_error;
    payload_sink into_store = [&](const frame_header& fh, const std::vector<std::byte>& meta) -> std::byte* {
        if (fh.kind != static_cast<uint16_t>(frame_kind::state_piece)) return nullptr;
        const auto* q = flatbuffers::GetRoot<wire::StatePiece>(meta.data());
        if (!q->precopy() || !precopy_error.empty()) return nullptr;
        return pre.place(q->va(), q->mapping_size(), q->offset(), fh.payload_len, precopy_error);
    };
    frame in;
    transport_result<void> got;
    while (
        (got = fs.receive_into(in, after(std::chrono::seconds(30)), std::chrono::seconds(120), into_store)) &&
        in.kind() == frame_kind::state_piece) {
        if (!root_of<wire::StatePiece>(in)->precopy() || !in.payload.empty() || !precopy_error.empty()) {
            if (precopy_error.empty()) precopy_error = "a piece came before the session's state";
            VCUDA_LOG_WARN("{}: a moved session's pre-copy refused: {}", peer, precopy_error);
            send_wire_error(fs, wire_errc::unexpected_kind, "pre-copy refused: " + precopy_error);
            return;
        }
    }
    if (!got || in.kind() != frame_kind::session_state) {
        std::string what = got ? "a " + std::string(to_string(in.kind())) + " frame" : got.error().message;
        VCUDA_LOG_WARN("{}: a moved session's state did not come: {}", peer, what);
        send_wire_error(fs, wire_errc::unexpected_kind, "expected the moved session's state: " + what);
        return;
    }
    auto* st = root_of<wire::SessionState>(in);
    std::string key =
        st->session_key()
            ? std::string(reinterpret_cast<const char*>(st->session_key()->data()), st->session_key()->size())
            : std::string();
    std::string from = (st->peer() ? st->peer()->str() : std::string("?")) + ", moved from " + peer;
    if (st->gpus()) {
        std::string why;
        if (!place_moved({st->gpus()->begin(), st->gpus()->end()}, grant.gpus, drv_.gpus().size(),
                         grant.placed, why)) {
            refuse_session(fs, peer, "the moved session has no place here: " + why);
            return;
        }
    }
    std::shared_ptr<session> sess;
    {
        std::lock_guard lock(open_mu_);
        if (!granted && !admit(grant, sessions_.size(), fs, peer)) return;
        // A session that moved away from here and now comes back: the old object only waits for its client's
        // connections to go (they follow it), and gives up its id.
        if (key.size() == session_key_bytes && st->session_id() != 0 &&
            sessions_.forget_moved_away(st->session_id(), key))
            VCUDA_LOG_INFO("session {} comes back to this server", st->session_id());
        if (key.size() == session_key_bytes && st->session_id() != 0)
            sess = sessions_.adopt(st->session_id(), key, drv_, opts_, grant, from);
        if (!sess) {
            if (!grant.lease_id.empty() && !granted) drop_lease_claim(grant.lease_id, grant.gpus, 0);
            refuse_session(fs, peer, "a session with that id is here already, or its key is malformed");
            return;
        }
        if (!grant.lease_id.empty() && !granted)
            lease_sessions_[{grant.lease_id, grant.gpus.front()}] = sess->id();
    }
    for (auto [index, gpu] : grant.placed)
        if (index != gpu)
            VCUDA_LOG_INFO("session {}: its device {} runs on this server's GPU {}", sess->id(), index, gpu);
    // This connection holds the session until its client has joined it here (below).
    ++sess->lanes;
    if (on_session_adopted_ && !on_session_adopted_(sess->id(), key, from)) {
        refuse_session(fs, peer, "a session with that id is here already");
        leave_session(sess);
        return;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string why;
    CUresult rc = sess->take_moved_state(*st, fs, pre, why);
    if (rc != CUDA_SUCCESS) {
        // Its id free before the answer: the sender may offer it again at once (copying its memory instead).
        // The rest of its end comes after the answer (a worker process ends with its last session).
        VCUDA_LOG_WARN("session {} from {} not taken: {}", sess->id(), peer, why);
        sessions_.remove(sess->id(), sess.get());
        if (on_adopted_refused_) on_adopted_refused_();
    }
    flatbuffers::FlatBufferBuilder b(256);
    b.Finish(wire::CreateReply(b, rc, 0, 0, why.empty() ? 0 : b.CreateString(why)));
    if (!fs.send(make_frame(frame_kind::reply, b), after(std::chrono::seconds(10))))
        VCUDA_LOG_WARN("session {}: the server that moved it here did not get the answer", sess->id());
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    if (rc != CUDA_SUCCESS) {
        leave_session(sess);
        return;
    }
    VCUDA_LOG_INFO("session {} ({}) moved here: {} MiB of GPU state received and rebuilt in {} ms",
                   sess->id(), from, st->bytes() >> 20, ms);
    // Until the client's lane 0 (which its process keeps to the end) is here, or the old server closed this
    // connection: its last connection from the client closed there, so the client has gone.
    while (!sess->first_lane_here.load() && !fs.raw().peer_gone() && !stopping_)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!sess->first_lane_here.load())
        VCUDA_LOG_INFO("session {}: its client left {} before its lane 0 came here", sess->id(), peer);
    leave_session(sess);
}

}  // namespace vcuda::server
