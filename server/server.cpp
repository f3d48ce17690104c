#include "server/server.hpp"

#include <array>
#include <chrono>

#include "common/log.hpp"
#include "common/wire.hpp"
#include "server/call_context.hpp"
#include "mgmt/token.hpp"
#include "server/dispatch.hpp"

#include <unistd.h>

#include <cstdio>

namespace vcuda::server {

const dispatch_entry* find_op(uint32_t id) {
    static const auto index = [] {
        std::array<const dispatch_entry*, op_id_limit> t{};
        for (size_t i = 0; i < dispatch_table_size; ++i) t[static_cast<uint32_t>(dispatch_table[i].id)] = &dispatch_table[i];
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

void server::accept_loop(listener* l) {
    while (!stopping_) {
        auto s = l->accept();
        if (!s) {
            if (s.error().code == transport_errc::closed) return;
            VCUDA_LOG_WARN("accept on {}: {}", l->local().to_string(), s.error().message);
            continue;
        }
        std::thread([this, st = std::move(*s)]() mutable { run_connection(std::move(st)); }).detach();
    }
}

void server::run_connection(stream s) {
    std::string peer = s.peer_description();
    frame_stream fs(std::move(s));
    auto hello = fs.receive(after(std::chrono::seconds(10)), std::chrono::seconds(10));
    if (!hello) {
        VCUDA_LOG_DEBUG("{}: no valid HELLO ({})", peer, hello.error().message);
        if (hello.error().code == transport_errc::protocol) send_wire_error(fs, wire_errc::verify_failed, hello.error().message);
        return;
    }
    if (hello->kind() != frame_kind::hello) {
        send_wire_error(fs, wire_errc::unexpected_kind, "the first frame must be HELLO");
        return;
    }
    auto* h = root_of<wire::Hello>(*hello);
    if (h->protocol_version() != protocol_version) {
        send_wire_error(fs, wire_errc::bad_version, "this server speaks protocol version " + std::to_string(protocol_version));
        return;
    }
    const bool bulk = h->bulk_set() != 0;
    if (bulk && h->session_id() == 0) {
        send_wire_error(fs, wire_errc::unexpected_kind, "a bulk connection joins a session that is open");
        return;
    }
    std::shared_ptr<session> sess;
    if (h->session_id() == 0) {
        session_grant grant;
        std::string refusal;
        if (!authorize(*h, grant, refusal)) {
            VCUDA_LOG_WARN("{}: session refused: {}", peer, refusal);
            send_wire_error(fs, wire_errc::auth_failed, refusal);
            return;
        }
        sess = sessions_.create(drv_, opts_, grant, peer + " pid " + std::to_string(h->client_pid()));
        sess->handles.set_tag(h->handle_tag());
        VCUDA_LOG_INFO("session {} opened by {} (host {})", sess->id(), sess->peer(), h->client_host() ? h->client_host()->str() : "?");
    } else {
        sess = sessions_.find(h->session_id(), h->session_secret());
        if (!sess) {
            send_wire_error(fs, wire_errc::auth_failed, "unknown session or wrong session secret");
            return;
        }
    }
    ++sess->lanes;
    if (!bulk) ++sess->call_lanes;
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
        if (r) rings = std::move(*r);
        else VCUDA_LOG_WARN("{}: no shared-memory rings ({}); frames go through the socket", peer, r.error());
    }
    flatbuffers::FlatBufferBuilder b(128);
    const uint64_t feats = features::all | (rings ? features::shm_rings : 0) | (opts_.bulk_streams ? features::bulk : 0);
    b.Finish(wire::CreateHelloReply(b, protocol_version, feats, sess->id(), sess->secret(), b.CreateString("vcuda-server"),
                                    opts_.memory_quota, opts_.bulk_streams));
    bool greeted = (!bulk || bulk_conn) &&
                   fs.send(make_frame(frame_kind::hello_reply, b), after(std::chrono::seconds(10)), rings_fd).has_value();
    if (rings_fd >= 0) close(rings_fd);
    if (greeted && rings) fs.raw().attach_rings(std::move(rings), opts_.spin);
    else fs.raw().set_spin(opts_.spin);
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
    if (--sess->lanes == 0) {
        auto t0 = std::chrono::steady_clock::now();
        uint64_t held = 0;
        size_t handles;
        {
            std::lock_guard lock(sess->mu);
            for (size_t d = 0; d < sess->device_count(); ++d) held += sess->memory(d).mapped();
            handles = sess->handles.size();
        }
        sessions_.remove(sess->id());
        sess->release_all();
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        VCUDA_LOG_INFO("session {} ended ({}): released {} MiB of GPU memory and {} handles in {} ms", sess->id(), sess->peer(),
                       held >> 20, handles, ms);
    }
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
    if (opts_.secret.empty()) return true;  // not attached to a manager: the server's own defaults apply
    std::string token = h.token() ? h.token()->str() : "";
    if (token.empty()) {
        refusal = "this server is attached to a manager: a lease token is required (run the program with vcuda run --manager ADDR)";
        return false;
    }
    auto claims = mgmt::verify_token(opts_.secret, token, std::chrono::system_clock::now());
    if (!claims) {
        refusal = "lease token rejected: " + claims.error();
        return false;
    }
    for (size_t i = 0; i < drv_.gpus().size(); ++i) {
        if (gpu_uuid_string(drv_.gpus()[i].uuid) == claims->gpu_uuid) {
            grant.gpus = {i};
            grant.memory_quota = claims->memory_quota;
            grant.lease_id = claims->lease_id;
            return true;
        }
    }
    refusal = "lease token is for GPU " + claims->gpu_uuid + ", which this server does not have";
    return false;
}

std::string gpu_uuid_string(const CUuuid& u) {
    const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
    char s[64];
    std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                  b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return s;
}

void server::run_lane(std::shared_ptr<session> sess, frame_stream& fs, uint32_t lane_number) {
    auto& d = sess->api();
    staging_pool pool(d);
    lane_state lane;
    lane.stream = &fs;
    lane.staging = &pool;
    staging_pool::buffer* staged = nullptr;
    // Host-to-device payloads land straight in a pinned staging buffer when they fit one.
    payload_sink sink = [&](const frame_header& h, const std::vector<std::byte>& meta) -> std::byte* {
        staged = nullptr;
        if (h.kind != static_cast<uint16_t>(frame_kind::call) || h.payload_len > staging_pool::buffer_size) return nullptr;
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
                VCUDA_LOG_WARN("session {} lane {}: bad frame ({}); closing the lane", sess->id(), lane_number, r.error().message);
                send_wire_error(fs, wire_errc::verify_failed, r.error().message);
            }
            return;
        }
        if (f.kind() == frame_kind::goodbye) return;
        if (f.kind() != frame_kind::call) {
            send_wire_error(fs, wire_errc::unexpected_kind, "expected a CALL frame");
            return;
        }
        auto* call = root_of<wire::Call>(f);
        if (call->after_seq() != 0 && call->after_lane() != lane_number &&
            !sess->wait_for_lane(call->after_lane(), call->after_seq()))
            VCUDA_LOG_DEBUG("session {} lane {}: lane {} ended before its call {}; going on", sess->id(), lane_number,
                            call->after_lane(), call->after_seq());
        // A call that blocks until the GPU is done counts as run once it starts, so that other threads' calls
        // that come after it in time do not wait for the GPU too (they would not with the real driver).
        const bool blocks = call->op() == static_cast<uint32_t>(op::ctx_synchronize) ||
                            call->op() == static_cast<uint32_t>(op::cuStreamSynchronize) ||
                            call->op() == static_cast<uint32_t>(op::cuEventSynchronize);
        if (blocks) sess->lane_progress(lane_number, f.header.sequence);
        call_context cx(*sess, lane, *call, f, staged);
        staged = nullptr;
        CUresult rc;
        const dispatch_entry* entry = find_op(call->op());
        if (!entry) {
            rc = cx.fail(CUDA_ERROR_NOT_SUPPORTED, "op " + std::to_string(call->op()) + " is not allowed by this server");
            VCUDA_LOG_WARN("session {}: refused op {}", sess->id(), call->op());
        } else {
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
            if (rc == CUDA_SUCCESS) rc = entry->handler(cx);
            
            VCUDA_LOG_TRACE("session {} lane {}: {} -> {}", sess->id(), lane_number, entry->name, static_cast<int>(rc));
        }
        if (!blocks) sess->lane_progress(lane_number, f.header.sequence);
        if (cx.staged() && cx.staged()->busy) pool.give_back(cx.staged(), nullptr);  // the handler did not use it
        if (cx.queued()) {
            if (rc != CUDA_SUCCESS && lane.pending_error == CUDA_SUCCESS) {
                lane.pending_error = rc;
                lane.pending_detail = std::string(entry ? entry->name : "op") + ": " + cx.detail;
                VCUDA_LOG_DEBUG("session {}: queued {} failed with {} ({})", sess->id(), entry ? entry->name : "op",
                                static_cast<int>(rc), cx.detail);
            }
            continue;
        }
        if (cx.replied) continue;
        // An earlier queued call failed: this call answers that failure. It still ran (frees, destroys and host
        // function completions must; what a successful creation made stays the session's until it ends).
        if (rc == CUDA_SUCCESS && lane.pending_error != CUDA_SUCCESS) {
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

}  // namespace vcuda::server
