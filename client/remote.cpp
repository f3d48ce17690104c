#include "client/remote.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "client/env_switch.hpp"
#include "client/state.hpp"
#include "common/log.hpp"
#include "common/wire.hpp"

namespace vcuda::client {

namespace {
// The calling thread's lane to each of the client's sessions (indexed by session tag). Plain pointers
// (trivially destructible) so that calls made after the thread's destructors ran — cudart unloads its modules
// from an exit handler — still find a valid state: a new lane.
thread_local lane* tls_lanes[session::max_sessions] = {};
struct lane_closer {
    bool armed = false;
    ~lane_closer() {
        // Lane 0 of a session opened it and lives as long as the process: the session must outlast the thread
        // that called cuInit (exit handlers still make calls). Other lanes close with their thread.
        // Lane 0 stays in its slot: the exit handlers that run after this destructor on the thread that
        // called cuInit (cudart unloading its modules) use it, rather than connecting anew (over TLS that
        // failed, OpenSSL being cleaned up by then).
        for (auto& l : tls_lanes) {
            if (!l || l->number() == 0) continue;
            delete l;
            l = nullptr;
        }
    }
};
thread_local lane_closer tls_closer;

void adopt_lane(std::unique_ptr<lane> l, uint32_t tag) {
    auto& slot = tls_lanes[tag];
    if (slot && slot->number() != 0) delete slot;
    slot = l.release();
    tls_closer.armed = true;  // touching it registers its destructor for this thread
}
}  // namespace

// ---------------------------------------------------------------- lane

outgoing_frame lane::build(const call_request& rq, bool async) {
    fbb_.Clear();
    blob_offsets_.clear();
    for (auto& b : rq.blobs)
        blob_offsets_.push_back(
            wire::CreateBlob(fbb_, fbb_.CreateVector(reinterpret_cast<const uint8_t*>(b.data()), b.size())));
    auto args = fbb_.CreateVector(rq.args.data(), rq.args.size());
    auto blobs = fbb_.CreateVector(blob_offsets_);
    // The host-function thread's calls, NVML's status queries and the collection of finished deferred copies
    // stand outside the order of the application's calls: a host function (or a graph copy's host side) may
    // be what an application call on another thread is waiting for. (A collection follows a call that was
    // ordered: what it must see was started before that call.)
    const bool ordered = rq.operation != op::host_func_next && rq.operation != op::host_func_done &&
                         rq.operation != op::host_copy_read && rq.operation != op::host_copy_write &&
                         rq.operation != op::gpu_status && rq.operation != op::deferred_collect;
    ++sequence_;
    auto after = ordered ? session_.note_send(number_, sequence_) : session::frame_ref{};
    fbb_.Finish(wire::CreateCall(fbb_, static_cast<uint32_t>(rq.operation), rq.device, args, blobs,
                                 after.lane, after.seq, current_green_context()));
    return make_frame(frame_kind::call, fbb_, sequence_, number_, async ? frame_flags::no_reply : 0,
                      rq.payload);
}

session::frame_ref session::note_send(uint32_t lane, uint64_t seq) {
    std::lock_guard lock(order_mu_);
    frame_ref prev = last_sent_;
    last_sent_ = {lane, seq};
    return prev.seq != 0 && prev.lane != lane ? prev : frame_ref{};
}

lane::lane(session& s, frame_stream fs, uint32_t number) : session_(s), fs_(std::move(fs)), number_(number) {
    owner_pid_ = getpid();
    server_ = s.address();
    writer_ = std::thread([this] { writer_loop(); });
    session_.add_lane(this);
}

void session::add_lane(lane* l) {
    std::lock_guard lock(lanes_mu_);
    lanes_.push_back(l);
}

void session::remove_lane(lane* l) {
    std::lock_guard lock(lanes_mu_);
    std::erase(lanes_, l);
}

void session::follow_others(const std::string& to, lane* self) {
    std::lock_guard lock(lanes_mu_);
    for (lane* l : lanes_)
        if (l != self) l->follow_if_idle(to);
}

void lane::follow_if_idle(const std::string& to) {
    std::unique_lock use(use_mu_, std::try_to_lock);
    if (!use || server_ == to || session_.lost() || getpid() != owner_pid_) return;
    follow(to, 0, nullptr, false);
}

lane::~lane() {
    session_.remove_lane(this);
    // Calls this thread posted are taken by the server before the lane closes (or sent again where the
    // session went: follow).
    if (!unacked_.empty() && !session_.lost() && getpid() == owner_pid_) {
        call_request rq;
        rq.operation = op::lane_sync;
        call_reply rp;
        try {
            call(rq, rp);
        } catch (const std::exception& e) {  // out of memory while closing: the calls may be lost, say so
            VCUDA_LOG_WARN("lane {} closed without its last posted calls confirmed: {}", number_, e.what());
        }
    }
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (writer_.joinable()) writer_.join();
}

void lane::writer_loop() {
    std::vector<std::byte> batch;
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !writing_); });
        if (queue_.empty() && stop_) return;
        batch.swap(queue_);
        writing_ = true;
        lock.unlock();
        iovec iov{batch.data(), batch.size()};
        auto r = failed_ ? transport_result<void>{} : fs_.raw().write_all({&iov, 1});
        batch.clear();
        lock.lock();
        writing_ = false;
        if (!r) {
            failed_ = true;
            failure_ = r.error();
        }
        cv_.notify_all();
    }
}

