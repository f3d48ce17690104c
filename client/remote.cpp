#include "client/remote.hpp"

#include <unistd.h>

#include <cstring>

#include "common/log.hpp"
#include "common/wire.hpp"

namespace vcuda::client {

namespace {
// The calling thread's lane. Plain pointers (trivially destructible) so that calls made after the thread's
// destructors ran — cudart unloads its modules from an exit handler — still find a valid state: a new lane.
thread_local lane* tls_lane = nullptr;
thread_local session* tls_lane_owner = nullptr;
struct lane_closer {
    bool armed = false;
    ~lane_closer() {
        // Lane 0 opened the session and lives as long as the process: the session must outlast the thread
        // that called cuInit (exit handlers still make calls). Other lanes close with their thread.
        if (tls_lane && tls_lane->number() != 0) delete tls_lane;
        tls_lane = nullptr;
        tls_lane_owner = nullptr;
    }
};
thread_local lane_closer tls_closer;

void adopt_lane(std::unique_ptr<lane> l, session* owner) {
    if (tls_lane && tls_lane->number() != 0) delete tls_lane;
    tls_lane = l.release();
    tls_lane_owner = owner;
    tls_closer.armed = true;  // touching it registers its destructor for this thread
}
}  // namespace

// ---------------------------------------------------------------- lane

outgoing_frame lane::build(const call_request& rq, bool async) {
    fbb_.Clear();
    blob_offsets_.clear();
    for (auto& b : rq.blobs)
        blob_offsets_.push_back(wire::CreateBlob(fbb_, fbb_.CreateVector(reinterpret_cast<const uint8_t*>(b.data()), b.size())));
    auto args = fbb_.CreateVector(rq.args.data(), rq.args.size());
    auto blobs = fbb_.CreateVector(blob_offsets_);
    fbb_.Finish(wire::CreateCall(fbb_, static_cast<uint32_t>(rq.operation), rq.device, args, blobs));
    return make_frame(frame_kind::call, fbb_, ++sequence_, number_, async ? frame_flags::no_reply : 0, rq.payload);
}

int lane::lost(const transport_error& e) {
    session_.mark_lost(std::string(to_string(e.code)) + ": " + e.message);
    return connection_lost_result;
}

int lane::post(const call_request& rq) {
    if (session_.lost()) return connection_lost_result;
    auto f = build(rq, true);
    if (auto r = fs_.send(f); !r) return lost(r.error());
    return 0;
}

int lane::call(const call_request& rq, call_reply& rp) {
    if (session_.lost()) return connection_lost_result;
    auto f = build(rq, false);
    if (auto r = fs_.send(f); !r) return lost(r.error());
    payload_sink sink;
    if (rp.payload_dst) {
        sink = [&](const frame_header& h, const std::vector<std::byte>&) -> std::byte* {
            return h.payload_len == rp.payload_cap ? rp.payload_dst : nullptr;
        };
    }
    // No deadline on the reply itself: a synchronize may legitimately wait for a long kernel. A vanished
    // server still ends the wait (connection reset, or TCP keepalive for a dead host).
    auto in = fs_.receive(never, std::chrono::seconds(60), sink);
    if (!in) return lost(in.error());
    if (in->kind() == frame_kind::error) {
        auto* e = root_of<wire::Error>(*in);
        session_.mark_lost("server refused a call: " + (e->message() ? e->message()->str() : std::string("?")));
        return connection_lost_result;
    }
    if (in->kind() != frame_kind::reply || in->header.sequence != sequence_) {
        session_.mark_lost("reply out of order from the server");
        return connection_lost_result;
    }
    auto* r = root_of<wire::Reply>(*in);
    rp.result = r->result();
    rp.outs.clear();
    if (r->outs()) rp.outs.assign(r->outs()->begin(), r->outs()->end());
    rp.blobs.clear();
    if (r->blobs())
        for (auto* b : *r->blobs()) {
            auto* bytes = b->bytes();
            rp.blobs.emplace_back(bytes ? reinterpret_cast<const std::byte*>(bytes->data()) : nullptr,
                                  bytes ? reinterpret_cast<const std::byte*>(bytes->data()) + bytes->size() : nullptr);
        }
    rp.detail = r->detail() ? r->detail()->str() : std::string();
    if (!rp.payload_dst) rp.payload = std::move(in->payload);
    else if (in->header.payload_len != rp.payload_cap && in->header.payload_len != 0)
        rp.payload = std::move(in->payload);  // the caller checks sizes; nothing was written to its buffer
    if (rp.result != 0 && !rp.detail.empty()) VCUDA_LOG_DEBUG("{}: server says: {}", op_name(rq.operation), rp.detail);
    return rp.result;
}

// ---------------------------------------------------------------- session

void session::mark_lost(const std::string& why) {
    if (!lost_.exchange(true))
        VCUDA_LOG_ERROR("lost the connection to vcuda-server at {} ({}); every CUDA call now fails with "
                        "CUDA_ERROR_DEVICE_UNAVAILABLE", address_, why);
}

std::unique_ptr<lane> session::connect_lane(uint32_t number, std::string& why) {
    auto s = stream::connect(endpoint_, timeout_);
    if (!s) {
        why = "cannot connect to vcuda-server at " + address_ + ": " + s.error().message;
        return nullptr;
    }
    frame_stream fs(std::move(*s));
    flatbuffers::FlatBufferBuilder b(256);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    b.Finish(wire::CreateHello(b, protocol_version, features::all, b.CreateString(token_), id_, secret_, number,
                               static_cast<uint32_t>(getpid()), b.CreateString(host)));
    if (auto r = fs.send(make_frame(frame_kind::hello, b, 0, number), after(timeout_)); !r) {
        why = "sending HELLO to " + address_ + " failed: " + r.error().message;
        return nullptr;
    }
    auto in = fs.receive(after(timeout_), timeout_);
    if (!in) {
        why = "no HELLO reply from " + address_ + ": " + in.error().message;
        return nullptr;
    }
    if (in->kind() == frame_kind::error) {
        auto* e = root_of<wire::Error>(*in);
        why = "vcuda-server at " + address_ + " refused the session: " + (e->message() ? e->message()->str() : "?");
        return nullptr;
    }
    if (in->kind() != frame_kind::hello_reply) {
        why = "unexpected answer to HELLO from " + address_;
        return nullptr;
    }
    auto* hr = root_of<wire::HelloReply>(*in);
    if (number == 0) {
        id_ = hr->session_id();
        secret_ = hr->session_secret();
    }
    return std::make_unique<lane>(*this, std::move(fs), number);
}

std::unique_ptr<session> session::open(const std::string& address, std::chrono::milliseconds timeout,
                                       const std::string& token, std::string& why) {
    auto ep = endpoint::parse(address);
    if (!ep) {
        why = "VCUDA_SERVER='" + address + "': " + ep.error();
        return nullptr;
    }
    auto s = std::unique_ptr<session>(new session());
    s->endpoint_ = *ep;
    s->address_ = address;
    s->token_ = token;
    s->timeout_ = timeout;
    auto first = s->connect_lane(s->next_lane_++, why);
    if (!first) return nullptr;

    call_request rq;
    rq.operation = op::session_info;
    call_reply rp;
    if (int rc = first->call(rq, rp); rc != 0) {
        why = "vcuda-server at " + address + " did not describe its devices (error " + std::to_string(rc) + ")";
        return nullptr;
    }
    size_t n = rp.outs.empty() ? 0 : rp.outs[0];
    if (rp.outs.size() != 1 + n || rp.blobs.size() != 3 * n) {
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
        d.total_memory = rp.outs[1 + i];
        d.server_index = static_cast<int>(i);
        s->devices_.push_back(std::move(d));
    }
    adopt_lane(std::move(first), s.get());
    return s;
}

lane* session::this_thread_lane() {
    if (tls_lane && tls_lane_owner == this) return tls_lane;
    if (lost_) return nullptr;
    std::string why;
    auto l = connect_lane(next_lane_++, why);
    if (!l) {
        mark_lost(why);
        return nullptr;
    }
    adopt_lane(std::move(l), this);
    return tls_lane;
}

}  // namespace vcuda::client
