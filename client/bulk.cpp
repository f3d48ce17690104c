#include "client/bulk.hpp"

#include <unistd.h>

#include <algorithm>

#include "common/log.hpp"
#include "common/wire.hpp"
#include "ops.hpp"

namespace vcuda::client {

struct bulk_link::connection {
    explicit connection(frame_stream s) : fs(std::move(s)) {}
    frame_stream fs;
    std::thread sender, receiver;
};

namespace {
// A chunk write or read that makes no progress for this long ends the link.
constexpr auto stall_limit = std::chrono::seconds(60);

frame_limits bulk_limits() {
    frame_limits l;
    l.max_payload = bulk_link::max_chunk;
    l.max_meta = 4096;
    return l;
}
}  // namespace

std::shared_ptr<bulk_link> bulk_link::open(const endpoint& ep, uint64_t session_id, const std::string& key,
                                           uint32_t set, unsigned count, std::chrono::milliseconds timeout,
                                           std::string& why) {
    std::shared_ptr<bulk_link> link(new bulk_link(set));
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    for (unsigned i = 0; i < count; ++i) {
        auto s = stream::connect(ep, timeout);
        if (!s) {
            why = "cannot connect: " + s.error().message;
            return nullptr;
        }
        frame_stream fs(std::move(*s));
        flatbuffers::FlatBufferBuilder b(256);
        b.Finish(wire::CreateHello(b, protocol_version, features::all | features::bulk, b.CreateString(""),
                                   session_id, 0, static_cast<uint32_t>(getpid()), b.CreateString(host), 0, 0,
                                   set,
                                   b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size())));
        if (auto r = fs.send(make_frame(frame_kind::hello, b), after(timeout)); !r) {
            why = "sending HELLO failed: " + r.error().message;
            return nullptr;
        }
        // The session is open: its reply may wait for a pause, as a lane's join does (client/remote.cpp).
        auto in = fs.receive(never, timeout);
        if (!in) {
            why = "no HELLO reply: " + in.error().message;
            return nullptr;
        }
        if (in->kind() != frame_kind::hello_reply) {
            auto* e = in->kind() == frame_kind::error ? root_of<wire::Error>(*in) : nullptr;
            why = "the server refused a bulk connection: " +
                  (e && e->message() ? e->message()->str() : std::string("?"));
            return nullptr;
        }
        fs.set_limits(bulk_limits());
        link->connections_.push_back(std::make_unique<connection>(std::move(fs)));
    }
    for (auto& c : link->connections_) {
        c->sender = std::thread([l = link.get(), c = c.get()] { l->send_loop(*c); });
        c->receiver = std::thread([l = link.get(), c = c.get()] { l->receive_loop(*c); });
    }
    VCUDA_LOG_DEBUG("striped copies: {} bulk connections (set {}) to {}", count, set, ep.to_string());
    return link;
}

bulk_link::bulk_link(uint32_t set) : set_(set) {}

bulk_link::~bulk_link() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        for (auto& c : connections_) c->fs.shutdown();
        cv_.notify_all();
    }
    for (auto& c : connections_) {
        if (c->sender.joinable()) c->sender.join();
        if (c->receiver.joinable()) c->receiver.join();
    }
}

bool bulk_link::broken() {
    std::lock_guard lock(mu_);
    return broken_;
}

size_t bulk_link::chunk_for(size_t n) const {
    size_t per = n / (2 * std::max<size_t>(connections_.size(), 1));
    per = (per + min_chunk - 1) / min_chunk * min_chunk;
    return std::clamp(per, min_chunk, max_chunk);
}

void bulk_link::fail(const std::string& why) {
    if (broken_ || stopping_) return;
    broken_ = true;
    VCUDA_LOG_WARN(
        "striped copies: the bulk connections to the server failed ({}); the copy under way fails (or, when "
        "the session is moving to another server, is made again there)",
        why);
    for (auto& c : connections_) c->fs.shutdown();
    for (auto& it : queue_) {
        it.t->failed = true;
        --it.t->outstanding;
    }
    queue_.clear();
    for (auto& [id, t] : downloads_) t->failed = true;
    cv_.notify_all();
}

void bulk_link::close(const std::string& why) {
    std::lock_guard lock(mu_);
    fail(why);
}

// ---------------------------------------------------------------- host to device

void bulk_link::queue(transfer& t) {
    std::lock_guard lock(mu_);
    t.total = (t.n + t.chunk - 1) / t.chunk;
    if (broken_) {
        t.failed = true;
        return;
    }
    for (uint64_t off = 0; off < t.n; off += t.chunk) queue_.push_back({&t, off});
    t.outstanding = t.total;
    cv_.notify_all();
}