bool lane::send(const outgoing_frame& f, bool wait_for_reply, int pass_fd) {
    std::byte header[frame_header_size];
    frame_header h = f.header;
    h.meta_len = static_cast<uint32_t>(f.meta.size());
    h.payload_len = f.payload.size();
    encode_header(h, header);
    iovec iov[3] = {{header, frame_header_size},
                    {const_cast<std::byte*>(f.meta.data()), f.meta.size()},
                    {const_cast<std::byte*>(f.payload.data()), f.payload.size()}};
    if (!wait_for_reply) {
        unacked_.insert(unacked_.end(), header, header + frame_header_size);
        unacked_.insert(unacked_.end(), f.meta.begin(), f.meta.end());
        unacked_.insert(unacked_.end(), f.payload.begin(), f.payload.end());
    }
    if (getpid() != owner_pid_) {  // forked child: the writer thread stayed in the parent
        auto r = fs_.raw().write_all(iov, never, pass_fd);
        if (!r) failure_ = r.error();
        return r.has_value();
    }
    std::unique_lock lock(mu_);
    if (failed_) return false;
    // Writes the queued frames, then `iov`, from this thread while the writer is held off; the lock is held
    // on entry and on return.
    auto write_here = [&] {
        std::vector<std::byte> queued;
        queued.swap(queue_);
        writing_ = true;
        lock.unlock();
        iovec all[4] = {{queued.data(), queued.size()}, iov[0], iov[1], iov[2]};
        const size_t skip = queued.empty() ? 1 : 0;
        auto r = fs_.raw().write_all(std::span<iovec>(all + skip, 4 - skip), never, pass_fd);
        lock.lock();
        writing_ = false;
        if (queue_.empty()) {  // keep the queue's capacity
            queued.clear();
            queue_.swap(queued);
        }
        if (!r) {
            failed_ = true;
            failure_ = r.error();
        }
        cv_.notify_all();
        return !failed_;
    };
    // A synchronous call on a link the writer is not writing goes out from this thread, with the frames
    // queued before it: no hand-off to the writer on the latency-critical path (a launch then a synchronize
    // would otherwise wait for the writer to wake). On shared-memory rings a write is a copy into the ring,
    // cheaper than waking the writer, so every frame goes out from here while the link is idle.
    if (!writing_ && (wait_for_reply || fs_.raw().has_rings())) return write_here();
    if (pass_fd >= 0) {  // a descriptor goes with bytes written from here, never through the writer's queue
        cv_.wait(lock, [&] { return !writing_; });
        if (failed_) return false;
        return write_here();
    }
    if (f.payload.size() <= direct_payload) {
        queue_.insert(queue_.end(), header, header + frame_header_size);
        queue_.insert(queue_.end(), f.meta.begin(), f.meta.end());
        queue_.insert(queue_.end(), f.payload.begin(), f.payload.end());
        if (!writing_) cv_.notify_one();
        return true;
    }
    // Large payload: wait for the queue to drain, then write from here, so bulk bytes are not copied.
    cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
    if (failed_) return false;
    return write_here();
}

