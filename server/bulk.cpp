#include "server/bulk.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "common/log.hpp"
#include "common/wire.hpp"
#include "ops.hpp"
#include "server/staging.hpp"

namespace vcuda::server {

struct bulk_hub::buffer {
    std::byte* data = nullptr;
    connection* owner = nullptr;
    enum class use { idle, filling, ready, copying, queued, sending } state = use::idle;
    bool pending = false;  // `done` was recorded after a copy that may still read or write the buffer
    bool waiting = false;  // a thread waits for `done` without holding mu_
    CUevent done = nullptr;
    CUcontext done_ctx = nullptr;
    CUcontext pinned_ctx = nullptr;  // the context it is page-locked in; null: pageable
    bool pin_failed = false;
    bool send = false;                           // in the connection's send pool
    uint64_t transfer = 0, offset = 0, len = 0;  // the chunk it holds (ready, queued, sending)
    outbound* out = nullptr;                     // queued, sending: the copy it belongs to
};

struct bulk_hub::connection {
    uint32_t set = 0;
    uint64_t number = 0;  // within the session, for logs
    frame_stream* fs = nullptr;
    bool live = true;
    bool starved = false;  // its receiver waits for a free buffer
    std::vector<std::unique_ptr<buffer>> buffers;
    std::deque<buffer*> outbox;  // device-to-host chunks to write, in order
    uint64_t chunks_in = 0, chunks_out = 0;
};

struct bulk_hub::inbound {
    uint32_t set = 0;
    bool claimed = false;  // its call has come: n, chunk and total are known
    uint64_t n = 0, chunk = 0, total = 0, handled = 0;
    std::vector<bool> seen;
    std::deque<buffer*> ready;  // chunks received and not yet copied
    std::string error;          // the first chunk that did not fit
    clock::time_point last = clock::now();
};

struct bulk_hub::outbound {
    size_t outstanding = 0;  // chunks queued or being written
    CUresult rc = CUDA_SUCCESS;
    std::string detail;
};

namespace {

// Makes `want` current on this thread for a few calls (bulk threads have no context of their own; lanes get
// theirs back).
class context_scope {
  public:
    context_scope(const driver_table& d, CUcontext want) : d_(d) {
        d_.cuCtxGetCurrent(&prev_);
        if (want && want != prev_) switched_ = d_.cuCtxSetCurrent(want) == CUDA_SUCCESS;
    }
    ~context_scope() {
        if (switched_) d_.cuCtxSetCurrent(prev_);
    }
    context_scope(const context_scope&) = delete;
    context_scope& operator=(const context_scope&) = delete;