bool bulk_link::wait_written(transfer& t) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return t.outstanding == 0; });
    return !t.failed && t.done == t.total;
}

void bulk_link::send_loop(connection& c) {
    flatbuffers::FlatBufferBuilder fbb(128);
    uint64_t sequence = 0;
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [&] { return stopping_ || broken_ || !queue_.empty(); });
        if (stopping_ || broken_) return;
        item it = queue_.front();
        queue_.pop_front();
        transfer& t = *it.t;
        const uint64_t len = std::min(t.chunk, t.n - it.offset);
        lock.unlock();
        fbb.Clear();
        const uint64_t args[2] = {t.id, it.offset};
        fbb.Finish(
            wire::CreateCall(fbb, static_cast<uint32_t>(op::bulk_chunk), -1, fbb.CreateVector(args, 2)));
        auto w = c.fs.send(make_frame(frame_kind::call, fbb, ++sequence, 0, frame_flags::no_reply,
                                      {t.host + it.offset, len}),
                           after(stall_limit));
        lock.lock();
        if (w) {
            ++t.done;
        } else {
            t.failed = true;
            fail("writing a chunk: " + w.error().message);
        }
        --t.outstanding;
        cv_.notify_all();
    }
}

// ---------------------------------------------------------------- device to host

void bulk_link::expect(transfer& t) {
    std::lock_guard lock(mu_);
    t.total = (t.n + t.chunk - 1) / t.chunk;
    t.seen.assign(t.total, false);
    if (broken_)
        t.failed = true;
    else
        downloads_[t.id] = &t;
}

bool bulk_link::finish(transfer& t, bool all) {
    std::unique_lock lock(mu_);
    auto last = clock::now();
    uint64_t done = t.done;
    while (all && !t.failed && t.done < t.total) {
        cv_.wait_for(lock, std::chrono::seconds(1));
        if (t.done != done) {
            done = t.done;
            last = clock::now();
        } else if (clock::now() - last > stall_limit) {
            fail("chunks of a device-to-host copy stopped coming");
        }
    }
    downloads_.erase(t.id);
    cv_.wait(lock, [&] { return t.writers == 0; });  // the caller's buffer is its own again
    return !t.failed && t.done == t.total;
}

void bulk_link::receive_loop(connection& c) {
    frame f;
    std::vector<std::byte> scratch;  // chunks of a copy no longer waited for (its call failed) are read here
    transfer* into = nullptr;
    bool chunk = false;  // the frame is a chunk that fits a copy under way, or one no longer waited for
    const payload_sink sink = [&](const frame_header& h, const std::vector<std::byte>& meta) -> std::byte* {
        if (h.kind != static_cast<uint16_t>(frame_kind::call)) return nullptr;
        auto* call = flatbuffers::GetRoot<wire::Call>(meta.data());
        if (call->op() != static_cast<uint32_t>(op::bulk_chunk) || !call->args() || call->args()->size() != 2)
            return nullptr;
        const uint64_t id = call->args()->Get(0), off = call->args()->Get(1), len = h.payload_len;
        std::lock_guard lock(mu_);
        auto it = downloads_.find(id);
        chunk = true;
        if (it == downloads_.end()) {
            scratch.resize(len);
            return scratch.data();
        }
        transfer& t = *it->second;
        if (off >= t.n || off % t.chunk != 0 || len != std::min(t.chunk, t.n - off) ||
            t.seen[off / t.chunk]) {
            chunk = false;
            return nullptr;
        }
        t.seen[off / t.chunk] = true;
        ++t.writers;
        into = &t;
        return t.host + off;
    };
    for (;;) {
        chunk = false;
        auto r = c.fs.receive_into(f, never, stall_limit, sink);
        std::lock_guard lock(mu_);
        if (into) {
            --into->writers;
            if (r)
                ++into->done;
            else
                into->failed = true;
            into = nullptr;
            cv_.notify_all();
        }
        if (!r) return fail("reading a chunk: " + r.error().message);
        if (f.kind() == frame_kind::error) {
            auto* e = root_of<wire::Error>(f);
            return fail("the server closed a bulk connection: " +
                        (e->message() ? e->message()->str() : std::string("?")));
        }
        if (!chunk) return fail("the server sent a frame that is no chunk of a copy under way");
    }
}

}  // namespace vcuda::client