bool lane::follow(const std::string& to, uint64_t ran_through, const outgoing_frame* again, bool others) {
    std::string why;
    if (!session_.moved(to)) {
        session_.mark_lost("the session moved to '" + to + "', which is not an address");
        return false;
    }
    auto fresh = session_.connect_stream(number_, why);
    if (!fresh) {
        session_.mark_lost("the session moved to " + to + ", and joining it there failed: " + why);
        return false;
    }
    // The frames the old server did not run, in their order, then the call that learnt of the move. They are
    // the tail of unacked_: a lane's frames go in in sequence order.
    size_t run = 0;
    while (run + frame_header_size <= unacked_.size()) {
        frame_header h;
        std::memcpy(&h, unacked_.data() + run, frame_header_size);
        if (h.sequence > ran_through) break;
        run += frame_header_size + h.meta_len + h.payload_len;
    }
    unacked_.erase(unacked_.begin(),
                   unacked_.begin() + static_cast<std::ptrdiff_t>(std::min(run, unacked_.size())));
    {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !writing_; });
        queue_.clear();  // also in unacked_: sent below
        fs_ = std::move(*fresh);
        failed_ = false;
    }
    std::byte header[frame_header_size];
    std::vector<iovec> iov;
    if (!unacked_.empty()) iov.push_back({unacked_.data(), unacked_.size()});
    if (again) {
        frame_header h = again->header;
        h.meta_len = static_cast<uint32_t>(again->meta.size());
        h.payload_len = again->payload.size();
        encode_header(h, header);
        iov.push_back({header, frame_header_size});
        iov.push_back({const_cast<std::byte*>(again->meta.data()), again->meta.size()});
        if (!again->payload.empty())
            iov.push_back({const_cast<std::byte*>(again->payload.data()), again->payload.size()});
    }
    if (!iov.empty())
        if (auto r = fs_.raw().write_all(iov); !r) {
            session_.mark_lost("the session moved to " + to +
                               ", and sending its calls there failed: " + r.error().message);
            return false;
        }
    VCUDA_LOG_DEBUG("lane {} follows its session to {} ({} bytes of calls sent again)", number_, to,
                    unacked_.size());
    server_ = to;
    if (others) session_.follow_others(to, this);
    return true;
}

int lane::lost(const transport_error& e) {
    session_.mark_lost(std::string(to_string(e.code)) + ": " + e.message);
    return connection_lost_result;
}

namespace {
// What VCUDA_CALL_STATS=1 prints at exit: the operations that went to the server, most round trips first.
void print_call_stats() {
    auto& c = counters();
    std::vector<std::pair<uint64_t, uint32_t>> rows;
    for (uint32_t i = 0; i < op_id_limit; ++i) {
        uint64_t n = c.sync_by_op[i].load() + c.async_by_op[i].load();
        if (n) rows.emplace_back(c.sync_by_op[i].load(), i);
    }
    std::sort(rows.begin(), rows.end(), std::greater<>());
    std::fprintf(stderr, "vcuda call stats (pid %d): %llu synchronous round trips, %llu asynchronous calls\n",
                 getpid(), static_cast<unsigned long long>(c.round_trips.load()),
                 static_cast<unsigned long long>(c.posted.load()));
    std::fprintf(stderr, "  %-36s %12s %12s\n", "operation", "round trips", "async");
    for (auto& [sync, i] : rows)
        std::fprintf(stderr, "  %-36s %12llu %12llu\n", std::string(op_name(static_cast<op>(i))).c_str(),
                     static_cast<unsigned long long>(sync),
                     static_cast<unsigned long long>(c.async_by_op[i].load()));
}
}  // namespace

call_counters& counters() {
    static call_counters* c = [] {
        auto* p = new call_counters();  // never destroyed: calls made from exit handlers still count
        const char* v = std::getenv("VCUDA_CALL_STATS");
        if (v && *v && std::string_view(v) != "0") {
            p->by_op = true;
            std::atexit(print_call_stats);
        }
        return p;
    }();
    return *c;
}

int lane::post(const call_request& rq) {
    std::lock_guard use(use_mu_);
    return post_held(rq);
}

int lane::call(const call_request& rq, call_reply& rp) {
    std::lock_guard use(use_mu_);
    return call_held(rq, rp);
}

int lane::post_held(const call_request& rq) {
    if (session_.lost()) return connection_lost_result;
    if (unacked_.size() > unacked_limit) {  // this one waits, and its reply lets the kept frames go
        call_reply rp;
        return call_held(rq, rp);
    }
    auto& c = counters();
    c.posted.fetch_add(1, std::memory_order_relaxed);
    if (c.by_op)
        c.async_by_op[static_cast<uint32_t>(rq.operation) % op_id_limit].fetch_add(1,
                                                                                   std::memory_order_relaxed);
    if (!send(build(rq, true), false)) return lost(failure_);
    if (rq.after_send) (*rq.after_send)();
    return 0;
}