  private:
    const driver_table& d_;
    CUcontext prev_ = nullptr;
    bool switched_ = false;
};

constexpr size_t finished_kept = 256;

std::string lost_during_copy(const std::string& why) {
    return "a bulk connection of this session was lost during the copy (" + why + ")";
}

}  // namespace

bulk_hub::bulk_hub(const driver_table& drv, uint64_t session_id) : drv_(drv), session_(session_id) {}

bulk_hub::~bulk_hub() {
    // Connections release their buffers when they end; whatever is left (none in a clean end) goes here.
    for (auto& c : connections_)
        for (auto& b : c->buffers) destroy(b.get());
}

// ---------------------------------------------------------------- connections

bulk_hub::connection* bulk_hub::join(uint32_t set, uint32_t per_set, frame_stream& fs, std::string& why) {
    std::lock_guard lock(mu_);
    if (closed_) {
        why = "the session is ending";
        return nullptr;
    }
    auto& st = sets_[set];
    if (st.broken) {
        why = "bulk set " + std::to_string(set) + " was closed (" + st.why + "); a new set is needed";
        return nullptr;
    }
    if (st.joined >= static_cast<int>(per_set)) {
        why = "this server takes at most " + std::to_string(per_set) +
              " bulk connections per set (--bulk-streams)";
        return nullptr;
    }
    // The client uses its newest set only: older ones are closed, and forgotten once their connections left.
    for (auto& [other, s] : sets_)
        if (other != set && !s.broken) break_set(other, "replaced by bulk set " + std::to_string(set));
    std::erase_if(sets_, [&](auto& kv) { return kv.first != set && kv.second.live == 0; });
    ++st.joined;
    ++st.live;
    auto c = std::make_unique<connection>();
    c->set = set;
    c->fs = &fs;
    static std::atomic<uint64_t> numbers{0};
    c->number = ++numbers;
    connections_.push_back(std::move(c));
    return connections_.back().get();
}

void bulk_hub::serve(connection* c) {
    frame_limits limits;
    limits.max_payload = buffer_size;  // a larger chunk fails the header check: the connection ends
    limits.max_meta = 4096;
    c->fs->set_limits(limits);
    std::thread sender([this, c] { send_loop(c); });
    frame f;
    buffer* target = nullptr;
    const payload_sink sink = [&](const frame_header& h, const std::vector<std::byte>&) -> std::byte* {
        return h.kind == static_cast<uint16_t>(frame_kind::call) ? target->data : nullptr;
    };
    std::string why = "the client closed it";
    for (;;) {
        {
            std::unique_lock lock(mu_);
            target = nullptr;  // the last chunk's buffer is the transfer's now
            while (c->live && !(target = take_free(c, false, lock))) {
                c->starved = true;
                cv_.wait(lock);
            }
            c->starved = false;
            if (!c->live) {
                if (target) target->state = buffer::use::idle;
                why = "closed by the server";
                break;
            }
            target->state = buffer::use::filling;
        }
        auto r = c->fs->receive_into(f, never, std::chrono::seconds(60), sink);
        wire_errc refused = wire_errc::ok;
        std::string refusal;
        if (!r) {
            if (r.error().code == transport_errc::protocol) refused = wire_errc::verify_failed;
            refusal = why = std::string(to_string(r.error().code)) + ": " + r.error().message;
        } else if (f.kind() == frame_kind::goodbye) {
            why = "the client said goodbye";
        } else if (f.kind() != frame_kind::call) {
            refused = wire_errc::unexpected_kind;
            refusal = "a bulk connection carries only bulk_chunk CALLs";
        } else {
            auto* call = root_of<wire::Call>(f);
            if (call->op() != static_cast<uint32_t>(op::bulk_chunk) || !call->args() ||
                call->args()->size() != 2 || f.header.payload_len == 0) {
                refused = wire_errc::bad_arguments;
                refusal =
                    "a bulk connection carries only bulk_chunk CALLs {transfer, offset} with their bytes";
            } else if (deliver(c, target, call->args()->Get(0), call->args()->Get(1), f.header.payload_len,
                               refusal)) {
                continue;
            } else {
                refused = wire_errc::bad_arguments;
            }
        }
        {
            std::lock_guard lock(mu_);
            target->state = buffer::use::idle;
            cv_.notify_all();
        }
        if (refused != wire_errc::ok) {
            VCUDA_LOG_WARN("session {}: bulk connection {} refused a frame: {}", session_, c->number,
                           refusal);
            send_wire_error(*c->fs, refused, refusal);
            why = refusal;
        }
        break;
    }
    {
        std::lock_guard lock(mu_);
        break_set(c->set, "bulk connection " + std::to_string(c->number) + " ended: " + why);
    }
    sender.join();
    leave(c, why);
}

bulk_hub::buffer* bulk_hub::take_free(connection* c, bool send, std::unique_lock<std::mutex>& lock) {
    // A buffer no copy uses any more.
    size_t pool = 0;
    for (auto& b : c->buffers) {
        if (b->send != send) continue;
        ++pool;
        if (b->state != buffer::use::idle || b->waiting) continue;
        if (b->pending) {
            context_scope cs(drv_, b->done_ctx);
            if (drv_.cuEventQuery(b->done) == CUDA_ERROR_NOT_READY) continue;
        }
        b->pending = false;
        return b.get();
    }
    if (pool < (send ? send_buffers : receive_buffers)) {
        void* p = mmap(nullptr, buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            auto b = std::make_unique<buffer>();
            b->data = static_cast<std::byte*>(p);
            b->owner = c;
            b->send = send;
            c->buffers.push_back(std::move(b));
            return c->buffers.back().get();
        }
        VCUDA_LOG_WARN("session {}: no memory for a bulk staging buffer", session_);
    }
    // All in use: wait for the oldest copy still under way in one.
    for (auto& b : c->buffers) {
        if (b->send != send || b->state != buffer::use::idle || !b->pending || b->waiting) continue;
        b->waiting = true;
        CUevent done = b->done;
        CUcontext ctx = b->done_ctx;
        lock.unlock();
        {
            context_scope cs(drv_, ctx);
            drv_.cuEventSynchronize(done);
        }
        lock.lock();
        b->waiting = false;
        b->pending = false;
        cv_.notify_all();
        return b.get();
    }
    return nullptr;
}

namespace {
// Why a chunk cannot be part of a copy of n bytes in chunks of `chunk` (empty: it fits).
std::string misfit(uint64_t n, uint64_t chunk, const std::vector<bool>& seen, uint64_t offset, uint64_t len) {
    auto at = "chunk at offset " + std::to_string(offset) + " (" + std::to_string(len) + " bytes)";
    if (offset >= n || offset % chunk != 0)
        return at + " lies outside the copy of " + std::to_string(n) + " bytes in chunks of " +
               std::to_string(chunk);
    if (len != std::min(chunk, n - offset)) return at + " is not the size its place in the copy needs";
    if (seen[offset / chunk]) return at + " came twice";
    return {};
}
}  // namespace

bool bulk_hub::deliver(connection* c, buffer* b, uint64_t transfer, uint64_t offset, uint64_t len,
                       std::string& refusal) {
    std::lock_guard lock(mu_);
    ++c->chunks_in;
    if (!c->live) {  // its set broke while the chunk came: dropped with the set's others
        b->state = buffer::use::idle;
        cv_.notify_all();
        return true;
    }
    if (transfer == 0 || recently_finished(transfer)) {
        refusal = "a chunk for transfer " + std::to_string(transfer) + ", which is not under way";
        return false;
    }
    auto& slot = inbound_[transfer];
    if (!slot) slot = std::make_unique<inbound>();
    inbound& t = *slot;
    b->transfer = transfer;
    b->offset = offset;
    b->len = len;
    if (t.claimed) {
        std::string m = c->set != t.set ? "a chunk came on a connection of another bulk set"
                                        : misfit(t.n, t.chunk, t.seen, offset, len);
        if (!m.empty()) {  // the copy fails with this reason; the connection goes on
            b->state = buffer::use::idle;
            ++t.handled;
            if (t.error.empty()) t.error = m;
            cv_.notify_all();
            return true;
        }
        t.seen[offset / t.chunk] = true;
    }
    b->state = buffer::use::ready;
    t.ready.push_back(b);
    t.last = clock::now();
    cv_.notify_all();
    return true;
}

void bulk_hub::send_loop(connection* c) {
    flatbuffers::FlatBufferBuilder fbb(128);
    uint64_t sequence = 0;
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [&] { return !c->live || !c->outbox.empty(); });
        if (!c->live) return;  // break_set dropped what was queued
        buffer* b = c->outbox.front();
        c->outbox.pop_front();
        b->state = buffer::use::sending;
        const bool wait = b->pending;
        b->waiting = wait;
        CUevent done = b->done;
        CUcontext ctx = b->done_ctx;
        lock.unlock();
        CUresult copied = CUDA_SUCCESS;
        if (wait) {
            context_scope cs(drv_, ctx);
            copied = drv_.cuEventSynchronize(done);
        }
        transport_result<void> written;
        if (copied == CUDA_SUCCESS) {
            fbb.Clear();
            const uint64_t args[2] = {b->transfer, b->offset};
            fbb.Finish(
                wire::CreateCall(fbb, static_cast<uint32_t>(op::bulk_chunk), -1, fbb.CreateVector(args, 2)));
            written = c->fs->send(
                make_frame(frame_kind::call, fbb, ++sequence, 0, frame_flags::no_reply, {b->data, b->len}),
                after(std::chrono::seconds(60)));
        }
        lock.lock();
        b->waiting = false;
        b->pending = false;
        b->state = buffer::use::idle;
        outbound& t = *b->out;
        b->out = nullptr;
        ++c->chunks_out;
        if (copied != CUDA_SUCCESS && t.rc == CUDA_SUCCESS) {
            t.rc = copied;
            t.detail = "the device-to-host copy failed";
        } else if (copied == CUDA_SUCCESS && !written) {
            std::string why = "writing a chunk failed: " + written.error().message;
            if (t.rc == CUDA_SUCCESS) {
                t.rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
                t.detail = lost_during_copy(why);
            }
            break_set(c->set, why);
        }
        --t.outstanding;
        cv_.notify_all();
    }
}