int lane::call_held(const call_request& rq, call_reply& rp) {
    if (session_.lost()) return connection_lost_result;
    auto& c = counters();
    c.round_trips.fetch_add(1, std::memory_order_relaxed);
    if (c.by_op)
        c.sync_by_op[static_cast<uint32_t>(rq.operation) % op_id_limit].fetch_add(1,
                                                                                  std::memory_order_relaxed);
    const outgoing_frame f = build(rq, false);
    if (!send(f, true, rq.pass_fd)) return lost(failure_);
    if (rq.after_send) (*rq.after_send)();
    payload_sink sink;
    if (rp.payload_dst) {
        sink = [&](const frame_header& h, const std::vector<std::byte>&) -> std::byte* {
            return h.payload_len == rp.payload_cap ? rp.payload_dst : nullptr;
        };
    }
    // What the server the session moved from still owed this lane: an earlier posted call's failure.
    int owed = 0;
    std::string owed_detail;
    transport_result<frame> in = unexpected{transport_error{}};
    for (;;) {
        // No deadline on the reply itself: a synchronize may legitimately wait for a long kernel. A vanished
        // server still ends the wait (connection reset, or TCP keepalive for a dead host).
        in = fs_.receive(never, std::chrono::seconds(60), sink);
        if (!in) return lost(in.error());
        if (in->kind() != frame_kind::reply) break;
        auto* r = root_of<wire::Reply>(*in);
        if (!r->moved_to()) break;
        if (auto* printed = r->device_output(); printed && printed->size())
            std::fwrite(printed->data(), 1, printed->size(), stdout);
        if (r->result() != 0 && owed == 0) {
            owed = r->result();
            owed_detail = r->detail() ? r->detail()->str() : std::string();
        }
        // A striped copy's chunks went to the old server: its caller copies again (moved_retry_result).
        if (!follow(r->moved_to()->str(), r->ran_through(), rq.uses_bulk ? nullptr : &f))
            return connection_lost_result;
        if (rq.uses_bulk) return moved_retry_result;
    }
    if (in->kind() == frame_kind::error) {
        auto* e = root_of<wire::Error>(*in);
        session_.mark_lost("server refused a call: " +
                           (e->message() ? e->message()->str() : std::string("?")));
        return connection_lost_result;
    }
    if (in->kind() != frame_kind::reply || in->header.sequence != sequence_) {
        session_.mark_lost("reply out of order from the server");
        return connection_lost_result;
    }
    unacked_.clear();  // the server ran every frame this lane sent before this one
    auto* r = root_of<wire::Reply>(*in);
    rp.result = r->result();
    if (rp.result == 0 && owed != 0) {
        rp.result = owed;
        rp.detail = owed_detail;
    }
    rp.fd = fs_.raw().take_fd();
    rp.outs.clear();
    if (r->outs()) rp.outs.assign(r->outs()->begin(), r->outs()->end());
    rp.blobs.clear();
    if (r->blobs())
        for (auto* b : *r->blobs()) {
            auto* bytes = b->bytes();
            rp.blobs.emplace_back(
                bytes ? reinterpret_cast<const std::byte*>(bytes->data()) : nullptr,
                bytes ? reinterpret_cast<const std::byte*>(bytes->data()) + bytes->size() : nullptr);
        }
    if (owed == 0 || rp.result != owed) rp.detail = r->detail() ? r->detail()->str() : std::string();
    // What kernels printed, flushed by the driver on the server during this lane's calls: into the process's
    // stdout as the driver would have written it (the application's own buffering and order apply).
    if (auto* printed = r->device_output(); printed && printed->size())
        std::fwrite(printed->data(), 1, printed->size(), stdout);
    // Kept when the caller gave no buffer, or when the reply's payload is not what its buffer received (the
    // caller checks sizes; nothing was written to its buffer).
    if (!rp.payload_dst || (in->header.payload_len != rp.payload_cap && in->header.payload_len != 0))
        rp.payload = std::move(in->payload);
    if (rp.result != 0 && !rp.detail.empty())
        VCUDA_LOG_DEBUG("{}: server says: {}", op_name(rq.operation), rp.detail);
    return rp.result;
}

// ---------------------------------------------------------------- session

namespace {
std::atomic<bool> disconnect_expected{false};
}  // namespace

void session::expect_disconnect() { disconnect_expected.store(true); }

void session::mark_lost(const std::string& why) {
    if (lost_.exchange(true)) return;
    if (disconnect_expected.load()) {  // the lease went back at exit: the servers end its sessions
        VCUDA_LOG_DEBUG("the session at {} ended after the lease was handed back ({})", address_, why);
        return;
    }
    VCUDA_LOG_ERROR(
        "lost the connection to vcuda-server at {} ({}); every CUDA call now fails with "
        "CUDA_ERROR_DEVICE_UNAVAILABLE",
        address_, why);
}

bool session::moved(const std::string& to) {
    auto ep = endpoint::parse(to);
    if (!ep) return false;
    std::lock_guard lock(endpoint_mu_);
    if (address_ != to) {
        VCUDA_LOG_INFO("the session moved from vcuda-server at {} to {}", address_, to);
        endpoint_ = *ep;
        address_ = to;
        local_ = endpoint_.type == endpoint::kind::unix_socket;
        std::lock_guard b(bulk_mu_);
        if (bulk_) bulk_->close("the session moved");
        bulk_.reset();
    }
    return true;
}

std::unique_ptr<lane> session::connect_lane(uint32_t number, std::string& why) {
    auto fs = connect_stream(number, why);
    if (!fs) return nullptr;
    return std::make_unique<lane>(*this, std::move(*fs), number);
}

std::optional<frame_stream> session::connect_stream(uint32_t number, std::string& why) {
    endpoint ep;
    std::string where;
    {
        std::lock_guard lock(endpoint_mu_);
        ep = endpoint_;
        where = address_;
    }
    auto s = stream::connect(ep, timeout_);
    if (!s) {
        why = "cannot connect to vcuda-server at " + where + ": " + s.error().message;
        return std::nullopt;
    }
    frame_stream fs(std::move(*s));
    flatbuffers::FlatBufferBuilder b(256);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    // Shared-memory rings unless VCUDA_SHM=0 (frames then stay on the Unix socket).
    const bool want_rings = fs.raw().is_local() && env_switch_on("VCUDA_SHM");
    b.Finish(wire::CreateHello(
        b, protocol_version, features::all | features::bulk | (want_rings ? features::shm_rings : 0),
        b.CreateString(token_), id_, number, static_cast<uint32_t>(getpid()), b.CreateString(host), 0, tag_,
        0, id_ == 0 ? 0 : b.CreateVector(reinterpret_cast<const uint8_t*>(key_.data()), key_.size())));
    if (auto r = fs.send(make_frame(frame_kind::hello, b, 0, number), after(timeout_)); !r) {
        why = "sending HELLO to " + where + " failed: " + r.error().message;
        return std::nullopt;
    }
    // A new session's reply must come within the connect timeout (a wrong address fails fast). A lane that
    // joins the session waits as its calls do: the server may be taking it while the session is paused (a
    // worker process suspending it, a long move) for longer than that.
    auto in = fs.receive(id_ == 0 ? after(timeout_) : never, timeout_);
    if (!in) {
        why = "no HELLO reply from " + where + ": " + in.error().message;
        return std::nullopt;
    }
    if (in->kind() == frame_kind::error) {
        auto* e = root_of<wire::Error>(*in);
        why = "vcuda-server at " + where +
              " refused the session: " + (e->message() ? e->message()->str() : "?");
        return std::nullopt;
    }
    if (in->kind() != frame_kind::hello_reply) {
        why = "unexpected answer to HELLO from " + where;
        return std::nullopt;
    }
    auto* hr = root_of<wire::HelloReply>(*in);
    if (hr->features() & features::shm_rings) {
        int fd = fs.raw().take_fd();
        auto rings =
            fd >= 0 ? shm_rings::open(fd) : unexpected{std::string("no descriptor came with the reply")};
        if (fd >= 0) close(fd);
        if (!rings) {
            why = "shared-memory rings offered by " + where + " unusable: " + rings.error();
            return std::nullopt;
        }
        fs.raw().attach_rings(std::move(*rings), default_spin());
    } else {
        fs.raw().set_spin(default_spin());
    }
    if (id_ == 0) {
        id_ = hr->session_id();
        key_ = hr->session_key() ? std::string(reinterpret_cast<const char*>(hr->session_key()->data()),
                                               hr->session_key()->size())
                                 : std::string();
        bulk_cap_ = hr->features() & features::bulk ? hr->bulk_streams() : 0;
        pid_ = getpid();
    }
    return fs;
}