void bulk_hub::break_set(uint32_t set, const std::string& why) {
    auto it = sets_.find(set);
    if (it == sets_.end() || it->second.broken) return;
    it->second.broken = true;
    it->second.why = why;
    VCUDA_LOG_DEBUG("session {}: bulk set {} closed: {}", session_, set, why);
    for (auto& c : connections_) {
        if (c->set != set) continue;
        c->live = false;
        c->fs->shutdown();
        for (buffer* b : c->outbox) {
            b->state = buffer::use::idle;
            if (b->out->rc == CUDA_SUCCESS) {
                b->out->rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
                b->out->detail = lost_during_copy(why);
            }
            --b->out->outstanding;
            b->out = nullptr;
        }
        c->outbox.clear();
    }
    // Chunks of this set waiting for their copy are dropped; the copies themselves see the set broken.
    for (auto t = inbound_.begin(); t != inbound_.end();) {
        std::erase_if(t->second->ready, [&](buffer* b) {
            if (b->owner->set != set) return false;
            b->state = buffer::use::idle;
            return true;
        });
        if (!t->second->claimed && t->second->ready.empty())
            t = inbound_.erase(t);
        else
            ++t;
    }
    cv_.notify_all();
}

void bulk_hub::leave(connection* c, const std::string& why) {
    std::vector<std::unique_ptr<buffer>> mine;
    {
        std::unique_lock lock(mu_);
        // A lane copying into or out of one of its buffers gives it back when that copy is issued.
        cv_.wait(lock, [&] {
            return std::all_of(c->buffers.begin(), c->buffers.end(),
                               [](auto& b) { return b->state == buffer::use::idle && !b->waiting; });
        });
        VCUDA_LOG_DEBUG(
            "session {}: bulk connection {} (set {}) ended ({}): {} chunks in, {} out, {} staging buffers",
            session_, c->number, c->set, why, c->chunks_in, c->chunks_out, c->buffers.size());
        mine = std::move(c->buffers);
        // A set whose connections all left stays known (broken, with why) until a newer set joins: a copy
        // that names it still learns why it failed.
        if (auto st = sets_.find(c->set); st != sets_.end()) --st->second.live;
        std::erase_if(connections_, [&](auto& p) { return p.get() == c; });
        cv_.notify_all();
    }
    for (auto& b : mine) destroy(b.get());
}