std::unique_ptr<session> session::open(const std::string& address, std::chrono::milliseconds timeout,
                                       const std::string& token, uint32_t tag, std::string& why) {
    auto ep = endpoint::parse(address);
    if (!ep) {
        why = "VCUDA_SERVER='" + address + "': " + ep.error();
        return nullptr;
    }
    auto s = std::unique_ptr<session>(new session());
    s->endpoint_ = *ep;
    s->address_ = address;
    s->local_ = ep->type == endpoint::kind::unix_socket;
    s->token_ = token;
    s->timeout_ = timeout;
    s->tag_ = tag % max_sessions;
    auto first = s->connect_lane(s->next_lane_++, why);
    if (!first) return nullptr;

    call_request rq;
    rq.operation = op::session_info;
    call_reply rp;
    if (int rc = first->call(rq, rp); rc != 0) {
        why =
            "vcuda-server at " + address + " did not describe its devices (error " + std::to_string(rc) + ")";
        return nullptr;
    }
    size_t n = rp.outs.empty() ? 0 : rp.outs[0];
    if (rp.outs.size() != 1 + 2 * n || rp.blobs.size() != 3 * n) {
        why = "malformed device list from " + address;
        return nullptr;
    }
    for (size_t i = 0; i < n; ++i) {
        server_device d;
        d.name.assign(reinterpret_cast<const char*>(rp.blobs[3 * i].data()), rp.blobs[3 * i].size());
        if (rp.blobs[3 * i + 1].size() == 16) std::memcpy(d.uuid.data(), rp.blobs[3 * i + 1].data(), 16);
        auto& a = rp.blobs[3 * i + 2];
        d.attributes.resize(a.size() / sizeof(int));
        std::memcpy(d.attributes.data(), a.data(), d.attributes.size() * sizeof(int));
        d.server_index = static_cast<int>(rp.outs[1 + 2 * i]);
        d.total_memory = rp.outs[2 + 2 * i];
        d.owner = s.get();
        s->devices_.push_back(std::move(d));
    }
    adopt_lane(std::move(first), s->tag_);
    return s;
}

std::shared_ptr<bulk_link> session::bulk() {
    static const unsigned wanted = [] {  // VCUDA_BULK_STREAMS, default 6 (H100 host, loopback: 4 gave 8-11
                                         // GB/s, 6 gave 12-13.5, 8 no more)
        const char* v = std::getenv("VCUDA_BULK_STREAMS");
        return v && *v ? static_cast<unsigned>(std::min<unsigned long>(std::strtoul(v, nullptr, 10), 1024))
                       : 6u;
    }();
    const unsigned count = std::min(wanted, bulk_cap_);
    endpoint ep;
    {
        std::lock_guard lock(endpoint_mu_);
        ep = endpoint_;
    }
    if (count == 0 || ep.type != endpoint::kind::tcp || lost_ || getpid() != pid_) return nullptr;
    std::lock_guard lock(bulk_mu_);
    if (bulk_ && !bulk_->broken()) return bulk_;
    if (bulk_) {
        bulk_.reset();
        if (++bulk_failures_ == 3) {
            bulk_off_ = true;
            VCUDA_LOG_WARN("striped copies to {} failed three times: large copies now travel on their lane",
                           address_);
        }
    }
    if (bulk_off_) return nullptr;
    std::string why;
    bulk_ = bulk_link::open(ep, id_, key_, ++bulk_sets_, count, timeout_, why);
    if (!bulk_) {
        bulk_off_ = true;
        VCUDA_LOG_WARN("no striped copies to {} ({}): large copies travel on their lane", address_, why);
    }
    return bulk_;
}

lane* session::this_thread_lane() {
    if (lane* l = tls_lanes[tag_]) return l;
    if (lost_) return nullptr;
    std::string why;
    auto l = connect_lane(next_lane_++, why);
    if (!l) {
        mark_lost(why);
        return nullptr;
    }
    adopt_lane(std::move(l), tag_);
    return tls_lanes[tag_];
}

}  // namespace vcuda::client