void bulk_hub::destroy(buffer* b) {
    if (b->done) {
        context_scope cs(drv_, b->done_ctx);
        if (b->pending) drv_.cuEventSynchronize(b->done);
        drv_.cuEventDestroy_v2(b->done);
    }
    if (b->pinned_ctx) {
        context_scope cs(drv_, b->pinned_ctx);
        drv_.cuMemHostUnregister(b->data);
    }
    munmap(b->data, buffer_size);
}

std::string bulk_hub::unusable(uint32_t set) const {
    auto st = sets_.find(set);
    if (st == sets_.end()) return "bulk set " + std::to_string(set) + " is not connected";
    return st->second.broken ? lost_during_copy(st->second.why) : std::string();
}

bool bulk_hub::recently_finished(uint64_t transfer) const {
    return std::find(finished_.begin(), finished_.end(), transfer) != finished_.end();
}

void bulk_hub::finished(uint64_t transfer) {
    finished_.push_back(transfer);
    if (finished_.size() > finished_kept) finished_.pop_front();
}

// ---------------------------------------------------------------- lanes

void bulk_hub::pin(buffer* b) {
    if (b->pinned_ctx || b->pin_failed || !drv_.cuMemHostRegister_v2) return;
    CUcontext ctx = nullptr;
    drv_.cuCtxGetCurrent(&ctx);
    if (ctx && drv_.cuMemHostRegister_v2(b->data, buffer_size, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS)
        b->pinned_ctx = ctx;
    else
        b->pin_failed = true;  // copies from pageable memory still work, staged by the driver
}

bool bulk_hub::after_copy(buffer* b, CUstream s) {
    b->pending = record_in_current_context(drv_, b->done, b->done_ctx, s) == CUDA_SUCCESS;
    return b->pending;
}

CUresult bulk_hub::to_device(uint32_t set, uint64_t transfer, CUdeviceptr dst, uint64_t n, uint64_t chunk,
                             CUstream s, CUresult rc, std::string& detail) {
    std::unique_lock lock(mu_);
    if (detail = unusable(set); !detail.empty())
        return CUDA_ERROR_DEVICE_UNAVAILABLE;  // its chunks went with it
    auto found = inbound_.find(transfer);
    if (recently_finished(transfer) || (found != inbound_.end() && found->second->claimed)) {
        detail = "transfer " + std::to_string(transfer) + " was already used";
        break_set(set, detail);  // its chunks cannot be told apart from the first use's
        return CUDA_ERROR_INVALID_VALUE;
    }
    auto& slot = inbound_[transfer];
    if (!slot) slot = std::make_unique<inbound>();
    inbound& t = *slot;
    t.claimed = true;
    t.set = set;
    t.n = n;
    t.chunk = chunk;
    t.total = (n + chunk - 1) / chunk;
    t.seen.assign(t.total, false);
    t.last = clock::now();
    std::deque<buffer*> early;
    early.swap(t.ready);
    for (buffer* b : early) {
        std::string m = b->owner->set != set ? "a chunk came on a connection of another bulk set"
                                             : misfit(n, chunk, t.seen, b->offset, b->len);
        if (m.empty()) {
            t.seen[b->offset / chunk] = true;
            t.ready.push_back(b);
            continue;
        }
        b->state = buffer::use::idle;
        ++t.handled;
        if (t.error.empty()) t.error = m;
    }
    cv_.notify_all();
    // Every chunk is taken, copied or not, so that none is left holding a buffer.
    auto busy_until = clock::now();  // the last time the set's receivers were waiting for buffers
    while (t.handled < t.total) {
        if (std::string why = unusable(set); !why.empty()) {
            if (rc == CUDA_SUCCESS) {
                rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
                detail = std::move(why);
            }
            break;
        }
        if (t.ready.empty()) {
            auto now = clock::now();
            if (std::any_of(connections_.begin(), connections_.end(),
                            [&](auto& c) { return c->set == set && c->starved; }))
                busy_until = now;
            if (now - std::max(t.last, busy_until) > stall_limit) {
                if (rc == CUDA_SUCCESS) {
                    rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
                    detail = "no chunk of the copy came for " + std::to_string(stall_limit.count()) + " s";
                }
                break_set(set, "chunks of transfer " + std::to_string(transfer) + " stopped coming");
                break;
            }
            cv_.wait_for(lock, std::chrono::seconds(1));
            continue;
        }
        buffer* b = t.ready.front();
        t.ready.pop_front();
        b->state = buffer::use::copying;
        bool waited = false;
        if (rc == CUDA_SUCCESS) {
            pin(b);
            lock.unlock();
            rc = drv_.cuMemcpyHtoDAsync_v2(dst + b->offset, b->data, b->len, s);
            lock.lock();
            if (rc == CUDA_SUCCESS && !after_copy(b, s)) waited = true;
        }
        if (waited) {  // no event to look at later: wait for the copy now
            lock.unlock();
            drv_.cuStreamSynchronize(s);
            lock.lock();
        }
        b->state = buffer::use::idle;
        ++t.handled;
        cv_.notify_all();
    }
    for (buffer* b : t.ready) b->state = buffer::use::idle;
    t.ready.clear();
    if (rc == CUDA_SUCCESS && !t.error.empty()) {
        rc = CUDA_ERROR_INVALID_VALUE;
        detail = t.error;
    }
    finished(transfer);
    inbound_.erase(transfer);
    cv_.notify_all();
    return rc;
}

CUresult bulk_hub::to_host(uint32_t set, uint64_t transfer, CUdeviceptr src, uint64_t n, uint64_t chunk,
                           CUstream s, std::string& detail) {
    std::unique_lock lock(mu_);
    outbound t;
    CUresult rc = CUDA_SUCCESS;
    size_t turn = 0;
    for (uint64_t off = 0; off < n;) {
        if (detail = unusable(set); !detail.empty()) {
            rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
            break;
        }
        // The set's connections in turn, each with a free buffer: the chunks spread over them.
        buffer* b = nullptr;
        for (size_t i = 0; i < connections_.size() && !b; ++i) {
            size_t k = (turn + i) % connections_.size();
            connection* c = connections_[k].get();
            if (c->set != set || !c->live) continue;
            b = take_free(c, true, lock);  // when it returns one after waiting unlocked, the loop ends here
            if (b) turn = k + 1;
        }
        if (!b) {
            cv_.wait_for(lock, std::chrono::seconds(1));
            continue;
        }
        b->state = buffer::use::copying;
        const uint64_t len = std::min(chunk, n - off);
        pin(b);
        lock.unlock();
        CUresult r = drv_.cuMemcpyDtoHAsync_v2(b->data, src + off, len, s);
        lock.lock();
        if (r == CUDA_SUCCESS && !after_copy(b, s)) {
            lock.unlock();
            r = drv_.cuStreamSynchronize(s);
            lock.lock();
        }
        if (r != CUDA_SUCCESS || !b->owner->live) {
            b->state = buffer::use::idle;
            cv_.notify_all();
            if (r == CUDA_SUCCESS) continue;  // the set broke: said above
            rc = r;
            break;
        }
        b->state = buffer::use::queued;
        b->transfer = transfer;
        b->offset = off;
        b->len = len;
        b->out = &t;
        ++t.outstanding;
        b->owner->outbox.push_back(b);
        cv_.notify_all();
        off += len;
    }
    // Every chunk queued is written, or dropped with its set, before the reply: the client counts on them.
    cv_.wait(lock, [&] { return t.outstanding == 0; });
    if (rc == CUDA_SUCCESS && t.rc != CUDA_SUCCESS) {
        rc = t.rc;
        detail = t.detail;
    }
    return rc;
}

void bulk_hub::abandon(uint32_t set, const std::string& why) {
    std::lock_guard lock(mu_);
    break_set(set, why);
}

// ---------------------------------------------------------------- the session

void bulk_hub::close(const std::string& why) {
    std::lock_guard lock(mu_);
    closed_ = true;
    std::vector<uint32_t> sets;
    for (auto& [set, st] : sets_) sets.push_back(set);
    for (uint32_t set : sets) break_set(set, why);
    cv_.notify_all();
}

void bulk_hub::forget_context(CUcontext ctx) {
    std::unique_lock lock(mu_);
    auto all = [&](auto&& f) {
        for (auto& c : connections_)
            for (auto& b : c->buffers) f(*b);
    };
    // A thread waiting for one of its events is done at once: the context was synchronized.
    cv_.wait(lock, [&] {
        bool any = false;
        all([&](buffer& b) { any = any || (b.waiting && b.done_ctx == ctx); });
        return !any;
    });
    all([&](buffer& b) {
        if (b.done && b.done_ctx == ctx) {
            drv_.cuEventDestroy_v2(b.done);
            b.done = nullptr;
            b.done_ctx = nullptr;
            b.pending = false;
        }
        // Every buffer, also one that holds a chunk still: the context goes, and a buffer left pinned in it
        // would be unregistered later under a destroyed context (the driver crashed so on the H200, when a
        // moved session's bulk connections closed). The GPU is idle; a later copy pins it again.
        if (b.pinned_ctx == ctx) {
            drv_.cuMemHostUnregister(b.data);
            b.pinned_ctx = nullptr;
        }
    });
}

}  // namespace vcuda::server
